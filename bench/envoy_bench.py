#!/usr/bin/env python3
"""Envoy-in-the-loop benchmark of the filter: CPU per request, throughput, latency and memory.

    .venv/bin/python bench/envoy_bench.py [--duration 10] [--repeat 3] [--out target/bench/envoy.md]
                                          [--only a,b,c,d,e1,e2,idle]

Topology (all on 127.0.0.1, every Envoy launched through tests/e2e/harness.py, i.e. func-e):

    wrk ──► Envoy under test (envoy/render.py bootstrap, with or without the filter)
                 │ local            │ peer-b, peer-c
                 ▼                  ▼
            "apiservers": one upstream Envoy answering with `direct_response` only
            (old = 1.33 discovery, new = 1.37-dev discovery; /api 404; anything else a small JSON)

The upstream Envoy is as cheap as an HTTP server gets, so the Envoy under test dominates; its CPU
(utime + stime of its process tree from /proc, over the measured wrk run) divided by the requests
wrk completed is the number the design's "Per-request cost budget" talks about.

The upstream honours If-None-Match with a 304 like a real apiserver. Load scenarios use a 30 min
refresh interval so the table does not change (and the discovery service does not run) while wrk
runs: they measure the request path alone. The idle scenarios measure the discovery service itself
at the renderer's default refresh interval, with nobody sending requests.

Writes a markdown report (--out) and prints it; exits non-zero if a scenario misbehaves (a request
that does not reach the expected server, non-2xx answers under load).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from kpp import harness, render

ROOT = Path(__file__).resolve().parents[1]

FIXTURES = ROOT / "tests" / "fixtures" / "k8s-discovery"
OLD_FIXTURE = FIXTURES / "aggregated_v2.k8s-1.33.json"
NEW_FIXTURE = FIXTURES / "aggregated_v2.k8s-1.37-dev-fork.json"
CORE_BENCH = ROOT / "target" / "release" / "examples" / "core_bench"
V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
# The synthetic CRD set of the large-table scenario (same recipe as examples/core_bench.rs).
BIG = (400, 2, 25)  # groups, versions per group, resources per version -> 20 000 resources

LOCAL_PATH = "/apis/apps/v1/namespaces/default/deployments/web"
PEER_PATH = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/claim-1"
# Plugin settings of the load scenarios: one discovery round at start, none while wrk runs.
STEADY = {"refresh_interval": "30m", "staleness_limit": "60m"}

WRK_THREADS = 2
WRK_CONNECTIONS = 50
WARMUP_S = 3
IDLE_S = 20

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------------------------
# Processes


def tree(pid: int) -> list[int]:
    """pid and all its descendants (func-e and the Envoy it runs)."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process tree rooted at pid (all threads), in seconds."""
    ticks = 0
    for p in tree(pid):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return ticks / CLK_TCK


def envoy_pid(pid: int) -> int:
    for p in tree(pid):
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() == "envoy":
                return p
        except OSError:
            pass
    raise RuntimeError(f"no envoy process under pid {pid}")


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of the Envoy process in MiB."""
    status = Path(f"/proc/{envoy_pid(pid)}/status").read_text()
    val = {k: int(v.split()[0]) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(.*)$", status, re.M)}
    return val["VmRSS"] / 1024, val["VmHWM"] / 1024


# ---------------------------------------------------------------------------------------------
# HTTP


def get(url: str, headers: dict | None = None, timeout: float = 10.0) -> tuple[int, dict, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()
    except OSError:
        return 0, {}, b""


# ---------------------------------------------------------------------------------------------
# Upstream "apiservers"


def apiserver_etag(body: bytes) -> str:
    """The apiserver's discovery ETag: quoted upper-case hex SHA-512 of the body."""
    return '"%s"' % hashlib.sha512(body).hexdigest().upper()


def _hdr(key: str, value: str) -> dict:
    return {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


SMALL_OBJECT = json.dumps({
    "kind": "Deployment", "apiVersion": "apps/v1",
    "metadata": {"name": "web", "namespace": "default", "uid": "6c1f0b5e-2f0e-4d3c-9a53-0d8c1d3f5e11",
                 "resourceVersion": "1234", "generation": 1, "labels": {"app": "web"}},
    "spec": {"replicas": 1}, "status": {}}, separators=(",", ":"))
NOT_FOUND = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "the server could not find the requested resource",
                        "reason": "NotFound", "details": {}, "code": 404}, separators=(",", ":"))


