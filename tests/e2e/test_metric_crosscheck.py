"""Every metric the alert rules use (deploy/monitoring/kube-peer-proxy.rules.yaml) against a count that does
not come from the filter: Envoy's access log, Envoy's own stats, Envoy's log, and the fake apiservers'
record of what they were asked and answered.

Real Envoy (two workers), fake apiservers a (old), b and c (new), and the real filter with one addition: a
VM trap hook (`filter_variant`, below), because the real filter cannot be made to trap (it never panics on
request data) and a VM reload is one of the events checked. The hook wraps the module's exported
`proxy_on_request_headers` and traps on a request with at least TRAP_HEADERS headers; everything the
filter counts is its own unchanged code.

Under client load (reroutes, local requests, creates, object 404s, merged discovery with and without
If-None-Match, a type nobody serves), the scenario goes through: a member whose API set is unknown (c
answers 401: guarded 404s), discovery faults (500, malformed, hung), a rerouted request reset in flight
and connect failures (b stopped mid-load), both peers down (the filter's own 503s), two VM traps, and
rerouted watches. Then the cut: clients stopped, no downstream stream left (Envoy's
`downstream_rq_active` is 0), no upstream request left, counters read once, and the access log flushed
through admin `/reopen_logs` until it holds exactly `downstream_rq_total` lines.

The rules (asserted by `crosscheck` and `gauges_at_cut`; counters exactly equal, gauges within the
tolerance named):

* `rerouted_request_total{code,group,version,resource}`: access-log lines of rerouted requests (upstream
  cluster `peer-*`) that got an answer while their VM was alive, by GVR of the path and by the code the
  filter saw at response headers. That code is the line's code, except that a peer's "not served here"
  404 the filter answered 503 (the line carries the filter's reply header) was a 404 to the filter. Not
  counted: lines with code 0 (the stream ended before an answer) and `wasm_fail_stream` lines (the VM
  failed before the answer; Envoy answered 503 and the filter never saw it).
* `peer_proxy_errors_total{type}`: `peer_unavailable` = the filter's 503s (reply header) sent before any
  upstream was asked (no upstream host); `guarded_not_found` = the filter's 503s after an upstream
  answered (an upstream host); `upstream_unreachable` = rerouted lines answered 5xx by Envoy itself
  (response code details neither `via_upstream` nor `wasm_fail_stream`, no reply header).
* `merged_discovery_responses_total{doc,code}`: GET /apis, /api lines answered 200 or 304 whose ETag is not
  the local server's own for that document (the filter replaced it).
* `discovery_sync_errors_total{server,type}`: the fakes' record of the discovery fetches (`/api`, `/apis`,
  no test tag) they received before the cut, by the fault they answered with: `http_status` = 500 or 401
  answers, `decode` = malformed answers, `timeout` = fetches held until Envoy gave up (fetch_timeout);
  `unreachable` = fetches a stopping fake dropped unanswered, plus Envoy's
  `upstream_rq_pending_failure_eject` of that peer's cluster (requests failed for a connection failure,
  async fetches included) minus the rerouted lines to it that failed to connect (flag `UF`). The filter
  labels a reset before any answer `unreachable` too: Envoy's own 503 for it lacks
  x-envoy-upstream-service-time (src/discovery/sync/answers.rs); `reset` is added to `unreachable`. While
  a peer is down the load sends nothing the 404 guard would ask the peers about (`Load.quiet_on`), so the
  only requests Envoy fails to connect for are fetches and reroutes.
* `envoy_wasm_*_vm_reload_success/_failure`: traps caused = VM failures in Envoy's log = the trap
  requests' 503 lines; no reload failure; the discovery VM never reloaded.
* `server_fresh`, `server_last_success_age_seconds`, `snapshot_age_seconds` (gauges): against the fakes'
  record of their last successful discovery answer: fresh 0 only after staleness_limit without one, 1 at
  the cut, the age within two refresh intervals plus the gauge's whole-second rounding, and the snapshot
  at most 2 s old (the alert fires at 120 s).
* Retries: the bootstrap has no retry policy, Envoy's `upstream_rq_retry` stays 0, and each peer received
  no more rerouted requests than the lines sent to it (a request reset in flight may or may not have
  reached it).

The certificate and key-rotation alerts read Envoy's own TLS and SDS stats, which the filter does not keep
(tests/e2e/test_monitoring.py and the PKI tests cover them).

Controls: in the same run, the counter read the way `make upgrade-k8s` read it (with rerouted watches
still open: they get an access-log line only when they end) disagrees with the log by exactly the open
watches; and `test_crosscheck_catches_a_filter_that_loses_counts` runs a filter whose counter increments
are dropped one in five (the same hook technique on the `proxy_increment_metric` import) and the check
must fail.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from kpp import render
from kpp.testing import harness
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.fake_apiserver import server as fake_server
from kpp.testing.topology import COMMON, NEW_ONLY, NOWHERE, V2, request

GV_PATH = "/apis/resource.k8s.io/v1"  # group/version discovery only b and c serve: rerouted like a resource
TAG = "x-kpp-test"  # every client request of this test carries it; the filter's own fetches do not
TRAP_HEADERS = 40  # a request with this many headers traps the hooked VM (an ordinary one has about 10)
PLUGIN = {"refresh_interval": "500ms", "fetch_timeout": "1s", "staleness_limit": "2s"}
REFRESH, STALENESS = 0.5, 2.0
WATCHES = 3
# The features rustc emits for wasm32-wasip1 (scripts/wasm-opt.sh names the same).
WASM_FEATURES = ["--enable-bulk-memory", "--enable-sign-ext", "--enable-mutable-globals",
                 "--enable-nontrapping-float-to-int", "--enable-reference-types", "--enable-multivalue"]
RETRY_FLAGS = ("UF", "UH", "UO", "URX")  # Envoy never sent the request upstream


# ---- the filter with hooks ------------------------------------------------------------------------------

def filter_variant(out: Path, trap_headers: int | None = None, drop_every: int | None = None) -> Path:
    """The real filter's .wasm with hooks (binaryen's wasm-dis/wasm-as, which scripts/setup.sh installs):
    `trap_headers`: `proxy_on_request_headers` traps (`unreachable`) on a request with at least that many
    headers, else calls the filter's own; `drop_every`: every n-th call of the `proxy_increment_metric`
    import is skipped (the control: a filter that loses counts)."""
    for tool in ("wasm-dis", "wasm-as"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} missing: run scripts/setup.sh (apt package binaryen)")
    wat = subprocess.run(["wasm-dis", *WASM_FEATURES, str(harness.wasm_path())], capture_output=True, text=True,
                         check=True, timeout=120).stdout
    extra = []
    if trap_headers is not None:
        export = re.search(r'\(export "proxy_on_request_headers" \(func (\$\S+)\)\)', wat)
        assert export, "no proxy_on_request_headers export"
        wat = wat.replace(export.group(0), '(export "proxy_on_request_headers" (func $kpp_trap))')
        extra.append(f"""
 (func $kpp_trap (param $0 i32) (param $1 i32) (param $2 i32) (result i32)
  (if (i32.ge_u (local.get $1) (i32.const {trap_headers})) (then (unreachable)))
  (call {export.group(1)} (local.get $0) (local.get $1) (local.get $2)))""")
    if drop_every is not None:
        imported = re.search(r'\(import "env" "proxy_increment_metric" \(func (\$\S+) ', wat)
        assert imported, "no proxy_increment_metric import"
        wat, calls = re.subn(rf"\(call {re.escape(imported.group(1))}(?=[\s)])", "(call $kpp_inc", wat)
        assert calls >= 1, "proxy_increment_metric is never called"
        extra.append(f"""
 (global $kpp_inc_n (mut i32) (i32.const 0))
 (func $kpp_inc (param $0 i32) (param $1 i64) (result i32)
  (global.set $kpp_inc_n (i32.add (global.get $kpp_inc_n) (i32.const 1)))
  (if (result i32) (i32.eqz (i32.rem_u (global.get $kpp_inc_n) (i32.const {drop_every})))
   (then (i32.const 0))
   (else (call {imported.group(1)} (local.get $0) (local.get $1)))))""")
    end = wat.rstrip().rfind(")")  # the module's closing parenthesis
    text = out.with_suffix(".wat")
    text.write_text(wat[:end] + "".join(extra) + "\n)\n")
    subprocess.run(["wasm-as", *WASM_FEATURES, str(text), "-o", str(out)], capture_output=True, check=True,
                   timeout=120)
    return out


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    base = tmp_path_factory.mktemp("wasm")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            kw = {"trap": {"trap_headers": TRAP_HEADERS},
                  "lossy": {"trap_headers": TRAP_HEADERS, "drop_every": 5}}[name]
            built[name] = filter_variant(base / f"{name}.wasm", **kw)
        return built[name]
    return get


# ---- what the fake apiservers saw ------------------------------------------------------------------------

@dataclass
class Seen:
    t: float
    server: str
    method: str
    path: str
    tag: str | None
    fault: str = ""  # discovery requests: the fault the fake applied
    answered: bool = False  # discovery requests: the fake wrote its answer (not dropped by a stop)


class FakeRecord:
    """Every request the fakes received (with its test tag) and every discovery request with the fault it
    was answered with, recorded inside the fakes (hooks on their handler, undone by monkeypatch)."""

    def __init__(self, monkeypatch):
        self.received: list[Seen] = []
        self.discovery: list[Seen] = []
        self.lock = threading.Lock()
        log_request, discovery = fake_server.Instance._log_request, fake_server._Handler._discovery
        send = fake_server._Handler.send_response
        record = self

        def _log_request(inst, method, path, headers):
            with record.lock:
                record.received.append(Seen(time.monotonic(), inst.name, method, path, headers.get(TAG)))
            return log_request(inst, method, path, headers)

        def _discovery(handler, parts):
            inst = handler.instance
            applies = inst.fault_paths is None or "/" + "/".join(parts) in inst.fault_paths
            seen = Seen(time.monotonic(), inst.name, handler.command, "/" + "/".join(parts), handler.headers.get(TAG),
                        inst.fault if applies else "ok")
            with record.lock:
                record.discovery.append(seen)
            handler.kpp_sent = False
            discovery(handler, parts)  # raises OSError when the fake is stopped under it
            seen.answered = handler.kpp_sent

        def send_response(handler, code, message=None):
            handler.kpp_sent = True
            return send(handler, code, message)

        monkeypatch.setattr(fake_server.Instance, "_log_request", _log_request)
        monkeypatch.setattr(fake_server._Handler, "_discovery", _discovery)
        monkeypatch.setattr(fake_server._Handler, "send_response", send_response)

    def fetches(self) -> list[Seen]:
        """The filter's discovery fetches (the discovery service's rounds: /api and /apis, untagged)."""
        with self.lock:
            return [d for d in self.discovery if d.tag is None and d.path in ("/api", "/apis")]

    def tagged(self, server: str, tag: str) -> list[Seen]:
        with self.lock:
            return [r for r in self.received if r.server == server and r.tag == tag]


# ---- client load ----------------------------------------------------------------------------------------

@dataclass
class Answer:
    kind: str
    path: str
    status: int
    headers: dict


class Load:
    """`workers` threads, each sending a mix of requests back to back over its own keep-alive connection."""

    def __init__(self, port: int, workers: int = 3, pace: float = 0.004):
        self.port, self.workers, self.pace = port, workers, pace
        self.answers: list[Answer] = []
        self.etag = ""  # the last merged /apis ETag seen, sent back as If-None-Match
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        # While set, no request the 404 guard would ask the peers about ("missing", "nowhere"): see quiet_on.
        self.quiet = threading.Event()
        self.quiet_done: dict[int, int] = {}  # per thread: requests picked in quiet mode and answered
        self.threads: list[threading.Thread] = []

    def quiet_on(self):
        """Quiet mode, once every thread has had a quiet request answered (no guard question is left over
        from before): while peers are down, the only async requests Envoy makes to them are discovery
        fetches, whose connection failures `crosscheck` then reads from Envoy's cluster stats."""
        with self.lock:
            self.quiet_done = {i: 0 for i in range(self.workers)}
        self.quiet.set()
        harness.wait_until(lambda: all(n >= 1 for n in dict(self.quiet_done).values()), 20,
                           message="the load did not go quiet")

    def pick(self, idx: int, seq: int) -> tuple[str, str, str, dict, bytes | None]:
        n = seq % 10
        if self.quiet.is_set() and n in (3, 6):
            n = 0
        if n in (0, 1):
            return "reroute", "GET", NEW_ONLY, {}, None
        if n == 2:
            return "local", "GET", COMMON, {}, None
        if n == 3:
            return "missing", "GET", f"{NEW_ONLY}/missing-{idx}", {}, None
        if n == 4:
            body = json.dumps({"metadata": {"name": f"w{idx}-{seq}-{time.monotonic_ns() % 10**9}"}}).encode()
            return "create", "POST", NEW_ONLY, {"Content-Type": "application/json"}, body
        if n == 5:
            return "apis", "GET", "/apis", {"Accept": V2}, None
        if n == 6:
            return "nowhere", "GET", NOWHERE, {}, None
        if n == 7:
            return "api", "GET", "/api", {"Accept": V2}, None
        if n == 8:
            return "legacy", "GET", "/apis", {"Accept": "application/json"}, None
        with self.lock:
            etag = self.etag
        return "apis-inm", "GET", "/apis", {"Accept": V2, **({"If-None-Match": etag} if etag else {})}, None

    def _run(self, idx: int):
        conn, seq = None, 0
        while not self.stopped.is_set():
            quiet = self.quiet.is_set()
            kind, method, path, headers, body = self.pick(idx, seq)
            seq += 1
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
                conn.request(method, path, body=body, headers={TAG: kind, **headers})
                resp = conn.getresponse()
                resp.read()
                answer = Answer(kind, path, resp.status, {k.lower(): v for k, v in resp.getheaders()})
                if resp.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                answer = Answer(kind, path, 0, {})
                if conn is not None:
                    conn.close()
                conn = None
            with self.lock:
                self.answers.append(answer)
                if quiet and idx in self.quiet_done:
                    self.quiet_done[idx] += 1
                if kind == "apis" and answer.status == 200 and answer.headers.get("etag"):
                    self.etag = answer.headers["etag"]
            self.stopped.wait(self.pace)
        if conn is not None:
            conn.close()

    def start(self) -> "Load":
        for i in range(self.workers):
            t = threading.Thread(target=self._run, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def seen(self, pred) -> int:
        with self.lock:
            return sum(1 for a in self.answers if pred(a))

    def recent(self, n: int) -> list[Answer]:
        with self.lock:
            return self.answers[-n:]

    def stop(self):
        self.stopped.set()
        for t in self.threads:
            t.join(30)
        assert not any(t.is_alive() for t in self.threads), "a load thread hung"


class Watch:
    """A rerouted watch held open by the client until close()."""

    def __init__(self, port: int, i: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.conn.request("GET", f"{NEW_ONLY}?watch=1&timeoutSeconds=300", headers={TAG: "watch"})
        self.resp = self.conn.getresponse()  # headers only: the events keep coming
        assert self.resp.status == 200 and self.resp.getheader("x-fake-apiserver") in ("b", "c"), self.resp.status

    def close(self):
        self.conn.close()


# ---- the node --------------------------------------------------------------------------------------------

ACCESS_LOG_FORMAT = {
    "method": "%REQ(:METHOD)%", "path": "%REQ(:PATH)%", "tag": f"%REQ({TAG.upper()})%", "accept": "%REQ(ACCEPT)%",
    "code": "%RESPONSE_CODE%", "details": "%RESPONSE_CODE_DETAILS%", "flags": "%RESPONSE_FLAGS%",
    "cluster": "%UPSTREAM_CLUSTER%", "host": "%UPSTREAM_HOST%", "etag": "%RESP(ETAG)%",
    "reply": "%RESP(X-KUBE-PEER-PROXY-REPLY)%", "by": "%RESP(X-FAKE-APISERVER)%",
}


class Node:
    """Fakes a (old), b, c (new); Envoy in front of a with the given filter build and an access log with the
    fields the rules need."""

    def __init__(self, envoys, tmp: Path, wasm: Path, c_fault: str = "ok"):
        self.cluster = Cluster()
        self.a = self.cluster.start("a", apiset="old")
        self.cluster.start("b", apiset="new")
        self.cluster.start("c", apiset="new")
        self.fault("c", c_fault)
        self.port, self.admin = harness.free_port(), harness.free_port()
        self.log = tmp / "access.log"
        b = json.loads(render.render_bootstrap(
            node="a", listen_port=self.port, admin_port=self.admin, local=("127.0.0.1", self.a.port),
            peers=[(n, "127.0.0.1", self.cluster.instances[n].port) for n in "bc"], wasm_path=str(wasm),
            plugin=PLUGIN))
        self.bootstrap = b
        hcm = b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        hcm["access_log"] = [{"name": "envoy.access_loggers.file", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(self.log), "log_format": {"json_format": ACCESS_LOG_FORMAT}}}]
        self.envoy = envoys.start(json.dumps(b), "a", self.admin, concurrency=2)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def fault(self, server: str, mode: str, **extra):
        inst = self.cluster.instances[server]
        r = request(f"{inst.url}/__fake/fault", "POST", body=json.dumps({"discovery": mode, **extra}).encode())
        assert r.status == 200, r

    def stats(self) -> dict[str, int]:
        return self.envoy.stats()

    def counters(self) -> dict[str, int]:
        return {k.removeprefix("wasmcustom."): v for k, v in self.stats().items() if k.startswith("wasmcustom.")}

    def flushed_log(self, expected: int) -> list[dict]:
        """The access log once it holds `expected` lines: Envoy writes it from a buffer every 10 s (and a
        stop through func-e loses the buffer), so /reopen_logs makes it write now."""
        req = urllib.request.Request(f"{self.envoy.admin_url}/reopen_logs", method="POST")
        with urllib.request.urlopen(req, timeout=5) as r:
            assert r.status == 200

        def lines():
            return self.log.read_text().splitlines() if self.log.exists() else []
        harness.wait_until(lambda: len(lines()) >= expected, 15,
                           message=f"the access log did not reach {expected} lines ({len(lines())})")
        out = [json.loads(line) for line in lines()]
        assert len(out) == expected, f"{len(out)} access-log lines, Envoy counted {expected} requests"
        return out

    def wait_idle(self, active: int = 0, timeout: float = 20) -> float:
        """Bounded wait until exactly `active` client streams (rerouted watches) remain, each with its one
        upstream request, and no other request is in flight upstream (discovery fetches included). Returns
        when that was seen: every request the fakes received before then was finished at Envoy."""
        def idle():
            t = time.monotonic()
            s = self.stats()
            upstream = [s.get(f"cluster.{c}.upstream_rq_active", 0) for c in ("local", "peer-b", "peer-c")]
            return s.get("http.apiserver.downstream_rq_active") == active and upstream[0] == 0 \
                and sum(upstream) == active and t
        return harness.wait_until(idle, timeout, interval=0.05, message=f"not idle with {active} streams open")

    def close(self):
        self.cluster.stop_all()


# ---- the rules ----------------------------------------------------------------------------------------

def labels(name: str) -> tuple[str, dict[str, str]]:
    base, *pairs = name.split(";")
    return base, dict(p.split("=", 1) for p in pairs)


def metric(counters: dict[str, int], base: str, *keys: str) -> Counter:
    out: Counter = Counter()
    for name, value in counters.items():
        b, l = labels(name)
        if b == base and value:
            out[tuple(l.get(k, "") for k in keys)] += value
    return out


def gvr(path: str) -> tuple[str, str, str]:
    parts = path.split("?")[0].strip("/").split("/")
    group, version, rest = (parts[1], parts[2], parts[3:]) if parts[0] == "apis" else ("", parts[1], parts[2:])
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]
    return group, version, rest[0] if rest else ""


