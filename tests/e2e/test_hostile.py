"""Hostile input through real Envoy: odd requests and hostile discovery documents. Envoy keeps
serving, the wasm VM never fails, memory stays bounded, and a bad peer keeps its last good data.

Limits in force (kpp.render and envoy/README.md): Envoy's `max_request_headers_kb` 60 (its
default, set explicitly), the plugin's `max_discovery_bytes` (16 MiB default), serde_json's nesting
limit of 128 for discovery documents."""

from __future__ import annotations

import http.server
import json
import os
import socket
import threading

import pytest

from kpp import render
from kpp.testing import harness
from kpp.testing.topology import NEW_ONLY, Topology, V2, request



class HostilePeer:
    """A discovery-only 'apiserver' whose /apis answer the test chooses."""

    def __init__(self):
        self.apis = json.dumps({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                                "metadata": {}, "items": []}).encode()
        peer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/apis":
                    body, ctype, code = peer.apis, V2, 200
                elif self.path == "/api":
                    body, ctype, code = b"404 page not found\n", "text/plain", 404
                else:
                    body, ctype, code = b'{"kind":"Status","code":200}', "application/json", 200
                self.send_response(code)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.send_header("x-fake-apiserver", "hostile")
                self.end_headers()
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def setup(envoys):
    topo = Topology(envoys)
    hostile = HostilePeer()
    port, admin = harness.free_port(), harness.free_port()
    yaml = render.render_bootstrap(
        node="a", listen_port=port, admin_port=admin, local=("127.0.0.1", topo.a.port),
        peers=[("b", "127.0.0.1", topo.b.port), ("h", "127.0.0.1", hostile.port)],
        wasm_path=str(harness.wasm_path()),
        plugin={"refresh_interval": "500ms", "fetch_timeout": "5s", "staleness_limit": "60s"})
    topo.port = port
    topo.envoy = envoys.start(yaml, "a", admin)
    # The first snapshot: every member's API set is known from then on (the hostile peer's too), so a
    # resource nobody serves is the local server's genuine 404 rather than a guarded 503.
    topo.envoy.wait_snapshot(20)
    yield topo, hostile
    hostile.close()
    topo.close()


def envoy_rss_kb(topo) -> int:
    """RSS of the Envoy process: func-e's child (any of its threads may have forked it), or the
    launched process itself when run directly."""
    root = topo.envoy.process.pid
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            status = open(f"/proc/{entry}/status").read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if comm.startswith("envoy") and root in (int(entry), ppid):
            return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
    raise AssertionError("envoy process not found")


def assert_healthy(topo):
    """Envoy serves, the filter still routes, and no wasm VM failed or reloaded."""
    r = topo.get(NEW_ONLY)
    assert r.status == 200 and r.headers.get("x-fake-apiserver") == "b", r
    stats = topo.envoy.stats()
    failures = {k: v for k, v in stats.items() if ("vm_reload" in k or "vm_failed" in k) and v}
    assert not failures, failures
    assert "panicked" not in topo.envoy.log_text()


def raw_request(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks):
                break
        return b"".join(chunks)