def upstream_listener(name: str, port: int, apis_file: Path) -> dict:
    body = apis_file.read_bytes()
    etag = apiserver_etag(body)
    json_ct = _hdr("content-type", "application/json")
    served_by = _hdr("x-served-by", name)
    routes = [
        {"match": {"path": "/apis", "headers": [{"name": "if-none-match", "string_match": {"exact": etag}}]},
         "direct_response": {"status": 304}, "response_headers_to_add": [_hdr("etag", etag), served_by]},
        {"match": {"path": "/apis"},
         "direct_response": {"status": 200, "body": {"filename": str(apis_file)}},
         "response_headers_to_add": [_hdr("content-type", V2), _hdr("etag", etag), served_by]},
        {"match": {"path": "/api"},
         "direct_response": {"status": 404, "body": {"inline_string": NOT_FOUND}},
         "response_headers_to_add": [json_ct, served_by]},
        {"match": {"prefix": "/"},
         "direct_response": {"status": 200, "body": {"inline_string": SMALL_OBJECT}},
         "response_headers_to_add": [json_ct, served_by]},
    ]
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                 ".HttpConnectionManager",
        "stat_prefix": name,
        "route_config": {
            "name": name,
            # Discovery documents are served whole from memory; the default cap is 4 KiB.
            "max_direct_response_body_size_bytes": 64 << 20,
            "virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}],
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    }
    return {"name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                            "typed_config": hcm}]}]}


def upstream_bootstrap(admin_port: int, servers: list[tuple[str, int, Path]]) -> str:
    return json.dumps({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"listeners": [upstream_listener(*s) for s in servers]},
    }, indent=1) + "\n"


# ---------------------------------------------------------------------------------------------
# wrk


@dataclass
class WrkResult:
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    non_2xx: int
    errors: str
    transfer: str


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    if not m:
        raise ValueError(f"unparsable wrk latency {text!r}")
    value, unit = float(m.group(1)), m.group(2)
    return value * {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}[unit]


def wrk_command(url: str, duration: int, headers: dict | None = None) -> list[str]:
    cmd = ["wrk", f"-t{WRK_THREADS}", f"-c{WRK_CONNECTIONS}", f"-d{duration}s", "--latency"]
    for k, v in (headers or {}).items():
        cmd += ["-H", f"{k}: {v}"]
    return cmd + [url]


def run_wrk(url: str, duration: int, headers: dict | None = None) -> WrkResult:
    out = subprocess.run(wrk_command(url, duration, headers), capture_output=True, text=True,
                         check=True, timeout=duration + 60).stdout
    total = re.search(r"(\d+) requests in ([\d.]+)(\w+), ([\d.]+\w+) read", out)
    if not total:
        raise RuntimeError(f"unparsable wrk output:\n{out}")
    seconds = float(total.group(2)) * {"ms": 1e-3, "s": 1.0, "m": 60.0}[total.group(3)]
    lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)$", out, re.M))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)$", out, re.M)
    return WrkResult(
        requests=int(total.group(1)), seconds=seconds,
        rps=float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
        p50_ms=_ms(lat["50"]), p99_ms=_ms(lat["99"]),
        non_2xx=int(non2xx.group(1)) if non2xx else 0,
        errors=errors.group(1).strip() if errors else "",
        transfer=total.group(4))


# ---------------------------------------------------------------------------------------------
# Scenarios


@dataclass
class Scenario:
    key: str
    title: str
    filter: bool
    big: bool
    path: str
    headers: dict = field(default_factory=dict)
    # Which upstream must answer a sanity request ("" = the filter answers itself).
    served_by: tuple[str, ...] = ()


