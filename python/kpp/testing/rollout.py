"""One node's Envoy restarted under load behind real load balancers: what clients see, measured.

    .venv/bin/python -m kpp.testing.rollout --mode both          # before (plain SIGTERM) and after (the drain)

Three nodes on 127.0.0.11-13, each a fake apiserver (a old, b and c new: a's peer-only requests are
rerouted) behind its own Envoy with the filter (the plain profile, with TLS on the client listener),
started by the static pod's own entrypoint (python/kpp/testing/static_envoy.py). In front: HAProxy with kubeadm's
HA guide configuration and an Envoy TCP proxy with active health checks (python/kpp/testing/lb.py). Load
(python/kpp/testing/lbclient.py, client-go's retries): 8 keep-alive clients at 200 req/s in total through HAProxy
(create, get, a peer-only list, a common list), 6 watches through HAProxy, and a kubectl-like client that
opens a new connection for every call through the Envoy LB. Node a's Envoy is restarted like the
kubelet restarts a static pod's container: SIGTERM, wait for exit, start again with the same bootstrap.

* mode "drain": SIGTERM to the container's first process, the manifest's script (the shipped behaviour).
* mode "plain": SIGTERM straight to Envoy, as when Envoy was the container's first process (before).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kpp import render
from kpp.testing import harness, lb, proc, static_envoy
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.kubeadm_node import mint_cert
from kpp.testing.topology import COMMON, FAST, NEW_ONLY

NODES = {"a": ("127.0.0.11", "old"), "b": ("127.0.0.12", "new"), "c": ("127.0.0.13", "new")}
RESTARTED = "a"
SNI = "kubernetes.default.svc"
NAMESPACE = "lb"
# Seconds: the longest any call may wait for its answer, retries included. Below the shortest wait a
# retry adds (a refused watch backs off 800 ms; client-go waits 1 s after a reset or EOF), so a call or
# a re-watch that waited for one fails it, while a call slowed only by the machine's load does not. With
# no retry and no failure, the 2-core machine (three Envoys, HAProxy, the clients and the fakes) saw
# 0.222 s in a CI run and 0.16-0.32 s with a CPU hog on one core (three runs, 2026-12-06): 0.5 s left
# too little room; 0.75 s still fails every wait for a retry or a back-off.
MAX_GAP = 0.75


def certs(d: Path) -> tuple[Path, Path, Path]:
    """(ca, serving cert, key): the nodes' serving certificate for the SAN clients use and every node IP."""
    ca, ca_key = mint_cert(d / "ca", "kpp-lb-test-ca", ca_crt=None, ca_key=None)
    sans = ",".join([f"DNS:{SNI}"] + [f"IP:{ip}" for ip, _ in NODES.values()])
    crt, key = mint_cert(d / "serving", "kube-apiserver", ca_crt=ca, ca_key=ca_key, eku="serverAuth", sans=sans)
    return ca, crt, key


def node_bootstrap(node: str, port: int, admin: int, servers: dict, crt: Path, key: Path) -> str:
    """render.render_bootstrap for one node, plus TLS on its client listener (the plain profile has
    none; the kubeadm profile's is the same DownstreamTlsContext with kubeadm's files)."""
    ip, _ = NODES[node]
    text = render.render_bootstrap(
        node=node, listen_port=port, admin_port=admin, local=("127.0.0.1", servers[node].port),
        peers=[(n, "127.0.0.1", servers[n].port) for n in NODES if n != node],
        wasm_path=str(harness.wasm_path()), plugin=FAST, listen_address=ip)
    b = json.loads(text)
    b["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"] = {
        "name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {
                "tls_certificates": [{"certificate_chain": {"filename": str(crt)}, "private_key": {"filename": str(key)}}],
                "alpn_protocols": ["h2", "http/1.1"]}}}
    return json.dumps(b, indent=2) + "\n"


def common_port() -> int:
    """A port free on all three node addresses."""
    for _ in range(50):
        p = harness.free_port()
        try:
            for ip, _ in NODES.values():
                with socket.socket() as s:
                    s.bind((ip, p))
            return p
        except OSError:
            continue
    raise RuntimeError("no port free on every node address")


class AcceptProbe:
    """TCP connects to one address every 20 ms: when it stops and starts accepting."""

    def __init__(self, addr):
        self.addr = addr
        self.results: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            t = time.monotonic()
            try:
                socket.create_connection(self.addr, timeout=0.5).close()
                ok = True
            except OSError:
                ok = False
            self.results.append((t, ok))
            self._stop.wait(0.02)

    def first(self, ok: bool, after: float) -> float | None:
        return next((t for t, r in list(self.results) if t >= after and r == ok), None)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        self._stop.set()
        self._thread.join(5)


def envoy_child(pid: int) -> int:
    """The pid of Envoy, the script's child."""
    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    if len(kids) != 1:
        raise RuntimeError(f"expected Envoy as the only child of {pid}, found {kids}")
    return int(kids[0])