def test_odd_requests_do_not_hurt(setup):
    topo, _ = setup
    # A header over Envoy's 60 KiB limit: rejected by Envoy (431) before any filter runs.
    r = raw_request(topo.port, b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
    assert r.startswith(b"HTTP/1.1 431"), r[:100]
    # A 10 000-segment path: parsed, not served anywhere, the local server's genuine 404.
    r = topo.get("/apis/g.example.com/v1/" + "/".join(["x"] * 10_000))
    assert r.status == 404 and r.headers.get("x-fake-apiserver") == "a", r
    # Invalid UTF-8 and control bytes in the path: Envoy rejects them (400, no upstream) or the filter
    # leaves them to the local server; never a crash, never a peer.
    for path in (b"/apis/\xff\xfe/v1/x", b"/api/v1/namespaces/\xc3(/pods", b"/apis/%ff%00/v1/pods"):
        r = raw_request(topo.port, b"GET " + path + b" HTTP/1.1\r\nHost: x\r\n\r\n")
        assert r.startswith(b"HTTP/1.1 "), r[:100]
        assert not r.startswith(b"HTTP/1.1 5"), r[:200]
        assert r.startswith(b"HTTP/1.1 400") or b"x-fake-apiserver: a" in r.lower(), (path, r[:300])
        assert b"x-fake-apiserver: b" not in r.lower() and b"x-fake-apiserver: c" not in r.lower(), r[:300]
    # Non-UTF-8 header values the filter reads (Accept, peer-proxied): the local server answers.
    r = raw_request(topo.port, b"GET /apis HTTP/1.1\r\nHost: x\r\nAccept: \xff\xfe\r\n"
                               b"x-kubernetes-peer-proxied: \xff\r\n\r\n")
    assert r.startswith(b"HTTP/1.1 "), r[:100]
    assert r.startswith(b"HTTP/1.1 400") or b"x-fake-apiserver: a" in r.lower(), r[:300]
    assert_healthy(topo)


def _generation(topo) -> int:
    return topo.envoy.stats().get("wasmcustom.kube_peer_proxy_snapshot_generation", 0)


def _sync_errors(topo, kind: str) -> int:
    return topo.counter(f"kube_peer_proxy_discovery_sync_errors_total;type={kind};server=h")


HOSTILE_DOCUMENTS = {
    "deeply nested JSON": (lambda: b"[" * 200_000 + b"]" * 200_000, "decode"),
    # Over the plugin's max_discovery_bytes (16 MiB): not even read.
    "20 MB document": (lambda: b'{"kind":"APIGroupDiscoveryList","items":[]' + b" " * (20 << 20) + b"}",
                       "oversized"),
    # Over what Envoy's HTTP-call client buffers (observed between 30 and 50 MiB in Envoy 1.40): the
    # call ends without a response, counted as a reset.
    "50 MB document": (lambda: b'{"kind":"APIGroupDiscoveryList","items":[]' + b" " * (50 << 20) + b"}",
                       "reset"),
    "not JSON at all": (lambda: b"\x00\xff garbage", "decode"),
    "wrong kind": (lambda: b'{"kind":"Status","apiVersion":"v1"}', "decode"),
}


@pytest.mark.parametrize("name", list(HOSTILE_DOCUMENTS))
def test_hostile_discovery_documents_keep_the_last_good_data(setup, name):
    topo, hostile = setup
    make_body, kind = HOSTILE_DOCUMENTS[name]
    hostile.apis = json.dumps({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                               "metadata": {}, "items": [{"metadata": {"name": "hostile.example.com"}, "versions": [
                                   {"version": "v1", "freshness": "Current", "resources": [
                                       {"resource": "widgets", "scope": "Namespaced", "singularResource": "widget",
                                        "verbs": ["get", "list"]}]}]}]}).encode()
    harness.wait_until(lambda: topo.get("/apis/hostile.example.com/v1/widgets").headers.get("x-fake-apiserver")
                       == "hostile", 10, message="hostile peer's good data never became routable")
    before = _sync_errors(topo, kind)
    hostile.apis = make_body()
    harness.wait_until(lambda: _sync_errors(topo, kind) > before, 20, message=f"{name}: no {kind} error counted")
    # The last good data still routes.
    r = topo.get("/apis/hostile.example.com/v1/widgets")
    assert r.headers.get("x-fake-apiserver") == "hostile", r
    assert_healthy(topo)


def test_twenty_thousand_resources_route_with_bounded_memory(setup):
    topo, hostile = setup
    rss_before = envoy_rss_kb(topo)
    resources = [{"resource": f"widgets{i}", "scope": "Namespaced", "singularResource": f"widget{i}",
                  "verbs": ["get", "list", "create"], "subresources": [{"subresource": "status", "verbs": ["get"]}]}
                 for i in range(20_000)]
    hostile.apis = json.dumps({"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2",
                               "metadata": {}, "items": [{"metadata": {"name": "big.example.com"}, "versions": [
                                   {"version": "v1", "freshness": "Current", "resources": resources}]}]}).encode()
    harness.wait_until(lambda: topo.get("/apis/big.example.com/v1/namespaces/x/widgets19999").headers.get(
        "x-fake-apiserver") == "hostile", 20, message="the big document never became routable")
    r = topo.get("/apis", accept=V2)
    assert r.status == 200
    big = next(g for g in r.json()["items"] if g["metadata"]["name"] == "big.example.com")
    assert len(big["versions"][0]["resources"]) == 20_000
    for _ in range(200):
        assert topo.get("/apis/big.example.com/v1/namespaces/x/widgets123/status").status == 200
    rss_after = envoy_rss_kb(topo)
    # The table, three documents and per-worker caches: tens of MB, not hundreds.
    assert rss_after - rss_before < 300_000, (rss_before, rss_after)
    print(f"envoy RSS before {rss_before} kB, after 20 000 resources {rss_after} kB")
    assert_healthy(topo)