SCENARIOS = [
    Scenario("a", "plain Envoy (no filter), GET of a common resource", False, False, LOCAL_PATH,
             served_by=("old",)),
    Scenario("b", "filter, GET of a locally served resource", True, False, LOCAL_PATH, served_by=("old",)),
    Scenario("c", "filter, GET of a new-only resource (rerouted to a peer)", True, False, PEER_PATH,
             served_by=("new-b", "new-c")),
    Scenario("d", "filter, merged `GET /apis` (aggregated v2 Accept): the local server's 200, body swapped",
             True, False, "/apis", headers={"Accept": V2}, served_by=("old",)),
    Scenario("e1", "filter, large table (+20 000 CRD resources per server), local resource", True, True,
             LOCAL_PATH, served_by=("big-old",)),
    Scenario("e2", "filter, large table (+20 000 CRD resources per server), new-only resource (peer)",
             True, True, PEER_PATH, served_by=("big-new-b", "big-new-c")),
]


@dataclass
class Run:
    """One measured wrk run against one scenario's Envoy."""
    wrk: WrkResult
    cpu_s: float
    upstream_cpu_s: float
    loadavg: float
    rerouted: int
    merged: int

    @property
    def us_per_req(self) -> float:
        return self.cpu_s / self.wrk.requests * 1e6