def is_reply(e: dict) -> bool:
    return e.get("reply") == "true"


def rerouted(e: dict) -> bool:
    return str(e.get("cluster") or "").startswith("peer-")


def answered(e: dict) -> bool:
    """A rerouted request whose answer the filter saw: a response (code not 0) while its VM was alive."""
    return rerouted(e) and e["code"] != 0 and e["details"] != "wasm_fail_stream"


def crosscheck(counters: dict[str, int], stats: dict[str, int], lines: list[dict], fakes: FakeRecord, t_cut: float,
               own_etags: dict[tuple[str, str], str], traps: int, vm_failures_logged: int) -> list[str]:
    """Every disagreement between a metric and its independent count (the rules of the module docstring).
    `t_cut`: when Envoy was seen idle (Node.wait_idle); the fetches after it are not finished yet (and
    cannot fail: by then every fake is up and without fault)."""
    bad = []

    def same(what: str, got: Counter, want: Counter):
        got, want = +got, +want
        if got != want:
            diff = {k: (got.get(k, 0), want.get(k, 0)) for k in sorted(set(got) | set(want), key=str)
                    if got.get(k, 0) != want.get(k, 0)}
            bad.append(f"{what}: metric vs independent count differ {diff}")

    base = "kube_peer_proxy_"
    # rerouted_request_total
    want: Counter = Counter()
    for e in lines:
        if answered(e):
            code = 404 if is_reply(e) and e.get("host") else e["code"]
            want[(str(code), *gvr(e["path"]))] += 1
    same("rerouted_request_total{code,group,version,resource}",
         metric(counters, base + "rerouted_request_total", "code", "group", "version", "resource"), want)
    # peer_proxy_errors_total
    want = Counter()
    for e in lines:
        if is_reply(e) and e["code"] == 503:
            want[("guarded_not_found" if e.get("host") else "peer_unavailable", *gvr(e["path"]))] += 1
        elif (rerouted(e) and e["code"] >= 500 and not is_reply(e)
              and e["details"] not in ("via_upstream", "wasm_fail_stream")):
            want[("upstream_unreachable", *gvr(e["path"]))] += 1
    same("peer_proxy_errors_total{type,group,version,resource}",
         metric(counters, base + "peer_proxy_errors_total", "type", "group", "version", "resource"), want)
    # merged_discovery_responses_total
    want = Counter()
    for e in lines:
        own = own_etags.get((e["path"], e.get("accept") or ""))
        if e["method"] == "GET" and e["path"] in ("/apis", "/api") and e["code"] in (200, 304) \
                and e.get("etag") and e["etag"] != own:
            doc = "apis_legacy" if "apidiscovery" not in (e.get("accept") or "") else e["path"].lstrip("/")
            want[(doc, str(e["code"]))] += 1
    same("merged_discovery_responses_total{doc,code}",
         metric(counters, base + "merged_discovery_responses_total", "doc", "code"), want)
    # discovery_sync_errors_total
    want = Counter()
    for f in fakes.fetches():
        if f.t >= t_cut:
            continue
        if f.fault == "timeout":
            want[(f.server, "timeout")] += 1  # held until Envoy gave up (the scenario waits for that)
        elif not f.answered:
            want[(f.server, "unreachable")] += 1  # dropped by a stopping fake: Envoy's own 503, no answer
        elif f.fault in ("500", "401"):
            want[(f.server, "http_status")] += 1
        elif f.fault == "malformed":
            want[(f.server, "decode")] += 1
    for peer in ("b", "c"):
        ejected = stats.get(f"cluster.peer-{peer}.upstream_rq_pending_failure_eject", 0)
        uf = sum(1 for e in lines if e.get("cluster") == f"peer-{peer}" and "UF" in (e.get("flags") or ""))
        want[(peer, "unreachable")] += ejected - uf
    got = Counter()
    for (server, kind), v in metric(counters, base + "discovery_sync_errors_total", "server", "type").items():
        got[(server, "unreachable" if kind == "reset" else kind)] += v
    same("discovery_sync_errors_total{server,type} (reset counted with unreachable)", got, want)
    # VM reloads
    reloads = {k: stats.get(f"wasm.kube-peer-proxy.vm_reload_{k}", 0) for k in ("success", "failure")}
    trap_lines = sum(1 for e in lines if e.get("tag") == "trap" and e["code"] == 503)
    if not (reloads["success"] == traps == vm_failures_logged == trap_lines and reloads["failure"] == 0):
        bad.append(f"vm_reload: success {reloads['success']}, failure {reloads['failure']}; traps sent {traps}, "
                   f"VM failures in Envoy's log {vm_failures_logged}, trap lines answered 503 {trap_lines}")
    discovery_reloads = sum(stats.get(f"wasm.kube-peer-proxy-discovery.vm_reload_{k}", 0) for k in ("success", "failure"))
    if discovery_reloads:
        bad.append(f"the discovery VM reloaded {discovery_reloads} times; no trap reached it")
    return bad