def run(mode: str, workdir: Path, *, registry=None, duration: float | None = None, restart_at: float = 4.0,
        log=print) -> dict:
    assert mode in ("drain", "plain")
    workdir = Path(workdir) / mode
    workdir.mkdir(parents=True, exist_ok=True)
    unready, drain = static_envoy.drain_seconds()
    if duration is None:
        # The restart, the new Envoy's start and the load balancer's two checks to put it back, and a tail.
        duration = restart_at + (unready + drain if mode == "drain" else 0) + 2 * lb.RISE * lb.CHECK_INTERVAL + 8
    ca, crt, key = certs(workdir / "pki")
    cluster = Cluster(max_events=1_000_000)
    started: list[harness.Envoy] = []
    stoppers = []
    loadgen = None

    def start_envoy(env: harness.Envoy) -> harness.Envoy:
        started.append(env)
        if registry is not None:
            registry.started.append(env)
        return env.start(wait_ready=False)

    try:
        servers = {n: cluster.start(n, apiset=s) for n, (_, s) in NODES.items()}
        port = common_port()
        admins = {n: harness.free_port() for n in NODES}
        yamls = {n: node_bootstrap(n, port, admins[n], servers, crt, key) for n in NODES}
        envoys = {n: start_envoy(static_envoy.StaticPodEnvoy(yamls[n], f"{mode}-{n}", admins[n],
                                                             workdir=workdir / f"envoy-{n}", component_log_level="wasm:info"))
                  for n in NODES}
        for e in envoys.values():
            e.wait_until_ready(60)
            e.wait_snapshot(30)
        names = {f"{ip}:{port}": n for n, (ip, _) in NODES.items()}
        hap = lb.HAProxy(workdir / "haproxy", ("127.0.0.1", harness.free_port()),
                         [(n, ip, port) for n, (ip, _) in NODES.items()]).start()
        stoppers.append(hap.stop)
        elb_port, elb_admin = harness.free_port(), harness.free_port()
        elb = start_envoy(harness.Envoy(lb.render_envoy_tcp_lb(("127.0.0.1", elb_port), elb_admin,
                                                               [(n, ip, port) for n, (ip, _) in NODES.items()], ca),
                                        f"{mode}-envoy-lb", elb_admin, workdir=workdir / "envoy-lb"))
        elb.wait_until_ready(30)
        watcher = lb.EnvoyLBWatcher(elb_admin, names)
        harness.wait_until(lambda: set(watcher.poll().values()) == {"UP"} and len(watcher.poll()) == 3, 20,
                           message="the Envoy LB does not see three healthy nodes")
        watcher.start()
        stoppers.append(watcher.stop)
        # Two rounds of HAProxy's checks passed with every node up. Not observable as a condition (HAProxy
        # logs only state changes, and the guide's configuration has no stats socket), so the wait is
        # two check intervals: a node failing its checks would be logged DOWN by then (see unexpected_down).
        time.sleep(2 * lb.CHECK_INTERVAL + 0.5)
        probe = AcceptProbe((NODES[RESTARTED][0], port)).start()
        stoppers.append(probe.stop)

        out = workdir / "load.json"
        cfg = {"lb": list(hap.listen), "kubectl_lb": ["127.0.0.1", elb_port], "ca": str(ca), "sni": SNI,
               "duration": duration, "workers": 8, "rate": 200, "kubectl_interval": 0.1, "watchers": 6,
               "namespace": NAMESPACE, "peer_only": NEW_ONLY, "common": COMMON, "run": mode}
        loadgen = subprocess.Popen([sys.executable, "-m", "kpp.testing.lbclient", "--config", json.dumps(cfg), "--out", str(out)],
                                   stdout=subprocess.PIPE, text=True, preexec_fn=proc.die_with_parent(signal.SIGKILL))
        # The clients print START once their watches are open (lbclient waits up to 20 s for them).
        line = proc.read_line(loadgen.stdout, 60, "kpp.testing.lbclient")
        if not line.startswith("START "):
            raise RuntimeError(f"the clients did not start: {line!r}")
        t0 = float(line.split()[1])
        log(f"[{mode}] load started; restarting {RESTARTED}'s Envoy at +{restart_at:.0f} s of {duration:.0f} s")
        time.sleep(max(0.0, t0 + restart_at - time.monotonic()))
        old = envoys[RESTARTED]
        tl = {}
        if mode == "drain":
            tl["sigterm"] = old.terminate()
        else:
            tl["sigterm"] = time.monotonic()
            os.kill(envoy_child(old.process.pid), 15)
        old.wait_exit(60)
        tl["exited"] = old.exited_at
        new = start_envoy(static_envoy.StaticPodEnvoy(yamls[RESTARTED], f"{mode}-{RESTARTED}-new", admins[RESTARTED],
                                                      workdir=workdir / f"envoy-{RESTARTED}-new",
                                                      component_log_level="wasm:info"))
        tl["started"] = time.monotonic()
        new.wait_until_ready(60)
        new.wait_snapshot(30, at_least=1)
        tl["snapshot_seen"] = time.monotonic()
        rc = loadgen.wait(timeout=duration + 120)
        if rc != 0:
            raise RuntimeError(f"the clients exited with {rc}")
        result = json.loads(out.read_text())
        tl["stopped_accepting"] = probe.first(False, tl["sigterm"])
        tl["accepting_again"] = probe.first(True, tl["stopped_accepting"] or tl["sigterm"])
        return summarize(mode, result, tl, {"haproxy": hap.state, "envoy-lb": watcher.state}, t0)
    finally:
        if loadgen is not None:
            proc.kill_and_reap(loadgen)
        for stop in reversed(stoppers):
            stop()
        for e in started:
            e.stop()
        cluster.stop_all()


