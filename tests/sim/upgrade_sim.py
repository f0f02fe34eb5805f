#!/usr/bin/env python3
"""Rolling-upgrade simulation: zero false 404s, measured (issue 5).

    python tests/sim/upgrade_sim.py --duration 90 --mode both      # make upgrade-sim

Topology per mode (everything on 127.0.0.1):

    loadgen (own process) ──► front LB (Envoy, round robin, members from a file)
                                 ├─► Envoy a ─► apiserver a    filter mode: the kube-peer-proxy filter in
                                 ├─► Envoy b ─► apiserver b    each Envoy (peers: the other two apiservers);
                                 └─► Envoy c ─► apiserver c    control mode: the same Envoys without it.

The fake apiservers share one object store (etcd). All start "old" (1.33 API set); at fixed offsets the
schedule upgrades a, then b, then c to "new" (1.37-dev set), one at a time:

    take its Envoy out of the front LB → stop → pause 1–3 s (seeded) → start as new → wait for ready → put back

"ready" = the new server answers /readyz through its Envoy, at least SETTLE seconds have passed since it
started (2× the discovery refresh interval plus slack) and, in filter mode, every Envoy's discovery has
fetched the new server twice (the round that learned it has been published). Both modes run the identical
schedule (same seed, same pauses, same settle time).

The load generator runs for a fixed duration with bounded concurrency (worker threads with keep-alive
connections, paced to --rate) plus long watches, over old-only, new-only and common GVRs; see loadgen.py.
Every response is classified against the serving timeline (see classify.py) and the table printed. The
filter run must show 0 false 404s and 0 lost writes, the control run must show false 404s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for _p in (ROOT / "tests", ROOT / "envoy", ROOT / "tests" / "e2e"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import harness  # noqa: E402
import render  # noqa: E402
from fake_apiserver import Cluster, builtin_apiset  # noqa: E402
from fake_apiserver.store import NotFound  # noqa: E402

from sim import classify, gvrs  # noqa: E402
from sim.lb import FrontLB  # noqa: E402

NODES = ("a", "b", "c")
# Discovery settings of the filter (the same as the e2e tests'): a round every 500 ms.
PLUGIN = {"refresh_interval": "500ms", "fetch_timeout": "1s", "staleness_limit": "5s"}
SETTLE = 1.5  # seconds between a server's start and "ready": ≥ 2 refresh intervals plus slack
DRAIN_GRACE = 0.3  # seconds between leaving the LB and stop, for short in-flight requests to finish
V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
SIM_NODE_HEADER = "x-kpp-sim-node"  # discovery_headers: tells which Envoy a discovery fetch came from
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Upgrade:
    server: str
    at: float  # seconds after the load started
    pause: float


def make_schedule(duration: float, seed: int) -> list[Upgrade]:
    """Upgrades of a, b, c evenly spread between a warm-up and a quiet tail; pauses 1–3 s (seeded)."""
    rng = random.Random(seed)
    warm = max(2.0, 0.1 * duration)
    tail = max(4.0, 0.15 * duration)
    span = max(0.0, duration - warm - tail)
    return [Upgrade(n, round(warm + i * span / len(NODES), 2), round(rng.uniform(1.0, 3.0), 2))
            for i, n in enumerate(NODES)]


def _get(url: str, headers: dict | None = None, timeout: float = 2.0) -> int:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with _OPENER.open(req, timeout=timeout) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


class Launcher:
    """Starts Envoys through harness.Envoy (func-e); the pytest `envoys` registry can stand in for it."""

    def __init__(self, workdir: Path, registry=None):
        self.workdir, self.registry = Path(workdir), registry
        self.started: list[harness.Envoy] = []

    def start(self, yaml: str, name: str, admin_port: int) -> harness.Envoy:
        kwargs = {"workdir": self.workdir / f"envoy-{name}", "component_log_level": "wasm:info"}
        if self.registry is not None:
            envoy = self.registry.start(yaml, name, admin_port, **kwargs)
        else:
            envoy = harness.Envoy(yaml, name, admin_port, **kwargs).start()
        self.started.append(envoy)
        return envoy

    def stop_all(self):
        for envoy in self.started:
            envoy.stop()


def _fresh_everywhere(envoy: harness.Envoy) -> bool:
    stats = envoy.stats(filter="server_fresh")
    return all(stats.get(f"wasmcustom.kube_peer_proxy_server_fresh;server={n}") == 1 for n in NODES)


def _learned(inst, nodes=NODES) -> bool:
    """Every Envoy fetched /apis from this (new) instance at least twice: the round that fetched it the
    first time has finished and its snapshot is published (rounds never overlap)."""
    counts = {n: 0 for n in nodes}
    for q in inst.requests():
        node = q["headers"].get(SIM_NODE_HEADER)
        if q["path"] == "/apis" and node in counts:
            counts[node] += 1
    return all(c >= 2 for c in counts.values())


def run_mode(mode: str, duration: float, seed: int, workdir: Path, *, registry=None, rate: float = 300,
             workers: int = 16, watchers_per_class: int = 2, drain: bool = True, log=print) -> dict:
    """One full run (setup, load + schedule, classification); returns the summary for the table."""
    assert mode in ("filter", "control")
    gvrs.check_classes()
    workdir = Path(workdir) / mode
    workdir.mkdir(parents=True, exist_ok=True)
    schedule = make_schedule(duration, seed)
    cluster = Cluster(max_events=1_000_000)
    launcher = Launcher(workdir, registry)
    timeline = classify.Timeline()
    upgrades = []
    loadgen = None
    try:
        servers = {n: cluster.start(n, apiset="old") for n in NODES}
        ports = {n: (harness.free_port(), harness.free_port()) for n in NODES}
        envoys = {}
        for n in NODES:
            listen, admin = ports[n]
            plugin = dict(PLUGIN, discovery_headers={SIM_NODE_HEADER: n})
            yaml = render.render_bootstrap(
                node=n, listen_port=listen, admin_port=admin, local=("127.0.0.1", servers[n].port),
                peers=[(p, "127.0.0.1", servers[p].port) for p in NODES if p != n],
                wasm_path=str(harness.wasm_path()), plugin=plugin, with_filter=(mode == "filter"))
            envoys[n] = launcher.start(yaml, f"{mode}-{n}", admin)
        lb = FrontLB(workdir / "lb-eds", harness.free_port(), harness.free_port())
        all_members = [ports[n][0] for n in NODES]
        lb.write(all_members)
        launcher.start(lb.bootstrap(), f"{mode}-front-lb", lb.admin_port)
        lb.set_members(all_members)
        for n in NODES:
            if mode == "filter":
                harness.wait_until(lambda n=n: _get(f"http://127.0.0.1:{ports[n][0]}/apis", {"Accept": V2}) == 200
                                   and _fresh_everywhere(envoys[n]), 20,
                                   message=f"Envoy {n}: no snapshot with all servers fresh within 20 s")
            harness.wait_until(lambda n=n: _get(f"http://127.0.0.1:{ports[n][0]}/version") == 200, 10,
                               message=f"Envoy {n} does not reach its apiserver")
        harness.wait_until(lambda: _get(f"http://127.0.0.1:{lb.listen_port}/version") == 200, 10,
                           message="front LB does not answer")
        t_setup = time.monotonic()
        for n in NODES:
            timeline.begin("running", n, "old", t_setup - 1e6)
            timeline.begin("service", n, "old", t_setup - 1e6)

        out = workdir / "loadgen.json"
        cfg = {"port": lb.listen_port, "duration": duration, "rate": rate, "workers": workers,
               "watchers_per_class": watchers_per_class, "seed": seed, "run": f"{mode}{seed}",
               "gvrs": gvrs.table()}
        loadgen = subprocess.Popen([sys.executable, str(Path(__file__).with_name("loadgen.py")),
                                    "--config", json.dumps(cfg), "--out", str(out)],
                                   stdout=subprocess.PIPE, text=True)
        line = loadgen.stdout.readline()
        if not line.startswith("START "):
            raise RuntimeError(f"load generator did not start: {line!r}")
        t0 = float(line.split()[1])
        log(f"[{mode}] load started: {rate:.0f} req/s target, {workers} workers, "
            f"{watchers_per_class * len(gvrs.CLASSES)} watchers, {duration:.0f} s")

        for up in schedule:
            delay = t0 + up.at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            rec = {"server": up.server, "pause": up.pause}
            n = up.server
            rest = [ports[m][0] for m in NODES if m != n]
            rec["drain"] = time.monotonic()
            timeline.end("service", n, rec["drain"])
            if drain:
                lb.set_members(rest)
                time.sleep(DRAIN_GRACE)
            rec["stop"] = time.monotonic()
            timeline.end("running", n, rec["stop"])
            cluster.instances[n].stop()
            time.sleep(up.pause)
            inst = cluster.start(n, servers[n].port, apiset="new")
            rec["start"] = time.monotonic()
            timeline.begin("running", n, "new", rec["start"])
            harness.wait_until(lambda: _get(f"http://127.0.0.1:{ports[n][0]}/readyz") == 200, 10, 0.02,
                               message=f"{n} not ready through its Envoy")
            if mode == "filter":
                harness.wait_until(lambda: _learned(inst), 15, 0.02,
                                   message=f"not every Envoy learned the new {n} within 15 s")
                rec["learned"] = time.monotonic()
            wait = rec["start"] + SETTLE - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            rec["ready"] = time.monotonic()
            timeline.begin("service", n, "new", rec["ready"])
            if drain:
                lb.set_members(all_members)
            rec["back"] = time.monotonic()
            upgrades.append({k: (v - t0 if isinstance(v, float) and k != "pause" else v) for k, v in rec.items()})
            log(f"[{mode}] upgraded {n}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in upgrades[-1].items() if isinstance(v, float) and k != "pause")
                + f" (pause {up.pause:.2f} s)")

        rc = loadgen.wait(timeout=duration + 120)
        if rc != 0:
            raise RuntimeError(f"load generator exited with {rc}")
        result = json.loads(out.read_text())
        by_id = {g["id"]: g for g in gvrs.table()}
        deleted = set(result["deleted"])
        missing = []
        for name, gid in result["created"].items():
            if name in deleted:
                continue
            g = by_id[gid]
            key = (g["group"], g["resource"], gvrs.namespace(g["cls"]) if g["namespaced"] else "", name)
            try:
                cluster.store.get(key)
            except NotFound:
                missing.append(name)
        summary = classify.summarize(result, timeline, {"old": builtin_apiset("old"), "new": builtin_apiset("new")},
                                     missing)
        summary["upgrades"] = upgrades
        summary["mode"] = mode
        summary["workdir"] = str(workdir)
        return summary
    finally:
        if loadgen is not None and loadgen.poll() is None:
            loadgen.kill()
            loadgen.wait()
        launcher.stop_all()
        cluster.stop_all()


def schedule_table(summary: dict) -> str:
    lines = [f"[{summary['mode']}] schedule (seconds after the load started):",
             "  server   drain    stop   pause   start  learned   ready    back"]
    for u in summary["upgrades"]:
        learned = f"{u['learned']:7.2f}" if "learned" in u else "      -"
        lines.append(f"  {u['server']:>6} {u['drain']:7.2f} {u['stop']:7.2f} {u['pause']:7.2f} {u['start']:7.2f}"
                     f"  {learned} {u['ready']:7.2f} {u['back']:7.2f}")
    return "\n".join(lines)


def examples(summary: dict, limit: int = 5) -> str:
    out = []
    for rec, path in summary["false_examples"][:limit]:
        t0, t1, op, _gid, status, ra, served, nf, _st, _err = rec
        out.append(f"  {op:6} {path}  -> {status} from {served or '?'} ({nf}) at {t0:.3f}..{t1:.3f}")
    return "\n".join(out)


def verdict(summaries: dict, min_rate: float = 200.0) -> list[str]:
    """Failed requirements (empty when all hold)."""
    problems = []
    for mode, s in summaries.items():
        if s["rate"] < min_rate:
            problems.append(f"{mode}: achieved {s['rate']:.1f} req/s < {min_rate:.0f}")
        if s["hung_threads"]:
            problems.append(f"{mode}: {s['hung_threads']} client threads hung")
    if "filter" in summaries:
        s = summaries["filter"]
        if s["false_404"]:
            problems.append(f"filter: {s['false_404']} false 404s")
        if s["lost_writes"]:
            problems.append(f"filter: {s['lost_writes']} lost writes: {s['lost'][:5]}")
    if "control" in summaries and summaries["control"]["false_404"] == 0:
        problems.append("control: no false 404s (the simulation does not exercise the problem)")
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=90, help="seconds of load per mode (default 90)")
    p.add_argument("--mode", choices=("filter", "control", "both"), default="both")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--rate", type=float, default=300, help="target requests/s of all workers together")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--watchers-per-class", type=int, default=2)
    p.add_argument("--no-drain", action="store_true",
                   help="keep the upgraded server's Envoy in the front LB while it restarts")
    p.add_argument("--workdir", default=None, help="keep Envoy logs and raw results here")
    a = p.parse_args(argv)
    workdir = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="kpp-upgrade-sim-"))
    modes = ("filter", "control") if a.mode == "both" else (a.mode,)
    summaries = {}
    for mode in modes:
        summaries[mode] = run_mode(mode, a.duration, a.seed, workdir, rate=a.rate, workers=a.workers,
                                   watchers_per_class=a.watchers_per_class, drain=not a.no_drain)
    print()
    for s in summaries.values():
        print(schedule_table(s))
    print()
    print(classify.table(summaries))
    for mode, s in summaries.items():
        if s["false_examples"]:
            print(f"\n[{mode}] first false 404s:\n" + examples(s))
    problems = verdict(summaries)
    print(f"\nraw results and Envoy logs: {workdir}")
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print("PASS: " + ", ".join(f"{m}: {s['false_404']} false 404s, {s['lost_writes']} lost writes, "
                              f"{s['rate']:.0f} req/s" for m, s in summaries.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
