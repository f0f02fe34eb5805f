#!/usr/bin/env python3
"""Wasm instructions and host calls per request, counted: the shipped .wasm and the wasm floor run
under wasmtime with a proxy-wasm host written here, so the local path's cost is a count, not a time.

    .venv/bin/python bench/req_probe.py [--out target/bench/req.md] [--wasm X.wasm] [--floor Y.wasm]

Envoy's CPU per request moves by ±15 µs between runs on a shared 2-core machine; the instructions a
request executes in the VM do not move at all. This probe loads the real modules (the filter's
`target/kube_peer_proxy.wasm` and bench/noop's floor) into wasmtime with fuel metering on (one unit
per wasm instruction executed), implements the proxy-wasm ABI 0.2.1 host functions the modules
import, and drives them as Envoy does:

* the discovery service (root id `kube-peer-proxy-discovery`) runs its first round against three
  "apiservers" answered here with the same discovery fixtures as bench/envoy_bench.py (old 1.33,
  new 1.37-dev ×2; `/api` 404), and publishes its snapshot into this host's shared data;
* a worker VM (a second instance of the same module, sharing that data, as Envoy's workers do) gets
  the filter's configuration and then requests: context create, request headers, response headers,
  one response body chunk, log, done, delete, exactly the calls Envoy makes when the module exports
  them (a module without `proxy_on_log` gets no log call, as in proxy-wasm-cpp-host).

For each scenario it reports the wasm instructions per request in steady state (the median of
requests 50-100 on a warm VM, the first requests build caches) split by VM entry, the first
request's (the worker's entry cache empty), and the host calls the request made, by name. The
`large` rows run the same requests against bench/envoy_bench.py's large table (its (e1), (e2)). The plugin configurations come from kpp.render, as in the
benchmarks: the plain profile (bench/envoy_bench.py) and the kubeadm profile (make hop).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import struct
import sys
from collections import Counter
from pathlib import Path

import wasmtime

from kpp import render

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "k8s-discovery"
OLD_FIXTURE = FIXTURES / "aggregated_v2.k8s-1.33.json"
NEW_FIXTURE = FIXTURES / "aggregated_v2.k8s-1.37-dev-fork.json"
FILTER_WASM = ROOT / "target" / "kube_peer_proxy.wasm"
PHASES_DIR = ROOT / "target" / "req-probe"
PHASES_WASM = PHASES_DIR / "kube_peer_proxy_phases.wasm"
# src/wasm/host.rs `Phase`: the mark after each step of `on_http_request_headers`.
PHASES = {2: "admit (client headers stripped, identity)", 3: "headers read", 4: "table (generation)",
          5: "route (parse, keys, lookup)", 6: "act"}
FLOOR_WASM = ROOT / "target" / "bench-noop" / "kpp_bench_noop.wasm"
# bench/envoy_bench.py's large table: its synthetic CRD set (core_bench synth), built by `make bench`'s core step
CORE_BENCH = ROOT / "target" / "release" / "examples" / "core_bench"
BIG = (400, 2, 25)  # groups, versions per group, resources per version -> 20 000 resources per server
V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
LOCAL_PATH = "/apis/apps/v1/namespaces/default/deployments/web"
LIST_PATH = "/api/v1/namespaces/kube-system/pods?labelSelector=app%3Dweb&limit=500"
PEER_PATH = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/claim-1"
# client-go's request headers for a GET (kubectl get, bearer token), in the order Envoy holds them.
CLIENT_GO = [("accept", "application/json"), ("user-agent", "kubectl/v1.36.3 (linux/amd64) kubernetes/abcdef0"),
             ("authorization", "Bearer " + "x" * 40), ("accept-encoding", "gzip")]

# proxy-wasm ABI 0.2.1 enums
REQ, RESP, CALL_RESP = 0, 2, 6
BUF_RESP_BODY, BUF_CALL_BODY, BUF_VM_CONF, BUF_PLUGIN_CONF = 1, 4, 6, 7
OK, NOT_FOUND, BAD_ARGUMENT = 0, 1, 2
FLOOR_ROOT_ID = "kube-peer-proxy"


class Host:
    """The host side of the proxy-wasm ABI for one module instance (one VM); shared data is
    shared between the hosts given the same dict, as Envoy shares it between VMs of one vm_id."""

    def __init__(self, wasm: Path, shared: dict, upstreams: dict | None = None):
        cfg = wasmtime.Config()
        cfg.consume_fuel = True
        self.engine = wasmtime.Engine(cfg)
        self.store = wasmtime.Store(self.engine)
        self.store.set_fuel(10**15)
        self.shared = shared
        self.upstreams = upstreams or {}
        self.calls: Counter = Counter()
        self.maps: dict[int, list[tuple[str, str]]] = {REQ: [], RESP: [], CALL_RESP: []}
        self.buffers: dict[int, bytes] = {}
        self.properties: dict[str, bytes] = {}
        self.pending: list[tuple[int, int, list, bytes]] = []  # (root context, token, headers, body)
        self.next_token = 1
        self.now_ns = 1_800_000_000 * 10**9
        self.local_reply: tuple[int, bytes] | None = None
        self.metrics: list[str] = []
        self.logs: list[str] = []
        self.marks: list[tuple[int, int]] = []
        module = wasmtime.Module.from_file(self.engine, str(wasm))
        linker = wasmtime.Linker(self.engine)
        wasi = wasmtime.WasiConfig()
        self.store.set_wasi(wasi)
        linker.define_wasi()
        for imp in module.imports:
            if imp.module != "env":
                continue
            fn = getattr(self, imp.name, None)
            if fn is None:
                linker.define_func("env", imp.name, imp.type, self._unsupported(imp.name), access_caller=True)
            else:
                linker.define_func("env", imp.name, imp.type, self._counted(imp.name, fn), access_caller=True)
        self.instance = linker.instantiate(self.store, module)
        self.ex = self.instance.exports(self.store)
        self.memory = self.ex["memory"]
        if "_initialize" in self.ex:
            self.ex["_initialize"](self.store)

    # -- plumbing --------------------------------------------------------------------------

    def _counted(self, name, fn):
        def call(caller, *args):
            self.calls[name] += 1
            # wasm32 pointers and sizes arrive as signed i32; the ABI means them unsigned
            return fn(caller, *(a & 0xFFFFFFFF if isinstance(a, int) and -2**31 <= a < 0 else a for a in args))
        return call

    @staticmethod
    def _unsupported(name):
        def call(caller, *args):
            raise RuntimeError(f"req_probe: host function {name} is not implemented")
        return call

    def read(self, caller, ptr: int, size: int) -> bytes:
        return bytes(self.memory.read(caller, ptr, ptr + size)) if size else b""

    def put_u32(self, caller, ptr: int, v: int) -> None:
        self.memory.write(caller, struct.pack("<I", v), ptr)

    def give(self, caller, data: bytes, data_ptr: int, size_ptr: int) -> int:
        """Copies `data` into the VM through its allocator, as proxy-wasm-cpp-host does."""
        if data:
            ptr = caller["proxy_on_memory_allocate"](caller, len(data))
            self.memory.write(caller, data, ptr)
        else:
            ptr = 0
        self.put_u32(caller, data_ptr, ptr)
        self.put_u32(caller, size_ptr, len(data))
        return OK

    def fuel(self) -> int:
        return 10**15 - self.store.get_fuel()

    def call(self, name: str, *args):
        """Calls an export if the module has it, as the host does (absent: no VM entry)."""
        if name not in self.ex:
            return None
        return self.ex[name](self.store, *args)

    # -- the ABI's imports -------------------------------------------------------------------

    def kpp_phase_mark(self, caller, phase):
        self.marks.append((phase, self.fuel()))

    def proxy_log(self, caller, level, ptr, size):
        self.logs.append(self.read(caller, ptr, size).decode(errors="replace"))
        return OK

    def proxy_set_tick_period_milliseconds(self, caller, ms):
        return OK

    def proxy_get_current_time_nanoseconds(self, caller, ptr):
        self.memory.write(caller, struct.pack("<Q", self.now_ns), ptr)
        return OK

    def proxy_get_buffer_bytes(self, caller, kind, start, max_size, data_ptr, size_ptr):
        buf = self.buffers.get(kind)
        if buf is None:
            return NOT_FOUND
        return self.give(caller, buf[start:start + max_size], data_ptr, size_ptr)

    def proxy_set_buffer_bytes(self, caller, kind, start, size, ptr, n):
        data = self.read(caller, ptr, n)
        buf = self.buffers.get(kind, b"")
        self.buffers[kind] = buf[:start] + data + buf[start + size:]
        return OK

    def proxy_get_property(self, caller, ptr, size, data_ptr, size_ptr):
        path = ".".join(p.decode() for p in self.read(caller, ptr, size).split(b"\0") if p)
        value = self.properties.get(path)
        if value is None:
            return NOT_FOUND
        return self.give(caller, value, data_ptr, size_ptr)

    def proxy_get_header_map_value(self, caller, kind, kptr, ksize, data_ptr, size_ptr):
        key = self.read(caller, kptr, ksize).decode().lower()
        for k, v in self.maps.get(kind, []):
            if k == key:
                return self.give(caller, v.encode(), data_ptr, size_ptr)
        return NOT_FOUND

    def proxy_get_header_map_pairs(self, caller, kind, data_ptr, size_ptr):
        pairs = self.maps.get(kind, [])
        out = struct.pack("<I", len(pairs))
        for k, v in pairs:
            out += struct.pack("<II", len(k.encode()), len(v.encode()))
        for k, v in pairs:
            out += k.encode() + b"\0" + v.encode() + b"\0"
        return self.give(caller, out, data_ptr, size_ptr)

    def proxy_replace_header_map_value(self, caller, kind, kptr, ksize, vptr, vsize):
        key = self.read(caller, kptr, ksize).decode().lower()
        value = self.read(caller, vptr, vsize).decode()
        rest = [(k, v) for k, v in self.maps.get(kind, []) if k != key]
        self.maps[kind] = rest + [(key, value)]
        return OK

    def proxy_add_header_map_value(self, caller, kind, kptr, ksize, vptr, vsize):
        key = self.read(caller, kptr, ksize).decode().lower()
        self.maps.setdefault(kind, []).append((key, self.read(caller, vptr, vsize).decode()))
        return OK

    def proxy_remove_header_map_value(self, caller, kind, kptr, ksize):
        key = self.read(caller, kptr, ksize).decode().lower()
        self.maps[kind] = [(k, v) for k, v in self.maps.get(kind, []) if k != key]
        return OK

    def proxy_get_shared_data(self, caller, kptr, ksize, data_ptr, size_ptr, cas_ptr):
        key = self.read(caller, kptr, ksize).decode()
        if key not in self.shared:
            return NOT_FOUND
        value, cas = self.shared[key]
        self.give(caller, value, data_ptr, size_ptr)
        self.put_u32(caller, cas_ptr, cas)
        return OK

    def proxy_set_shared_data(self, caller, kptr, ksize, vptr, vsize, cas):
        key = self.read(caller, kptr, ksize).decode()
        old = self.shared.get(key, (b"", 0))[1]
        self.shared[key] = (self.read(caller, vptr, vsize), old + 1)
        return OK

    def proxy_define_metric(self, caller, kind, ptr, size, id_ptr):
        self.metrics.append(self.read(caller, ptr, size).decode())
        self.put_u32(caller, id_ptr, len(self.metrics))
        return OK

    def proxy_increment_metric(self, caller, mid, offset):
        return OK

    def proxy_record_metric(self, caller, mid, value):
        return OK

    def proxy_send_local_response(self, caller, status, dptr, dsize, bptr, bsize, hptr, hsize, grpc):
        self.local_reply = (status, self.read(caller, bptr, bsize))
        return OK

    def proxy_http_call(self, caller, uptr, usize, hptr, hsize, bptr, bsize, tptr, tsize, timeout, token_ptr):
        cluster = self.read(caller, uptr, usize).decode()
        raw = self.read(caller, hptr, hsize)
        n = struct.unpack_from("<I", raw, 0)[0]
        sizes = [struct.unpack_from("<II", raw, 4 + 8 * i) for i in range(n)]
        at, headers = 4 + 8 * n, {}
        for ks, vs in sizes:
            k = raw[at:at + ks].decode(); at += ks + 1
            v = raw[at:at + vs].decode(); at += vs + 1
            headers[k] = v
        token = self.next_token
        self.next_token += 1
        status, body = self.upstreams[cluster](headers[":path"], headers)
        self.pending.append((token, [(":status", str(status)), ("content-type", V2)], body))
        self.put_u32(caller, token_ptr, token)
        return OK

    def proxy_get_status(self, caller, code_ptr, msg_ptr, msg_size_ptr):
        return NOT_FOUND

    def proxy_done(self, caller):
        return OK

    def proxy_continue_stream(self, caller, kind):
        return OK

    def proxy_close_stream(self, caller, kind):
        return OK

    def proxy_set_effective_context(self, caller, ctx):
        return OK


def upstream(apis: bytes):
    def answer(path: str, headers: dict) -> tuple[int, bytes]:
        if path.split("?")[0] == "/apis":
            return 200, apis
        return 404, b'{"kind":"Status","code":404}'
    return answer


def plugin_configs(profile: str) -> tuple[str, str]:
    """(service configuration, filter configuration) as kpp.render writes them."""
    b = json.loads(render.render_bootstrap(
        node="a", listen_port=1, admin_port=2, local=("127.0.0.1", 3),
        peers=[("b", "127.0.0.1", 4), ("c", "127.0.0.1", 5)], wasm_path="x.wasm",
        plugin={"refresh_interval": "30m", "staleness_limit": "60m"}))
    svc = b["bootstrap_extensions"][0]["typed_config"]["config"]["configuration"]["value"]
    hcm = b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    wasm = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.wasm")
    flt = wasm["typed_config"]["config"]["configuration"]["value"]
    if profile == "kubeadm":
        cfg = json.loads(flt)
        cfg["client_identity"] = render.KUBEADM_REQUESTHEADER
        flt = json.dumps(cfg)
    return svc, flt


class World:
    """One module's discovery service and one worker VM, with the service's snapshot published."""

    def __init__(self, wasm: Path, profile: str, floor: bool, large: bool = False):
        self.shared: dict = {}
        svc_cfg, flt_cfg = plugin_configs(profile)
        self.floor = floor
        if not floor:
            ups = {}
            old, new = (synth(OLD_FIXTURE), synth(NEW_FIXTURE)) if large else (OLD_FIXTURE.read_bytes(),
                                                                             NEW_FIXTURE.read_bytes())
            for name, doc in (("local", old), ("peer-b", new), ("peer-c", new)):
                ups[name] = upstream(doc)
            svc = Host(wasm, self.shared, ups)
            self.start_root(svc, 1, "kube-peer-proxy-discovery", svc_cfg)
            for _ in range(4):
                svc.call("proxy_on_tick", 1)
                while svc.pending:
                    token, headers, body = svc.pending.pop(0)
                    svc.maps[CALL_RESP] = headers
                    svc.buffers[BUF_CALL_BODY] = body
                    svc.call("proxy_on_http_call_response", 1, token, len(headers), len(body), 0)
            if not any(k.endswith("/generation") for k in self.shared):
                raise SystemExit("req_probe: the discovery service published no snapshot:\n"
                                 + "\n".join(svc.logs[-20:]))
        self.worker = Host(wasm, self.shared)
        self.start_root(self.worker, 1, FLOOR_ROOT_ID, "path" if floor else flt_cfg)
        self.worker.call("proxy_on_tick", 1)
        self.next_id = 2

    @staticmethod
    def start_root(h: Host, root: int, root_id: str, cfg: str) -> None:
        h.properties["plugin_root_id"] = root_id.encode()
        h.buffers[BUF_VM_CONF] = b""
        h.buffers[BUF_PLUGIN_CONF] = cfg.encode()
        h.call("proxy_on_context_create", root, 0)
        h.call("proxy_on_vm_start", root, 0)
        if not h.call("proxy_on_configure", root, len(cfg)):
            raise SystemExit(f"req_probe: on_configure refused: {h.logs[-3:]}")

    def request(self, method: str, path: str, extra=(), status=200, body=b'{"kind":"X"}',
                subject: bytes | None = None) -> tuple[dict, Counter]:
        """One request through the worker VM: wasm instructions per VM entry, and the host calls."""
        h = self.worker
        h.calls.clear()
        h.local_reply = None
        h.maps[REQ] = [(":authority", "apiserver"), (":path", path), (":method", method),
                       (":scheme", "https"), *CLIENT_GO, ("x-forwarded-proto", "https"),
                       ("x-request-id", "2f1d2c4e-8f4a-4a53-9e56-3f1c0c8d7a10"), *extra]
        h.properties.pop("connection.subject_peer_certificate", None)
        if subject is not None:
            h.properties["connection.subject_peer_certificate"] = subject
        ctx = self.next_id
        self.next_id += 1
        fuel: dict = {}

        def entry(name, *args):
            f0 = h.fuel()
            r = h.call(name, *args)
            if name in h.ex:
                fuel[name] = fuel.get(name, 0) + h.fuel() - f0
            return r

        entry("proxy_on_context_create", ctx, 1)
        action = entry("proxy_on_request_headers", ctx, len(h.maps[REQ]), 1)
        if h.local_reply is None and action == 0:
            h.maps[RESP] = [(":status", str(status)), ("content-type", "application/json"),
                            ("audit-id", "b6a1"), ("cache-control", "no-cache, private"),
                            ("content-length", str(len(body)))]
            h.buffers[BUF_RESP_BODY] = body
            entry("proxy_on_response_headers", ctx, len(h.maps[RESP]), 0)
            entry("proxy_on_response_body", ctx, len(body), 1)
        entry("proxy_on_log", ctx)
        entry("proxy_on_done", ctx)
        entry("proxy_on_delete", ctx)
        return fuel, Counter(h.calls)


def synth(base: Path) -> bytes:
    """The large table's discovery document for `base`, as bench/envoy_bench.py builds it."""
    if not CORE_BENCH.exists():
        subprocess.run(["cargo", "build", "-q", "--release", "--example", "core_bench"], cwd=ROOT, check=True)
    return subprocess.run([str(CORE_BENCH), "synth", str(base), *map(str, BIG)], capture_output=True,
                          check=True).stdout


