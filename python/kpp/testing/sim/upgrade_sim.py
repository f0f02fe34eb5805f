"""Rolling-upgrade simulation: zero false 404s, measured.

    .venv/bin/python -m kpp.testing.sim.upgrade_sim --duration 90 --mode both      # make upgrade-sim

Topology per mode (everything on 127.0.0.1):

    loadgen (own process) ──► front LB (Envoy, round robin, members from a file)
                                 ├─► Envoy a ─► apiserver a    filter mode: the kube-peer-proxy filter in
                                 ├─► Envoy b ─► apiserver b    each Envoy (peers: the other two apiservers);
                                 └─► Envoy c ─► apiserver c    control mode: the same Envoys without it.

The fake apiservers share one object store (etcd). All start "old" (1.33 API set); at fixed offsets the
schedule upgrades a, then b, then c to "new" (1.37-dev set), one at a time:

    take its Envoy out of the front LB → stop → pause 1–3 s (seeded) → start as new → wait until it is
    in service → put its Envoy back

"in service" = the server is ready (its /readyz answers 200 through its Envoy) and its discovery answers
(a direct GET /apis on it answers 200); it ends when the server is stopped. The definition is the same in
both modes and asks nothing of the filter. Both modes run the identical schedule (same seed, same pauses).
In filter mode, the moment every Envoy's discovery has learned the new server is measured too ("learned",
informational only).

The load generator runs for a fixed duration with bounded concurrency (worker threads with keep-alive
connections, paced to --rate) plus long watches, over old-only, new-only and common GVRs; see loadgen.py.
Every response is classified against the serving timeline (see classify.py) and the table printed. The
filter run must show 0 false 404s (also none while a server was starting), 0 lost writes, no wasm VM
panic, and an availability of at least --min-availability per resource class (2xx for GVRs some in-service
server serves, outside one refresh interval after each change); the control run must show false 404s.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kpp import render
from kpp.testing import harness, mutants, proc
from kpp.testing.fake_apiserver import Cluster, builtin_apiset
from kpp.testing.fake_apiserver.store import NotFound
from kpp.testing.sim import classify, gvrs
from kpp.testing.sim.lb import FrontLB

NODES = ("a", "b", "c")
# Discovery settings of the filter (the same as the e2e tests'): a round every 500 ms.
PLUGIN = {"refresh_interval": "500ms", "fetch_timeout": "1s", "staleness_limit": "5s"}
# Availability floor per resource class for the filter run (percent); see README.md for how it was chosen.
MIN_AVAILABILITY = 98.0
MODES = ("filter", "control") + tuple(f"mutant-{k}" for k in mutants.KINDS)
# Filter rules beyond availability (filter_rules()). Measured: client-visible 503s 0.8 % of the requests
# in the 90 s run, 3.5 % in the 18 s test (the same three restarts in a fifth of the time); rerouted
# requests answered 5xx (a peer that just stopped, before the passive mark): about 1 %.
MAX_503_SHARE = 0.06            # client-visible 503s / requests
MAX_NO_RESPONSE_SHARE = 0.005   # requests without any response (connection errors, timeouts) / requests
MAX_REROUTE_FAILED_SHARE = 0.03  # rerouted requests answered 5xx / rerouted requests (the filter's count)
MAX_REROUTE_FAILED_FLOOR = 5
# What a response may be with the filter; anything else is a failure (see classify.py for the meanings).
FILTER_OUTCOMES = {"2xx", "404 genuine", "404 object not found", classify.F503, classify.E503}
DRAIN_GRACE = 0.3  # seconds between leaving the LB and stop, for short in-flight requests to finish
V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
SIM_NODE_HEADER = "x-kpp-sim-node"  # discovery_headers: tells which Envoy a discovery fetch came from


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


def seconds(duration: str) -> float:
    """A plugin duration ("500ms", "5s") in seconds."""
    return float(duration[:-2]) / 1000 if duration.endswith("ms") else float(duration[:-1])


def in_service(envoy_port: int, server_port: int) -> bool:
    """The definition of "in service", the same in both modes: /readyz answers through the server's
    Envoy and a direct GET /apis on the server answers."""
    return (proc.status(f"http://127.0.0.1:{envoy_port}/readyz") == 200
            and proc.status(f"http://127.0.0.1:{server_port}/apis", {"Accept": V2}) == 200)


def wasm_panics(envoy: harness.Envoy) -> int:
    """Panics of the filter's wasm VM in one Envoy's log (each one fails that VM's requests until reload)."""
    counts = [p.read_text(errors="replace").count("panicked at") for p in envoy._log_files() if p.exists()]
    return max(counts, default=0)


def _fresh_everywhere(envoy: harness.Envoy) -> bool:
    stats = envoy.stats(filter="server_fresh")
    return all(stats.get(f"wasmcustom.kube_peer_proxy_server_fresh;server={n}") == 1 for n in NODES)


def _learned(inst, nodes=NODES) -> bool:
    """Every Envoy fetched /apis from this (new) instance at least twice: the round that fetched it the
    first time has finished and its snapshot is published (rounds never overlap). Informational only."""
    counts = {n: 0 for n in nodes}
    for q in inst.requests():
        node = q["headers"].get(SIM_NODE_HEADER)
        if q["path"] == "/apis" and node in counts:
            counts[node] += 1
    return all(c >= 2 for c in counts.values())


def run_mode(mode: str, duration: float, seed: int, workdir: Path, *, registry=None, rate: float = 300,
             workers: int = 16, watchers_per_class: int = 2, drain: bool = True, plugin: dict | None = None,
             log=print) -> dict:
    """One full run (setup, load + schedule, classification); returns the summary for the table."""
    assert mode in MODES, mode
    filtered = mode != "control"
    mutant = mode.removeprefix("mutant-") if mode.startswith("mutant-") else None
    gvrs.check_classes()
    workdir = Path(workdir) / mode
    workdir.mkdir(parents=True, exist_ok=True)
    schedule = make_schedule(duration, seed)
    plugin_cfg = dict(PLUGIN, **(plugin or {}))
    grace = seconds(plugin_cfg["refresh_interval"])
    if seconds(plugin_cfg["staleness_limit"]) < grace:  # the filter requires staleness_limit ≥ refresh_interval
        plugin_cfg["staleness_limit"] = plugin_cfg["refresh_interval"]
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
            plugin = dict(plugin_cfg, discovery_headers={SIM_NODE_HEADER: n})
            yaml = render.render_bootstrap(
                node=n, listen_port=listen, admin_port=admin, local=("127.0.0.1", servers[n].port),
                peers=[(p, "127.0.0.1", servers[p].port) for p in NODES if p != n],
                wasm_path=str(harness.wasm_path()), plugin=plugin, with_filter=filtered)
            if mutant:
                yaml = mutants.mutate(yaml, mutant)
            envoys[n] = launcher.start(yaml, f"{mode}-{n}", admin)
        lb = FrontLB(workdir / "lb-eds", harness.free_port(), harness.free_port())
        all_members = [ports[n][0] for n in NODES]
        lb.write(all_members)
        launcher.start(lb.bootstrap(), f"{mode}-front-lb", lb.admin_port)
        lb.set_members(all_members)
        for n in NODES:
            if filtered:
                harness.wait_until(lambda n=n: proc.status(f"http://127.0.0.1:{ports[n][0]}/apis", {"Accept": V2}) == 200
                                   and _fresh_everywhere(envoys[n]), 20,
                                   message=f"Envoy {n}: no snapshot with all servers fresh within 20 s")
            harness.wait_until(lambda n=n: proc.status(f"http://127.0.0.1:{ports[n][0]}/version") == 200, 10,
                               message=f"Envoy {n} does not reach its apiserver")
        harness.wait_until(lambda: proc.status(f"http://127.0.0.1:{lb.listen_port}/version") == 200, 10,
                           message="front LB does not answer")
        t_setup = time.monotonic()
        for n in NODES:
            timeline.begin("running", n, "old", t_setup - 1e6)
            timeline.begin("service", n, "old", t_setup - 1e6)
            if not in_service(ports[n][0], servers[n].port):
                raise RuntimeError(f"{n} is not in service at the start")

        out = workdir / "loadgen.json"
        cfg = {"port": lb.listen_port, "duration": duration, "rate": rate, "workers": workers,
               "watchers_per_class": watchers_per_class, "seed": seed, "run": f"{mode}{seed}",
               "gvrs": gvrs.table()}
        loadgen = subprocess.Popen([sys.executable, "-m", "kpp.testing.sim.loadgen",
                                    "--config", json.dumps(cfg), "--out", str(out)],
                                   stdout=subprocess.PIPE, text=True, preexec_fn=proc.die_with_parent(signal.SIGKILL))
        # loadgen.py prints START before its threads start; one that hangs before it fails here, bounded.
        line = proc.read_line(loadgen.stdout, 60, "kpp.testing.sim.loadgen")
        if not line.startswith("START "):
            raise RuntimeError(f"load generator did not start: {line!r}")
        t0 = float(line.split()[1])
        t0_wall = time.time() - (time.monotonic() - t0)  # to find the moments in the Envoy logs
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
            if drain:
                timeline.change(rec["drain"])
                lb.set_members(rest)
                time.sleep(DRAIN_GRACE)
            rec["stop"] = time.monotonic()
            timeline.end("service", n, rec["stop"])
            timeline.end("running", n, rec["stop"])
            cluster.instances[n].stop()
            time.sleep(up.pause)
            inst = cluster.start(n, servers[n].port, apiset="new")
            rec["start"] = time.monotonic()
            timeline.begin("running", n, "new", rec["start"])
            harness.wait_until(lambda: in_service(ports[n][0], inst.port), 10, 0.02,
                               message=f"{n} not in service (/readyz through its Envoy, /apis directly)")
            rec["ready"] = time.monotonic()
            timeline.begin("service", n, "new", rec["ready"])
            if drain:
                lb.set_members(all_members)
            rec["back"] = time.monotonic()
            if drain:
                timeline.change(rec["back"])
            if filtered:  # measured, not waited for before "ready" or "back"
                harness.wait_until(lambda: _learned(inst), 15, 0.02,
                                   message=f"not every Envoy learned the new {n} within 15 s")
                rec["learned"] = time.monotonic()
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
        unanswered = set(result["delete_unanswered"])
        missing = []
        for name, gid in result["created"].items():
            if name in deleted:
                continue
            g = by_id[gid]
            key = (g["group"], g["resource"], gvrs.namespace(g["cls"]) if g["namespaced"] else "", name)
            try:
                cluster.store.get(key)
            except NotFound:
                if name not in unanswered:  # a delete without a verdict may have been applied
                    missing.append(name)
        summary = classify.summarize(result, timeline, {"old": builtin_apiset("old"), "new": builtin_apiset("new")},
                                     missing, grace)
        summary["wasm_panics"] = sum(wasm_panics(envoys[n]) for n in NODES) if filtered else None
        # rerouted requests by the response code the filter saw (its own counter, summed over the Envoys)
        rerouted: dict[str, int] = {}
        if filtered:
            for n in NODES:
                for k, v in envoys[n].stats("rerouted_request_total").items():
                    code = k.rsplit("code=", 1)[-1].split(";")[0] if "code=" in k else "?"
                    rerouted[code] = rerouted.get(code, 0) + v
        summary["rerouted_codes"] = rerouted
        summary["upgrades"] = upgrades
        summary["t0"], summary["t0_wall"] = t0, t0_wall
        summary["mode"] = mode
        summary["workdir"] = str(workdir)
        return summary
    finally:
        if loadgen is not None:
            proc.kill_and_reap(loadgen)
        launcher.stop_all()
        cluster.stop_all()


def schedule_table(summary: dict) -> str:
    started = time.strftime("%H:%M:%S", time.gmtime(summary["t0_wall"])) + f"{summary['t0_wall'] % 1:.3f}"[1:]
    lines = [f"[{summary['mode']}] schedule (seconds after the load started, at {started} UTC):",
             "  server   drain    stop   pause   start   ready    back  learned (informational)"]
    for u in summary["upgrades"]:
        learned = f"{u['learned']:7.2f}" if "learned" in u else "      -"
        lines.append(f"  {u['server']:>6} {u['drain']:7.2f} {u['stop']:7.2f} {u['pause']:7.2f} {u['start']:7.2f}"
                     f" {u['ready']:7.2f} {u['back']:7.2f}  {learned}")
    return "\n".join(lines)


def examples(summary: dict, limit: int = 5, key: str = "false_examples") -> str:
    """False 404s (or, with key="unavailable_examples", judged requests that did not get a 2xx)."""
    out = []
    for rec, path, outcome in summary[key][:limit]:
        t0, t1, op, _gid, status, _ra, served, nf, _st, err, message = rec
        what = f"{status} from {served or 'Envoy'}" if status else f"no response ({err})"
        t0, t1 = t0 - summary["t0"], t1 - summary["t0"]
        out.append(f"  {op:6} {path}  -> {what} {nf} [{outcome}] at {t0:.3f}..{t1:.3f} s {message[:80]!r}")
    return "\n".join(out)


def filter_rules(s: dict, min_rate: float = 200.0, min_availability: float = MIN_AVAILABILITY) -> list[str]:
    """What a run with the filter must show; each failure is one line. Applied to the control (no
    filter) and to the mutants (kpp.testing.mutants) it must fail (tests/e2e/test_upgrade_sim.py)."""
    m = s["mode"]
    problems = []
    if s["rate"] < min_rate:
        problems.append(f"{m}: achieved {s['rate']:.1f} req/s < {min_rate:.0f}")
    if s["hung_threads"]:
        problems.append(f"{m}: {s['hung_threads']} client threads hung")
    if s["false_404"]:
        problems.append(f"{m}: {s['false_404']} false 404s")
    if s["starting_404"]:
        problems.append(f"{m}: {s['starting_404']} 404s for a GVR a starting server served")
    if s["wasm_panics"]:
        problems.append(f"{m}: {s['wasm_panics']} wasm VM panics (see the Envoy logs)")
    for cls, pct in s["availability"].items():
        if pct is not None and pct < min_availability:
            problems.append(f"{m}: availability of {cls} {pct:.2f}% < {min_availability:.1f}%")
    if s["lost_writes"]:
        problems.append(f"{m}: {s['lost_writes']} lost writes: {s['lost'][:5]}")
    outcomes = s["outcomes"] + s["watch_outcomes"]
    unexpected = {k: v for k, v in outcomes.items() if k not in FILTER_OUTCOMES and not k.startswith("no response")}
    if unexpected:
        problems.append(f"{m}: answers a filter run must not give: {unexpected}")
    total = max(1, s["requests"])
    n503 = sum(v for k, v in outcomes.items() if k.startswith("503"))
    if n503 > MAX_503_SHARE * total:
        problems.append(f"{m}: {n503} client-visible 503s (> {MAX_503_SHARE:.0%} of {total} requests)")
    none = sum(v for k, v in outcomes.items() if k.startswith("no response"))
    if none > MAX_NO_RESPONSE_SHARE * total:
        problems.append(f"{m}: {none} requests got no response (> {MAX_NO_RESPONSE_SHARE:.1%} of {total})")
    codes = s.get("rerouted_codes") or {}
    ok = sum(v for k, v in codes.items() if k.isdigit() and (int(k) < 400 or int(k) == 404))
    failed = sum(v for k, v in codes.items() if not k.isdigit() or int(k) >= 500 or int(k) == 0)
    if ok == 0:
        problems.append(f"{m}: no rerouted request succeeded (rerouted by code: {codes or 'none'})")
    bound = max(MAX_REROUTE_FAILED_FLOOR, MAX_REROUTE_FAILED_SHARE * sum(codes.values()))
    if failed > bound:
        problems.append(f"{m}: {failed} rerouted requests failed (> {bound:.0f}: {MAX_REROUTE_FAILED_SHARE:.0%} "
                        f"of them; by code: {codes})")
    return problems


def hazard_rules(s: dict, min_availability: float = MIN_AVAILABILITY) -> list[str]:
    """What the control must show, else the simulation does not exercise the problem."""
    problems = []
    if s["false_404"] == 0:
        problems.append("control: no false 404s (the simulation does not exercise the problem)")
    for cls in ("old-only", "new-only"):
        pct = s["availability"][cls]
        if pct is None or pct >= min_availability - 5:
            problems.append(f"control: availability of {cls} {pct}% is not below the filter's floor: "
                            "the floor does not tell a filter that reaches its peers from one that does not")
    return problems


def verdict(summaries: dict, min_rate: float = 200.0, min_availability: float = MIN_AVAILABILITY) -> list[str]:
    """Failed requirements (empty when all hold): the filter rules for the filter run, the hazard for
    the control, and for a mutant that the filter rules catch it."""
    problems = []
    for mode, s in summaries.items():
        if mode == "control":
            problems += hazard_rules(s, min_availability)
            if s["rate"] < min_rate:
                problems.append(f"control: achieved {s['rate']:.1f} req/s < {min_rate:.0f}")
        elif mode.startswith("mutant-"):
            if not filter_rules(s, min_rate, min_availability):
                problems.append(f"{mode}: the filter rules did not catch this mutant")
        else:
            problems += filter_rules(s, min_rate, min_availability)
    return problems


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=90, help="seconds of load per mode (default 90)")
    p.add_argument("--mode", choices=MODES + ("both", "mutants"), default="both",
                   help="both = filter and control; mutants = the broken filters (kpp.testing.mutants), which must fail")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--rate", type=float, default=300, help="target requests/s of all workers together")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--watchers-per-class", type=int, default=2)
    p.add_argument("--no-drain", action="store_true",
                   help="keep the upgraded server's Envoy in the front LB while it restarts")
    p.add_argument("--refresh-interval", default=PLUGIN["refresh_interval"],
                   help="the filter's discovery refresh interval, also the change window (default %(default)s)")
    p.add_argument("--min-availability", type=float, default=MIN_AVAILABILITY,
                   help="filter run: percent of 2xx per class outside change windows (default %(default)s)")
    p.add_argument("--workdir", default=None, help="keep Envoy logs and raw results here")
    a = p.parse_args(argv)
    workdir = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="kpp-upgrade-sim-"))
    modes = {"both": ("filter", "control"), "mutants": tuple(m for m in MODES if m.startswith("mutant-"))}.get(
        a.mode, (a.mode,))
    summaries = {}
    for mode in modes:
        summaries[mode] = run_mode(mode, a.duration, a.seed, workdir, rate=a.rate, workers=a.workers,
                                   watchers_per_class=a.watchers_per_class, drain=not a.no_drain,
                                   plugin={"refresh_interval": a.refresh_interval})
    print()
    for s in summaries.values():
        print(schedule_table(s))
    print()
    print(classify.table(summaries))
    for mode, s in summaries.items():
        if s["false_examples"]:
            print(f"\n[{mode}] first false 404s:\n" + examples(s))
        if s["unavailable_examples"]:
            print(f"\n[{mode}] first judged requests without a 2xx:\n" + examples(s, key="unavailable_examples"))
    for mode, s in summaries.items():
        if mode != "filter":
            tripped = filter_rules(s, min_availability=a.min_availability)
            print(f"\nthe filter rules applied to {mode}: " + ("\n  " + "\n  ".join(tripped) if tripped else "all hold"))
    problems = verdict(summaries, min_availability=a.min_availability)
    print(f"\nraw results and Envoy logs: {workdir}")
    if problems:
        print("FAIL: " + "; ".join(problems))
        return 1
    print("PASS: " + ", ".join(
        f"{m}: {s['false_404']} false 404s, {s['lost_writes']} lost writes, {s['rate']:.0f} req/s, availability "
        + " / ".join(classify.availability_text(s, c).split()[0] for c in gvrs.CLASSES)
        for m, s in summaries.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