@dataclass
class Result:
    scenario: Scenario
    runs: list[Run]
    rss_mib: float = 0.0
    hwm_mib: float = 0.0
    snapshot_s: float | None = None
    # Latencies (ms) of the first requests after the first snapshot was published: the first one
    # on each worker decodes the table and copies the merged documents into that worker's VM.
    first_ms: list[float] = field(default_factory=list)

    @property
    def median(self) -> Run:
        """The run with the median Envoy CPU per request."""
        ordered = sorted(self.runs, key=lambda r: r.us_per_req)
        return ordered[(len(ordered) - 1) // 2]


def counters(envoy: harness.Envoy) -> tuple[int, int]:
    stats = envoy.stats("wasmcustom")
    return (sum(v for k, v in stats.items() if "rerouted_request_total" in k),
            sum(v for k, v in stats.items() if "merged_discovery_responses_total" in k))


class Bench:
    def __init__(self, duration: int, repeat: int, workdir: Path):
        self.duration = duration
        self.repeat = repeat
        self.workdir = workdir
        self.ports: dict[str, int] = {}
        self.upstream: harness.Envoy | None = None
        self.snapshot_sizes: dict | None = None
        self.merged_sizes: dict[str, int] = {}
        self.started: list[harness.Envoy] = []

    # -- set-up ----------------------------------------------------------------------------

    def build_documents(self) -> dict[str, Path]:
        big_old, big_new = self.workdir / "big-old-apis.json", self.workdir / "big-new-apis.json"
        for base, out in ((OLD_FIXTURE, big_old), (NEW_FIXTURE, big_new)):
            with open(out, "wb") as f:
                subprocess.run([str(CORE_BENCH), "synth", str(base), *map(str, BIG)], stdout=f, check=True)
        self.snapshot_sizes = json.loads(subprocess.run(
            [str(CORE_BENCH), "snapshot", str(big_old), str(big_new), str(big_new)],
            capture_output=True, text=True, check=True).stdout)
        self.small_snapshot_sizes = json.loads(subprocess.run(
            [str(CORE_BENCH), "snapshot", str(OLD_FIXTURE), str(NEW_FIXTURE), str(NEW_FIXTURE)],
            capture_output=True, text=True, check=True).stdout)
        return {"old": OLD_FIXTURE, "new-b": NEW_FIXTURE, "new-c": NEW_FIXTURE,
                "big-old": big_old, "big-new-b": big_new, "big-new-c": big_new}

    def start_upstream(self) -> None:
        docs = self.build_documents()
        self.doc_bytes = {k: v.stat().st_size for k, v in docs.items()}
        for name in docs:
            self.ports[name] = harness.free_port()
        admin = harness.free_port()
        yaml = upstream_bootstrap(admin, [(n, self.ports[n], p) for n, p in docs.items()])
        self.upstream = self.start_envoy(yaml, "upstream", admin)
        for name in docs:
            status, headers, _ = get(f"http://127.0.0.1:{self.ports[name]}/apis")
            if status != 200 or headers.get("content-type") != V2:
                raise RuntimeError(f"upstream {name}: /apis gave {status} {headers}")

    def start_envoy(self, yaml: str, name: str, admin: int) -> harness.Envoy:
        envoy = harness.Envoy(yaml, name, admin, workdir=self.workdir / f"envoy-{name}",
                              log_level="warning", component_log_level="wasm:info")
        self.started.append(envoy)
        return envoy.start()

    def envoy_under_test(self, name: str, with_filter: bool, big: bool, plugin: dict) -> tuple[harness.Envoy, int]:
        prefix = "big-" if big else ""
        port, admin = harness.free_port(), harness.free_port()
        yaml = render.render_bootstrap(
            node="a", listen_port=port, admin_port=admin,
            local=("127.0.0.1", self.ports[prefix + "old"]),
            peers=[("b", "127.0.0.1", self.ports[prefix + "new-b"]),
                   ("c", "127.0.0.1", self.ports[prefix + "new-c"])],
            wasm_path=str(harness.wasm_path()), plugin=plugin, with_filter=with_filter)
        return self.start_envoy(yaml, name, admin), port

    @staticmethod
    def wait_snapshot(port: int, big: bool, timeout: float = 120.0) -> float:
        """Seconds until the merged /apis lists a group only the new servers (and, for the large
        table, the synthetic CRDs) have: every server's discovery is in the snapshot."""
        t0 = time.monotonic()

        def ready():
            status, _, body = get(f"http://127.0.0.1:{port}/apis", {"Accept": V2}, timeout=30)
            return (status == 200 and b'"resource.k8s.io"' in body
                    and (not big or b'"g0399.bench.example.com"' in body))
        harness.wait_until(ready, timeout, interval=0.05, message=f"no complete snapshot within {timeout}s")
        return time.monotonic() - t0

    @staticmethod
    def wait_published(envoy: harness.Envoy, big: bool, timeout: float = 120.0) -> float:
        """Seconds until the discovery service has published a snapshot with all three servers,
        judged from its gauges only, so no request has made a filter VM load it yet."""
        t0 = time.monotonic()

        def published():
            st = envoy.stats("wasmcustom")
            fresh = sum(v for k, v in st.items() if "kube_peer_proxy_server_fresh" in k)
            return st.get("wasmcustom.kube_peer_proxy_snapshot_generation", 0) >= 1 and fresh == 3
        harness.wait_until(published, timeout, interval=0.05, message=f"no snapshot published within {timeout}s")
        return time.monotonic() - t0

    @staticmethod
    def first_requests(sc: Scenario, port: int, n: int = 20) -> list[float]:
        """Latency of n sequential requests, each on a new connection (spread over the workers)."""
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            status, _, _ = get(f"http://127.0.0.1:{port}{sc.path}", sc.headers, timeout=60)
            out.append((time.perf_counter() - t0) * 1e3)
            if status != 200:
                raise RuntimeError(f"scenario {sc.key}: first requests: GET {sc.path} gave {status}")
        return out

    # -- measurements ------------------------------------------------------------------------

    def check(self, sc: Scenario, port: int) -> None:
        """A few requests must reach the expected server before the load starts."""
        seen = set()
        for _ in range(20):
            status, headers, body = get(f"http://127.0.0.1:{port}{sc.path}", sc.headers)
            if status != 200:
                raise RuntimeError(f"scenario {sc.key}: GET {sc.path} gave {status}: {body[:300]!r}")
            seen.add(headers.get("x-served-by", ""))
        if not seen <= set(sc.served_by):
            raise RuntimeError(f"scenario {sc.key}: GET {sc.path} served by {seen}, expected {sc.served_by}")
        if sc.key == "d":
            self.merged_sizes["fixtures"] = len(body)

    def measure(self, sc: Scenario, envoy: harness.Envoy, port: int) -> Run:
        url = f"http://127.0.0.1:{port}{sc.path}"
        before = counters(envoy) if sc.filter else (0, 0)
        loadavg = float(Path("/proc/loadavg").read_text().split()[0])
        cpu0, up0 = cpu_seconds(envoy.process.pid), cpu_seconds(self.upstream.process.pid)
        w = run_wrk(url, self.duration, sc.headers)
        cpu1, up1 = cpu_seconds(envoy.process.pid), cpu_seconds(self.upstream.process.pid)
        if w.non_2xx or w.errors:
            raise RuntimeError(f"scenario {sc.key}: {w.non_2xx} non-2xx answers, socket errors {w.errors!r}")
        after = counters(envoy) if sc.filter else (0, 0)
        return Run(w, cpu1 - cpu0, up1 - up0, loadavg, after[0] - before[0], after[1] - before[1])

    def run_scenarios(self, scenarios: list[Scenario]) -> list[Result]:
        """Starts one Envoy per scenario, then measures them round-robin `repeat` times, so that
        a change in the machine's background load spreads over all scenarios alike."""
        live = []
        try:
            for sc in scenarios:
                print(f"envoy_bench: starting ({sc.key}) {sc.title}", file=sys.stderr)
                envoy, port = self.envoy_under_test(f"test-{sc.key}", sc.filter, sc.big, STEADY)
                res = Result(sc, [])
                live.append((res, envoy, port))
                if sc.filter:
                    res.snapshot_s = self.wait_published(envoy, sc.big)
                    res.first_ms = self.first_requests(sc, port)
                    self.wait_snapshot(port, sc.big)
                self.check(sc, port)
                run_wrk(f"http://127.0.0.1:{port}{sc.path}", WARMUP_S, sc.headers)
            for i in range(self.repeat):
                for res, envoy, port in live:
                    print(f"envoy_bench: run {i + 1}/{self.repeat} of ({res.scenario.key})", file=sys.stderr)
                    res.runs.append(self.measure(res.scenario, envoy, port))
            for res, envoy, _ in live:
                res.rss_mib, res.hwm_mib = rss_mib(envoy.process.pid)
        finally:
            for _, envoy, _ in live:
                envoy.stop()
        return [res for res, _, _ in live]

    def run_idle(self, big: bool) -> dict:
        """Envoy CPU with no requests, discovery rounds at the renderer's default interval."""
        name = "idle-big" if big else "idle"
        print(f"envoy_bench: {name}: discovery service at refresh {render.DEFAULT_PLUGIN['refresh_interval']}, "
              f"{IDLE_S}s without requests", file=sys.stderr)
        envoy, port = self.envoy_under_test(name, True, big, {})
        try:
            snapshot_s = self.wait_snapshot(port, big)
            time.sleep(2)
            pid = envoy.process.pid
            cpu0, t0 = cpu_seconds(pid), time.monotonic()
            time.sleep(IDLE_S)
            cpu1, t1 = cpu_seconds(pid), time.monotonic()
            rss, hwm = rss_mib(pid)
            if big:
                _, _, body = get(f"http://127.0.0.1:{port}/apis", {"Accept": V2}, timeout=30)
                self.merged_sizes["large"] = len(body)
            return {"name": name, "big": big, "cpu_s": cpu1 - cpu0, "seconds": t1 - t0,
                    "rss": rss, "hwm": hwm, "snapshot_s": snapshot_s}
        finally:
            envoy.stop()

    def stop(self) -> None:
        for e in self.started:
            e.stop()


# ---------------------------------------------------------------------------------------------
# Report


def envoy_version() -> str:
    out = subprocess.run([str(harness.envoy_binary()), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version: (\S+)", out)
    return m.group(1) if m else out.strip()


def report(results: list[Result], idle: list[dict], bench: Bench, argv: list[str]) -> str:
    by = {r.scenario.key: r for r in results}
    lines = []
    w = lines.append
    w(f"Measured {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; "
      f"Envoy `{envoy_version()}` with `--concurrency 2` (as tests/e2e/harness.py starts every Envoy, "
      f"through func-e); wasm `{harness.wasm_path().relative_to(ROOT)}` "
      f"({harness.wasm_path().stat().st_size:,} bytes).")
    w("")
    w(f"Command: `.venv/bin/python {' '.join(shlex.quote(a) for a in argv)}`. Load: "
      f"`{' '.join(wrk_command('http://127.0.0.1:PORT/PATH', bench.duration))}`, after a {WARMUP_S} s "
      f"warm-up run; each scenario is measured {bench.repeat} times, round-robin over all scenarios, "
      f"and the table shows the run with the median CPU per request (range of all runs in brackets). "
      f"wrk, the Envoy under test and the upstream Envoy share the machine's {os.cpu_count()} cores, "
      "so requests/s and latency are those of a saturated 2-core box and of whatever else ran on it "
      "(1-minute load average at the start of the median run in the last column); CPU µs/request "
      "counts only the Envoy under test (utime + stime of its process tree from /proc ÷ requests).")
    w("")
    w("| scenario | requests/s | p50 ms | p99 ms | Envoy CPU µs/req | upstream CPU µs/req | "
      "Envoy RSS MiB (peak) | load |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        m = r.median
        spread = f" ({min(x.us_per_req for x in r.runs):.0f}–{max(x.us_per_req for x in r.runs):.0f})" \
            if len(r.runs) > 1 else ""
        w(f"| ({r.scenario.key}) {r.scenario.title} | {m.wrk.rps:,.0f} | {m.wrk.p50_ms:.2f} | "
          f"{m.wrk.p99_ms:.2f} | **{m.us_per_req:.1f}**{spread} | "
          f"{m.upstream_cpu_s / m.wrk.requests * 1e6:.1f} | {r.rss_mib:.0f} ({r.hwm_mib:.0f}) | {m.loadavg:.2f} |")
    w("")
    if any(len(r.runs) > 1 for r in results):
        w("All runs, Envoy CPU µs/request in run order: " + "; ".join(
            f"({r.scenario.key}) " + ", ".join(f"{x.us_per_req:.0f}" for x in r.runs) for r in results) + ".")
        w("")

    def us(k):
        return by[k].median.us_per_req
    if "a" in by:
        deltas = [f"({k}) {us(k) - us('a'):+.1f} µs" for k in ("b", "c", "d", "e1", "e2") if k in by]
        w("Envoy CPU per request over plain Envoy (a): " + ", ".join(deltas) + ".")
        w("")
    pairs = [(e, s) for e, s in (("e1", "b"), ("e2", "c")) if e in by and s in by]
    if pairs:
        def rng(k):
            xs = [x.us_per_req for x in by[k].runs]
            return f"median {us(k):.1f}, runs {min(xs):.0f}–{max(xs):.0f}"
        w("Large table against the fixtures' table (same request; table "
          f"{bench.small_snapshot_sizes['keys']:,} → {bench.snapshot_sizes['keys']:,} keys): "
          + "; ".join(f"({e}) − ({s}) = **{us(e) - us(s):+.1f} µs/request** "
                      f"(({e}) {rng(e)}; ({s}) {rng(s)})" for e, s in pairs)
          + ". Memory: " + ", ".join(f"({e}) − ({s}) = {by[e].rss_mib - by[s].rss_mib:+.0f} MiB RSS"
                                     for e, s in pairs) + ".")
        w("")
    checks = []
    for r in results:
        m = r.median
        if r.scenario.key in ("c", "e2"):
            checks.append(f"({r.scenario.key}) {m.rerouted:,} rerouted for {m.wrk.requests:,} completed")
        if r.scenario.key == "d":
            checks.append(f"(d) {m.merged:,} merged answers for {m.wrk.requests:,} completed")
    w("Sanity: before the load, 20 requests of each scenario must be answered by the expected server "
      "(upstream `x-served-by` header); every answer under load was 2xx"
      + ("; the filter's counters over the median run: " + "; ".join(checks) if checks else "") + ".")
    w("")
    firsts = [r for r in results if r.first_ms]
    if firsts:
        w("**New snapshot on the request path**: a filter VM decodes the table (and copies the merged "
          "documents) on the first request after the generation changes. Right after the first "
          "snapshot was published (seconds after Envoy was ready in brackets), 20 sequential "
          "requests, each on a new connection (so both workers get some), no other load:")
        w("")
        w("| scenario | slowest of 20 ms | 2nd slowest ms | median ms |")
        w("|---|---:|---:|---:|")
        for r in firsts:
            xs = sorted(r.first_ms, reverse=True)
            w(f"| ({r.scenario.key}) [{r.snapshot_s:.2f} s] | {xs[0]:.1f} | {xs[1]:.1f} | "
              f"{xs[len(xs) // 2]:.1f} |")
        w("")
    w("**Shared data**: the values the discovery service publishes, sized by `core_bench snapshot` "
      "(the same `Syncer` code on the same documents, `/api` answering 404 as upstream does here):")
    w("")
    w("| table | servers' `/apis` documents | keys | table | merged `/apis` | merged `/api` | "
      "merged legacy `/apis` | total |")
    w("|---|---|---:|---:|---:|---:|---:|---:|")
    for label, s, docs in (("fixtures (a–d)", bench.small_snapshot_sizes, ("old", "new-b")),
                           ("large (e)", bench.snapshot_sizes, ("big-old", "big-new-b"))):
        w(f"| {label} | {bench.doc_bytes[docs[0]]:,} B + 2 × {bench.doc_bytes[docs[1]]:,} B | {s['keys']:,} | "
          f"{s['table_bytes']:,} B | {s['merged_apis_bytes']:,} B | {s['merged_api_bytes']:,} B | "
          f"{s.get('merged_apis_legacy_bytes', 0):,} B | **{s['total_bytes']:,} B** |")
    w("")
    got = ", ".join(f"{k} {v:,} B" for k, v in bench.merged_sizes.items())
    if got:
        w(f"Cross-check: merged `/apis` bodies the filter served: {got}.")
        w("")
    if idle:
        refresh = render.DEFAULT_PLUGIN["refresh_interval"]
        w(f"**Discovery service, no requests**: refresh interval {refresh} (the renderer's default); the "
          "upstream answers If-None-Match with 304 like an apiserver (and `/api` with 404), so an unchanged "
          "round fetches no bodies and builds no snapshot; the workers' timers only read the generation "
          f"key. Envoy CPU over {IDLE_S} s:")
        w("")
        w("| table | Envoy CPU ms per second | ≈ CPU ms per round | Envoy RSS MiB (peak) | time to first snapshot |")
        w("|---|---:|---:|---:|---:|")
        rounds_per_s = 1 / float(refresh.rstrip("s"))
        for i in idle:
            per_s = i["cpu_s"] / i["seconds"] * 1e3
            w(f"| {'large (e)' if i['big'] else 'fixtures (a–d)'} | {per_s:.1f} | {per_s / rounds_per_s:.0f} | "
              f"{i['rss']:.0f} ({i['hwm']:.0f}) | {i['snapshot_s']:.2f} s |")
        w("")
    return "\n".join(lines) + "\n"


def ensure_tools() -> None:
    if shutil.which("wrk") is None:
        print("envoy_bench: installing wrk", file=sys.stderr)
        subprocess.run(["apt-get", "update"], check=True)
        subprocess.run(["apt-get", "install", "-y", "wrk"], check=True)
    subprocess.run(["cargo", "build", "--release", "--example", "core_bench"], cwd=ROOT, check=True,
                   stdout=sys.stderr)
    harness.wasm_path()  # raises with a hint when `make build` has not run


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=int, default=10, help="seconds of each measured wrk run")
    p.add_argument("--repeat", type=int, default=5, help="measured runs per scenario (median shown)")
    p.add_argument("--out", type=Path, default=None, help="write the markdown report here too")
    p.add_argument("--only", default="", help="comma-separated scenario keys (a,b,c,d,e1,e2,idle)")
    a = p.parse_args(argv)
    only = set(filter(None, a.only.split(",")))
    ensure_tools()
    workdir = Path(tempfile.mkdtemp(prefix="kpp-bench-"))
    bench = Bench(a.duration, a.repeat, workdir)
    try:
        bench.start_upstream()
        results = bench.run_scenarios([sc for sc in SCENARIOS if not only or sc.key in only])
        idle = [bench.run_idle(big) for big in (False, True)] if not only or "idle" in only else []
    finally:
        bench.stop()
    text = report(results, idle, bench, ["bench/envoy_bench.py", *argv])
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    print(text)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