def summarize(mode: str, result: dict, tl: dict, lbs: dict, t0: float) -> dict:
    expected = {"POST": 201, "GET": 200}
    calls = [r for r in result["records"] if r[0] != "watch"]
    failed = [r for r in calls if r[5] != expected[r[1]]]
    retried = [r for r in calls if r[6] > 0]
    ok = [r for r in calls if r[5] == expected[r[1]]]
    longest = max(ok, key=lambda r: r[4] - r[3], default=None)
    stop = result["stop"]
    watch_breaks, rewatch = 0, []
    lost = 0
    deadline = stop - 1.0
    created = {n for n, t in result["created"] if t < deadline}
    for w in result["watches"]:
        streams = w["streams"]
        for s, nxt in zip(streams, streams[1:]):
            if s["ended"] < stop - 0.5:
                watch_breaks += s["end"] != "clean"
                rewatch.append(nxt["established"] - s["ended"])
        lost += len(created - set(w["names"]))
    failed_watch_requests = [r for r in result["records"] if r[0] == "watch"]
    states = {}
    for name, log in lbs.items():
        states[name] = [(round(t - t0, 3), server, state) for t, server, state, _ in log.transitions()]
    rel = {k: (round(v - t0, 3) if v else None) for k, v in tl.items()}
    back = {name: log.first(RESTARTED, "UP", tl["sigterm"]) for name, log in lbs.items()}
    down = {name: log.first(RESTARTED, "DOWN", tl["sigterm"]) for name, log in lbs.items()}
    unexpected_down = {name: [(round(t - t0, 3), s) for t, s, st, _ in log.transitions() if st == "DOWN"
                              and (s != RESTARTED or not (tl["sigterm"] <= t <= (back[name] or stop + 60)))]
                       for name, log in lbs.items()}
    return {
        "mode": mode, "calls": len(calls), "failed": len(failed), "failed_examples": failed[:5],
        "retried": len(retried), "retried_examples": retried[:5],
        "longest_gap": round(longest[4] - longest[3], 3) if longest else None,
        "longest_call": longest, "watch_streams": sum(len(w["streams"]) for w in result["watches"]),
        "watch_breaks": watch_breaks, "rewatch_max": round(max(rewatch), 3) if rewatch else 0.0,
        "watch_requests_failed": len(failed_watch_requests), "events_lost": lost, "created": len(created),
        "timeline": rel, "lb_down": {k: round(v - t0, 3) if v else None for k, v in down.items()},
        "lb_up": {k: round(v - t0, 3) if v else None for k, v in back.items()},
        "lb_states": states, "unexpected_down": unexpected_down, "hung": result["hung"],
        "rate": round(len(calls) / (stop - result["start"]), 1),
    }


def table(summaries: dict) -> str:
    rows = [("failed requests", "failed"), ("requests retried (first attempt failed)", "retried"),
            ("longest client wait, retries included (s)", "longest_gap"), ("watch streams cut", "watch_breaks"),
            ("longest re-watch (s)", "rewatch_max"), ("watch events lost", "events_lost"),
            ("requests", "calls"), ("req/s", "rate")]
    head = "| | " + " | ".join(summaries) + " |\n|---|" + "---|" * len(summaries) + "\n"
    return head + "\n".join(f"| {label} | " + " | ".join(str(s[key]) for s in summaries.values()) + " |"
                            for label, key in rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("drain", "plain", "both"), default="both")
    p.add_argument("--workdir", default=None)
    a = p.parse_args(argv)
    workdir = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="kpp-rollout-"))
    out = {}
    for mode in (("plain", "drain") if a.mode == "both" else (a.mode,)):
        out["before (plain SIGTERM)" if mode == "plain" else "after (drain)"] = s = run(mode, workdir)
        print(json.dumps({k: v for k, v in s.items() if k not in ("lb_states",)}, indent=1, default=str))
    print(table(out))
    print(f"logs: {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