def gauges_at_cut(counters: dict[str, int], fakes: FakeRecord, t_cut: float) -> list[str]:
    """The gauges against the fakes' last successful discovery answer (fault "ok")."""
    bad = []
    for server in "abc":
        last = max((f.t for f in fakes.fetches() if f.server == server and f.fault == "ok" and f.answered),
                   default=None)
        age = t_cut - last if last is not None else float("inf")
        fresh = counters.get(f"kube_peer_proxy_server_fresh;server={server}")
        gauge_age = counters.get(f"kube_peer_proxy_server_last_success_age_seconds;server={server}")
        if fresh != (1 if age < STALENESS else 0):
            bad.append(f"server_fresh{{{server}}} = {fresh}, last successful answer {age:.1f} s before the cut")
        # rounds every REFRESH (one may be under way), the gauge in whole seconds
        if gauge_age is None or abs(gauge_age - age) > 2 * REFRESH + 1:
            bad.append(f"server_last_success_age_seconds{{{server}}} = {gauge_age}, the fakes say {age:.1f} s")
    last_round = max((f.t for f in fakes.fetches()), default=0.0)
    snapshot_age = counters.get("kube_peer_proxy_snapshot_age_seconds")
    if snapshot_age is None or snapshot_age > 2 or t_cut - last_round > 2:
        bad.append(f"snapshot_age_seconds = {snapshot_age}, last fetch {t_cut - last_round:.1f} s before the cut")
    return bad


