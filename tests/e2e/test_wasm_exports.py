"""The shipped .wasm exports only the proxy-wasm callbacks the filter implements (scripts/wasm-opt.sh
trims the Rust SDK's full set with wasm-metadce): Envoy calls every exported callback, so an export
the filter does not use costs a VM entry per request or body chunk for nothing. The other side of the
trim: a callback src/wasm implements whose export was trimmed would silently never run, so every
`fn on_*` of the SDK's traits in src/wasm must map to a kept export. The control is cargo's own output,
which exports the whole set."""

from __future__ import annotations

import re

from kpp.testing import harness
from kpp.wasmfile import exports

ROOT = harness.ROOT
RAW = ROOT / "target" / "wasm32-wasip1" / "release" / "kube_peer_proxy.wasm"
# The ABI's own exports, needed whatever the filter implements.
ABI = {"memory", "_initialize", "proxy_abi_version_0_2_1", "proxy_on_memory_allocate", "proxy_on_vm_start",
       "proxy_on_configure", "proxy_on_context_create", "proxy_on_delete"}
# proxy_wasm::traits methods -> the export Envoy calls them through (proxy-wasm 0.2.5 dispatcher.rs).
TRAIT_EXPORTS = {
    "on_vm_start": "proxy_on_vm_start", "on_configure": "proxy_on_configure", "on_tick": "proxy_on_tick",
    "on_queue_ready": "proxy_on_queue_ready", "on_done": "proxy_on_done", "on_log": "proxy_on_log",
    "on_http_call_response": "proxy_on_http_call_response", "on_foreign_function": "proxy_on_foreign_function",
    "on_grpc_call_response": "proxy_on_grpc_receive", "on_grpc_stream_message": "proxy_on_grpc_receive",
    "on_grpc_call_response_headers": "proxy_on_grpc_receive_initial_metadata",
    "on_grpc_stream_initial_metadata": "proxy_on_grpc_receive_initial_metadata",
    "on_grpc_stream_trailing_metadata": "proxy_on_grpc_receive_trailing_metadata",
    "on_grpc_stream_close": "proxy_on_grpc_close",
    "on_http_request_headers": "proxy_on_request_headers", "on_http_request_body": "proxy_on_request_body",
    "on_http_request_trailers": "proxy_on_request_trailers",
    "on_http_response_headers": "proxy_on_response_headers", "on_http_response_body": "proxy_on_response_body",
    "on_http_response_trailers": "proxy_on_response_trailers",
    "on_new_connection": "proxy_on_new_connection", "on_downstream_data": "proxy_on_downstream_data",
    "on_downstream_close": "proxy_on_downstream_connection_close", "on_upstream_data": "proxy_on_upstream_data",
    "on_upstream_close": "proxy_on_upstream_connection_close",
}


def implemented() -> set[str]:
    """Exports the SDK trait methods src/wasm implements are called through."""
    names = set()
    for f in (ROOT / "src" / "wasm").glob("*.rs"):
        names |= set(re.findall(r"\bfn (on_\w+)\s*\(", f.read_text()))
    return {TRAIT_EXPORTS[n] for n in names if n in TRAIT_EXPORTS}


def test_shipped_wasm_exports_the_abi_and_the_implemented_callbacks_only():
    shipped = set(exports(harness.wasm_path()))
    want = ABI | implemented()
    assert "proxy_on_request_headers" in want and "proxy_on_response_body" in want  # the scan found them
    assert shipped == want, f"missing {sorted(want - shipped)}, extra {sorted(shipped - want)}"
    assert exports(harness.wasm_path())["memory"] == "memory"


def test_control_cargo_output_exports_every_callback():
    raw = set(exports(RAW))
    assert {"proxy_on_log", "proxy_on_done", "proxy_on_request_body", "proxy_on_response_trailers"} <= raw
    assert raw - set(exports(harness.wasm_path())), "the trim removed nothing"