SCENARIOS = [
    # key, title, method, path, extra headers
    ("get", "GET of a locally served resource", "GET", LOCAL_PATH, ()),
    ("list", "LIST of a locally served resource (query)", "GET", LIST_PATH, ()),
    ("peer", "GET of a new-only resource (rerouted)", "GET", PEER_PATH, ()),
    ("apis", "merged `GET /apis` (aggregated v2 Accept)", "GET", "/apis", (("accept", V2),)),
]


def build_before(ref: str) -> Path:
    """bench/envoy_bench.py's build of `ref` (a git worktree under target/bench-before, reused)."""
    spec = importlib.util.spec_from_file_location("envoy_bench", ROOT / "bench" / "envoy_bench.py")
    eb = importlib.util.module_from_spec(spec)
    sys.modules["envoy_bench"] = eb
    spec.loader.exec_module(eb)
    return eb.build_before(ref)


def build_phases() -> Path:
    """The filter with `--features phase-marks`, built and optimized like `make build`."""
    subprocess.run(["cargo", "build", "-q", "--release", "--target", "wasm32-wasip1", "--features", "phase-marks",
                    "--target-dir", str(PHASES_DIR)], cwd=ROOT, check=True)
    raw = PHASES_DIR / "wasm32-wasip1" / "release" / "kube_peer_proxy.wasm"
    subprocess.run(["bash", str(ROOT / "scripts" / "wasm-opt.sh"), str(raw), str(PHASES_WASM)], check=True)
    return PHASES_WASM