def vm_failures(envoy) -> int:
    """VM traps in Envoy's log (`Function: proxy_on_request_headers failed: Uncaught RuntimeError: ...`)."""
    # Envoy's stderr is in envoy.log and in func-e's own copy: count in each file, not in both.
    return max((p.read_text(errors="replace").count("Function: proxy_on_request_headers failed")
                for p in envoy._log_files() if p.exists()), default=0)


def own_etags(node: Node) -> dict[tuple[str, str], str]:
    """The local server's own ETag of each root discovery document the load asks for."""
    out = {}
    for path, accept in (("/apis", V2), ("/api", V2), ("/apis", "application/json")):
        r = request(f"{node.a.url}{path}", headers={"Accept": accept})
        assert r.status == 200, r
        out[(path, accept)] = r.headers.get("etag", "")
    return out


# ---- the tests -----------------------------------------------------------------------------------------

def test_every_alerting_metric_matches_an_independent_count(envoys, tmp_path, variants, monkeypatch):
    fakes = FakeRecord(monkeypatch)
    node = Node(envoys, tmp_path, variants("trap"), c_fault="401")  # c's API set stays unknown at first
    load, watches = None, []
    try:
        envoy = node.envoy
        envoy.wait_fresh(["a", "b"], 20)
        routes = node.bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
            "typed_config"]["route_config"]
        assert "retry_policy" not in json.dumps(routes), "the rules below assume Envoy never retries"
        load = Load(node.port).start()

        # c unknown: a type nobody is known to serve is guarded (503), not a 404 that might be false.
        harness.wait_until(lambda: load.seen(lambda a: a.kind == "nowhere" and a.status == 503
                                             and a.headers.get("x-kube-peer-proxy-reply") == "true") >= 3, 20,
                           message="no guarded 404")
        node.fault("c", "ok")
        harness.wait_until(lambda: load.seen(lambda a: a.kind == "reroute" and a.headers.get("x-fake-apiserver") == "c")
                           >= 3, 20, message="c never served a reroute after its API set was learned")

        # discovery faults on c, each until the fakes answered at least two fetches with it
        for mode in ("500", "malformed", "timeout"):
            node.fault("c", mode)
            harness.wait_until(lambda: sum(1 for f in fakes.fetches() if f.server == "c" and f.fault == mode) >= 2,
                               20, message=f"no fetch under fault {mode}")
        node.fault("c", "ok")
        # every request c holds (fetches and the guard's questions) timed out at Envoy before c stops below
        held = sum(1 for d in fakes.discovery if d.server == "c" and d.fault == "timeout")
        harness.wait_until(lambda: node.stats().get("cluster.peer-c.upstream_rq_timeout", 0) >= held, 20,
                           message=f"Envoy did not time out the {held} requests c holds")

        # b stops with a rerouted request in flight (b holds its answer), then rerouted requests to b cannot
        # connect until the filter marks b down
        load.quiet_on()
        node.fault("b", "ok", delay_ms=10_000, paths=[GV_PATH])
        slow_answers: list[int] = []

        def slow():
            for _ in range(40):  # rerouted to b or c at random; c answers at once
                r = request(node.url(GV_PATH), headers={TAG: "slow"}, timeout=20)
                slow_answers.append(r.status)
                if r.headers.get("x-fake-apiserver") != "c":
                    return
        slow_thread = threading.Thread(target=slow, daemon=True)
        slow_thread.start()
        harness.wait_until(lambda: fakes.tagged("b", "slow"), 20, message="the slow request never reached b")
        b_port = node.cluster.instances["b"].port
        node.cluster.instances["b"].stop()
        slow_thread.join(30)
        assert not slow_thread.is_alive() and slow_answers[-1] == 503, slow_answers
        harness.wait_until(lambda: node.stats().get("cluster.peer-b.upstream_cx_connect_fail", 0) >= 1, 20,
                           message="no connect failure to b")
        # then c too: what only b and c serve gets the filter's own 503
        c_port = node.cluster.instances["c"].port
        node.cluster.instances["c"].stop()
        harness.wait_until(lambda: load.seen(lambda a: a.kind == "reroute" and a.status == 503
                                             and a.headers.get("x-kube-peer-proxy-reply") == "true") >= 3, 20,
                           message="no peer_unavailable 503")
        # b down longer than staleness_limit: not fresh (checked against the fakes' record below)
        harness.wait_until(lambda: node.counters().get("kube_peer_proxy_server_fresh;server=b") == 0, 20,
                           message="b never went stale")
        t_stale = time.monotonic()
        node.cluster.start("b", b_port, apiset="new")
        node.cluster.start("c", c_port, apiset="new")
        harness.wait_until(lambda: {a.headers.get("x-fake-apiserver") for a in load.recent(60)
                                    if a.kind == "reroute" and a.status == 200} == {"b", "c"}, 30,
                           message="reroutes did not resume to both b and c")
        load.quiet.clear()

        # two VM traps, each after the previous VM was reloaded (fresh connections reach both workers)
        traps = 0
        for _ in range(2):
            r = request(node.url(COMMON), headers={TAG: "trap", **{f"x-pad-{i}": "x" for i in range(TRAP_HEADERS)}})
            assert r.status == 503, r
            traps += 1
            harness.wait_until(lambda: request(node.url(COMMON), headers={TAG: "probe"}).status == 200 and
                               node.stats().get("wasm.kube-peer-proxy.vm_reload_success", 0) >= traps, 20,
                               interval=0.05, message=f"no VM reload after trap {traps}")

        watches += [Watch(node.port, i) for i in range(WATCHES)]
        load.stop()

        # The control, in the same run: the counter read while rerouted watches are open (as make upgrade-k8s
        # read it) disagrees with the log of ended streams by exactly those watches.
        node.wait_idle(active=WATCHES)
        early = node.counters()
        early_lines = node.flushed_log(node.stats()["http.apiserver.downstream_rq_total"] - WATCHES)
        early_metric = sum(metric(early, "kube_peer_proxy_rerouted_request_total", "code").values())
        early_log = sum(1 for e in early_lines if answered(e))
        assert early_metric - early_log == WATCHES, (early_metric, early_log)

        # The cut.
        for w in watches:
            w.close()
        t_cut = node.wait_idle(active=0)
        counters, stats = node.counters(), node.stats()
        lines = node.flushed_log(stats["http.apiserver.downstream_rq_total"])
        assert sum(1 for e in lines if e.get("tag") == "watch" and rerouted(e) and e["code"] == 200) == WATCHES

        bad = crosscheck(counters, stats, lines, fakes, t_cut, own_etags(node), traps, vm_failures(envoy))
        bad += gauges_at_cut(counters, fakes, t_cut)
        # fresh went 0 only after staleness_limit without a successful answer from b
        last_b = max(f.t for f in fakes.fetches() if f.server == "b" and f.fault == "ok" and f.answered
                     and f.t < t_stale)
        if t_stale - last_b < STALENESS:
            bad.append(f"server_fresh{{b}} was 0 {t_stale - last_b:.1f} s after b's last successful answer")
        # retries: none configured, none made, no peer got more rerouted requests than lines were sent to it
        retries = {k: v for k, v in stats.items() if k.endswith("upstream_rq_retry") and v}
        if retries:
            bad.append(f"Envoy retried: {retries}")
        for peer in "bc":
            sent = [e for e in lines if e.get("cluster") == f"peer-{peer}" and e.get("tag")
                    and not any(f in (e.get("flags") or "") for f in RETRY_FLAGS)]
            # reset in flight (or given up by the client): the peer may or may not have read the request
            reset = sum(1 for e in sent if any(f in (e.get("flags") or "") for f in ("UC", "UR", "DC"))
                        or e["code"] == 0)
            got = sum(1 for r in fakes.received if r.server == peer and r.tag)
            if not len(sent) - reset <= got <= len(sent):
                bad.append(f"peer {peer} received {got} rerouted requests, the log sent {len(sent)} ({reset} reset)")

        def by(base, *keys):
            return {"/".join(k): v for k, v in sorted(metric(counters, base, *keys).items())}
        summary = {
            "lines": len(lines),
            "rerouted": sum(metric(counters, "kube_peer_proxy_rerouted_request_total", "code").values()),
            "rerouted_by_code": by("kube_peer_proxy_rerouted_request_total", "code"),
            "errors": by("kube_peer_proxy_peer_proxy_errors_total", "type"),
            "merged": by("kube_peer_proxy_merged_discovery_responses_total", "doc", "code"),
            "sync_errors": by("kube_peer_proxy_discovery_sync_errors_total", "server", "type"),
            "vm_reload_success": stats.get("wasm.kube-peer-proxy.vm_reload_success"),
            "wasm_fail_stream_lines": sum(1 for e in lines if e["details"] == "wasm_fail_stream"),
            "rerouted_lines_vm_failed": sum(1 for e in lines if rerouted(e) and e["details"] == "wasm_fail_stream"),
            "early (open watches)": (early_metric, early_log),
        }
        print(f"\ncrosscheck: {json.dumps(summary)}")
        assert not bad, "\n".join(bad)
        # the scenario exercised what the rules are about
        for key, want in (("peer_unavailable", 1), ("guarded_not_found", 1), ("upstream_unreachable", 2)):
            assert summary["errors"].get(key, 0) >= want, summary["errors"]
        assert {k.split("/")[1] for k in summary["sync_errors"]} >= {"http_status", "decode", "timeout", "unreachable"}
        assert {"apis/304", "apis_legacy/200", "api/200", "apis/200"} <= set(summary["merged"]), summary["merged"]
    finally:
        for w in watches:
            w.close()
        if load is not None and not load.stopped.is_set():
            load.stop()
        node.close()


def test_crosscheck_catches_a_filter_that_loses_counts(envoys, tmp_path, variants, monkeypatch):
    """The control: the same check on a filter whose counter increments are dropped one in five must fail."""
    fakes = FakeRecord(monkeypatch)
    node = Node(envoys, tmp_path, variants("lossy"))
    try:
        node.envoy.wait_fresh(["a", "b", "c"], 20)
        load = Load(node.port).start()
        try:
            harness.wait_until(lambda: load.seen(lambda a: a.kind == "reroute" and a.status == 200) >= 40, 30,
                               message="too few reroutes")
        finally:
            load.stop()
        t_cut = node.wait_idle()
        counters, stats = node.counters(), node.stats()
        lines = node.flushed_log(stats["http.apiserver.downstream_rq_total"])
        bad = crosscheck(counters, stats, lines, fakes, t_cut, own_etags(node), 0, 0)
        print("\nthe lossy filter:", *bad, sep="\n  ")
        assert any(b.startswith("rerouted_request_total") for b in bad), bad
    finally:
        node.close()