def phases(world: World, method, path, extra, n=60) -> dict[str, int]:
    """Wasm instructions between the phase marks of the last of `n` requests."""
    for _ in range(n):
        world.worker.marks.clear()
        world.request(method, path, extra)
    out, prev = {}, None
    for mark, fuel in world.worker.marks:
        if prev is not None and mark in PHASES:
            out[PHASES[mark]] = fuel - prev
        prev = fuel
    return out


def measure(world: World, method, path, extra, n=100, warm=50) -> tuple[dict, Counter, int, int]:
    """Per VM entry and in all, the median of requests `warm`..`n`; and the first request's total
    (the worker's entry cache still empty: it reads the table's bucket for the key)."""
    runs = []
    calls = Counter()
    first = 0
    for i in range(n):
        fuel, c = world.request(method, path, extra)
        if i == 0:
            first = sum(fuel.values())
        if i >= warm:
            runs.append(fuel)
            calls = c
    entries = sorted({k for r in runs for k in r})
    med = {k: int(statistics.median(r.get(k, 0) for r in runs)) for k in entries}
    total = int(statistics.median(sum(r.values()) for r in runs))
    return med, calls, total, first


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wasm", type=Path, default=FILTER_WASM)
    p.add_argument("--floor", type=Path, default=FLOOR_WASM)
    p.add_argument("--before", default=None,
                   help="git ref of the filter to count beside this one (built like bench/envoy_bench.py --before)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--no-phases", action="store_true", help="skip the phase-marked build and its table")
    a = p.parse_args(argv)
    rows = []
    floor = World(a.floor, "plain", floor=True)
    fm, fc, ft, ff = measure(floor, "GET", LOCAL_PATH, ())
    rows.append(("floor", "the wasm floor (reads `:path`)", fm, fc, ft, ff))
    builds = [("", a.wasm)] + ([("before ", build_before(a.before))] if a.before else [])
    for label, wasm in builds:
        for profile in ("plain", "kubeadm", "large"):
            world = World(wasm, "plain" if profile == "large" else profile, floor=False, large=profile == "large")
            for key, title, method, path, extra in SCENARIOS:
                if profile != "plain" and key not in (("get", "peer") if profile == "large" else ("get", "list")):
                    continue
                m, c, t, f = measure(world, method, path, extra)
                if profile == "large":
                    title += ", large table (+20 000 CRD resources per server, as (e1), (e2))"
                rows.append((f"{label}{profile} {key}", title, m, c, t, f))
    w = ["| request | wasm instructions | over the floor | first request | by VM entry | host calls |",
         "|---|---:|---:|---:|---|---|"]
    for key, title, m, c, t, f in rows:
        by = ", ".join(f"{k.removeprefix('proxy_on_')} {v:,}" for k, v in m.items())
        hc = ", ".join(f"{k.removeprefix('proxy_')} {v}" for k, v in sorted(c.items()))
        over = "—" if key == "floor" else f"{t - ft:+,}"
        w.append(f"| {key}: {title} | {t:,} | {over} | {f:,} | {by} | {hc} |")
    if not a.no_phases:
        wasm = build_phases()
        w += ["", "Where `on_http_request_headers` spends them (a build with `--features phase-marks`, which marks "
              "each step; wasm instructions between marks):", "",
              "| request | " + " | ".join(PHASES.values()) + " |", "|---|" + "---:|" * len(PHASES)]
        for profile in ("plain", "kubeadm"):
            world = World(wasm, profile, floor=False)
            for key, title, method, path, extra in SCENARIOS:
                if profile == "kubeadm" and key not in ("get", "list"):
                    continue
                ph = phases(world, method, path, extra)
                w.append(f"| {profile} {key} | " + " | ".join(f"{ph[p]:,}" if p in ph else "—" for p in PHASES.values())
                         + " |")
    text = "\n".join(w) + "\n"
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
