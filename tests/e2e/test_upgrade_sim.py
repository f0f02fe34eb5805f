"""The rolling-upgrade simulation, short: `make upgrade-sim` runs the long one.

Both modes run the identical schedule (a, b, c upgraded old → new one at a time under ≥ 200 req/s of
get/list/create/delete plus long watches over old-only, new-only and common GVRs). A server is *in service*
once its /readyz answers through its Envoy and a direct GET /apis on it answers, in both modes alike (see
kpp/testing/sim/classify.py). With the filter: no false 404 (nor one while a server was starting), no lost write, no wasm
VM panic, every 503 a `Status` with `Retry-After`, and per resource class at least MIN_AVAILABILITY % of the
requests for a GVR some in-service server serves answered 2xx outside one refresh interval after each change.
Without it (plain Envoy): false 404s, and an availability of old-only and new-only GVRs far below that floor
(what a filter that never reaches a peer would score, whether it answers those requests 404 or 503).
"""

from __future__ import annotations

from collections import Counter

from kpp.testing.sim import classify, gvrs, upgrade_sim

DURATION = 18.0
FILTER_OUTCOMES = upgrade_sim.FILTER_OUTCOMES
MIN_AVAILABILITY = upgrade_sim.MIN_AVAILABILITY
# Classes whose requests need a peer for part of the run (common GVRs are served by every server).
PEER_CLASSES = ("old-only", "new-only")


def test_rolling_upgrade_filter_is_available_without_false_404_and_control_is_not(envoys, tmp_path):
    summaries = {mode: upgrade_sim.run_mode(mode, DURATION, seed=5, workdir=tmp_path, registry=envoys)
                 for mode in ("filter", "control")}
    for s in summaries.values():
        print(upgrade_sim.schedule_table(s))
    print(classify.table(summaries))
    f, c = summaries["filter"], summaries["control"]
    problems = upgrade_sim.verdict(summaries, min_availability=MIN_AVAILABILITY)
    assert problems == [], "\n".join(problems) + "\nfalse 404s:\n" + upgrade_sim.examples(f) + \
        "\nnot available:\n" + upgrade_sim.examples(f, key="unavailable_examples")
    assert f["wasm_panics"] == 0
    assert f["lost_writes"] == 0 and c["lost_writes"] == 0, (f["lost"][:5], c["lost"][:5])
    assert c["false_404"] > 0, "the control run shows no false 404: the simulation does not exercise the problem"
    unexpected = (set(f["outcomes"]) | set(f["watch_outcomes"])) - FILTER_OUTCOMES
    assert not unexpected, {k: f["outcomes"][k] + f["watch_outcomes"][k] for k in unexpected}
    # the pass rules fail without the filter (mutation (c))
    tripped = upgrade_sim.filter_rules(c)
    print("the filter rules applied to the control:\n  " + "\n  ".join(tripped))
    assert any("false 404s" in t for t in tripped) and any("availability" in t for t in tripped), tripped
    for cls in gvrs.CLASSES:
        assert f["judged"][cls] >= 200, (cls, f["judged"])
        assert f["availability"][cls] >= MIN_AVAILABILITY, (cls, classify.availability_text(f, cls))
    # The floor tells a filter that reaches its peers from one that does not: the control never does.
    for cls in PEER_CLASSES:
        assert c["availability"][cls] < MIN_AVAILABILITY - 5, (cls, classify.availability_text(c, cls))
    for s in summaries.values():
        assert s["rate"] >= 200, f"{s['mode']}: {s['rate']:.1f} req/s"
        assert s["hung_threads"] == 0
        assert len(s["upgrades"]) == 3 and all(u["back"] < DURATION for u in s["upgrades"]), s["upgrades"]
        assert sum(w["events"] for w in s["watch"].values()) > 0
    # Identical schedule: the same pauses at the same offsets (within scheduling jitter).
    for uf, uc in zip(f["upgrades"], c["upgrades"]):
        assert uf["server"] == uc["server"] and uf["pause"] == uc["pause"] and abs(uf["drain"] - uc["drain"]) < 0.5


def test_the_pass_rules_fail_for_broken_filters(envoys, tmp_path):
    """Mutations (a) and (b) (kpp.testing.mutants): reroutes to a dead peer, and a 503 for everything only a peer
    serves. Each must fail the filter rules; which rules trip is printed (and recorded in the README)."""
    tripped = {}
    for mode in ("mutant-dead-peer", "mutant-503"):
        s = upgrade_sim.run_mode(mode, DURATION, seed=5, workdir=tmp_path, registry=envoys)
        print(classify.table({mode: s}))
        tripped[mode] = upgrade_sim.filter_rules(s)
        print(f"the filter rules applied to {mode}:\n  " + "\n  ".join(tripped[mode]))
    for mode, lines in tripped.items():
        assert any("availability of old-only" in t for t in lines), (mode, lines)
        assert any("availability of new-only" in t for t in lines), (mode, lines)
    assert any("rerouted requests failed" in t for t in tripped["mutant-dead-peer"]), tripped
    assert any("no rerouted request succeeded" in t for t in tripped["mutant-503"]), tripped


# --- Upgrade windows, reproduced one request at a time ---------------------------------------------------------
# The simulation's pauses (1–3 s) are longer than a discovery round, so every Envoy sees the upgraded server
# down before it comes back. These tests pin the windows the simulation cannot show: a restart faster than one
# round, and restarts whose new discovery answers late (a discovery delay on the restarted server).

import time  # noqa: E402

import pytest  # noqa: E402

from kpp.testing import harness  # noqa: E402
from kpp.testing.sim.probe import Hammer  # noqa: E402
from kpp.testing.topology import NEW_ONLY, OLD_ONLY, Topology  # noqa: E402

NODES = ("a", "b", "c")
# A slow round, so a restart between two rounds is certain, not likely.
SLOW = {"refresh_interval": "5s", "fetch_timeout": "1s", "staleness_limit": "30s"}
FAST_PAUSE = 0.1  # seconds a is down in the fast restart: far shorter than one round
FAST_WINDOW = 1.5  # seconds of requests after it is back, all before the next round
# a stops as the kubelet stops it (SIGTERM: kube-apiserver finishes the answers it is writing, Go's
# http.Server.Shutdown), bounded by this many seconds. A crash-like stop cut an answer between its header and
# its body now and then (a client's IncompleteRead when Envoy's 1 s delayed close expired): a race with the
# load, not the filter.
STOP_GRACE = 2.0


def _all_fresh(topo: Topology) -> bool:
    stats = topo.envoy.stats(filter="server_fresh")
    return all(stats.get(f"wasmcustom.kube_peer_proxy_server_fresh;server={n}") == 1 for n in NODES)


def _wait_all_fresh(topo: Topology):
    harness.wait_until(lambda: _all_fresh(topo), 20, message="no snapshot with a, b and c fresh within 20 s")


def _panics(topo: Topology) -> list[str]:
    return [line for line in topo.envoy.log_text().splitlines() if "panicked at" in line or "might be false" in line]


def _assert_no_panic(topo: Topology):
    lines = _panics(topo)
    assert not any("panicked at" in line for line in lines), "the filter's wasm VM panicked:\n" + "\n".join(lines[:6])


def _discovery_fetches(inst, paths=("/apis",)) -> int:
    """Discovery fetches that reached this instance (each round fetches /api and /apis from every member)."""
    return sum(1 for q in inst.requests()
               if q["path"] in paths and q["headers"].get("x-kubernetes-peer-proxied") == "true")


def _round_fetches(topo: Topology) -> list[int]:
    return [_discovery_fetches(getattr(topo, n), ("/api", "/apis")) for n in NODES]


def _summary(answers) -> Counter:
    return Counter((x.status, x.origin, x.served_by) for x in answers)


def _fast_local_restart(topo: Topology, with_filter: bool):
    """a (old) restarts as new with a FAST_PAUSE pause, right after a discovery round, while 2 clients GET an
    old-only resource through a's Envoy; b (old) still serves it, c is new. Returns (answers, stop, start)."""
    topo.b = topo.cluster.restart("b", apiset="old")
    topo.start(plugin=SLOW, with_filter=with_filter, wait_snapshot=with_filter)
    if with_filter:
        _wait_all_fresh(topo)
        # A round starts: it has reached every server for both documents (and publishes as their answers
        # come in); the next one starts one refresh interval (5 s) after it. Each round fetches /api and
        # /apis once from each server, so a round under way when this begins is the one waited for.
        due = [(n // 2 + 1) * 2 for n in _round_fetches(topo)]
        harness.wait_until(lambda: all(n >= d for n, d in zip(_round_fetches(topo), due)), 7, 0.01,
                           message="no discovery round reached a, b and c within 7 s")
        t_round = time.monotonic()
    with Hammer(topo.port, lambda w, s: ("GET", OLD_ONLY, None), workers=2, pace=0.01) as load:
        harness.wait_until(lambda: len(load.snapshot()) >= 4, 10, 0.01, message="no answers within 10 s")
        assert all(x.status == 200 and x.served_by in ("a", "b") for x in load.snapshot()), load.snapshot()[:3]
        old = topo.cluster.instances["a"]
        t_stop = time.monotonic()
        old.stop(grace=STOP_GRACE)
        time.sleep(FAST_PAUSE)  # the restart under test: a is down this long
        topo.a = topo.cluster.start("a", old.port, apiset="new")
        t_start = time.monotonic()
        time.sleep(FAST_WINDOW)  # the window observed: requests to the new a before any round fetches it
        fetched_new = _discovery_fetches(topo.a)
        t_end = time.monotonic()
    if with_filter:
        # Certain, not likely: no round fetched the new a, so a's filter still had a's old API set as fresh.
        assert fetched_new == 0, f"a discovery round ran inside the window ({t_end - t_round:.2f} s after the last)"
    answers = [x for x in load.answers if t_stop <= x.t0 < t_end]
    print(f"{'filter' if with_filter else 'control'}: {len(answers)} answers after a stopped: {_summary(answers)}")
    return answers, t_stop, t_start


def test_local_server_restarted_as_new_within_one_round_does_not_404_what_a_peer_serves(topo):
    answers, _t_stop, t_start = _fast_local_restart(topo, with_filter=True)
    after = [x for x in answers if x.t0 >= t_start]
    assert len(after) >= 20, _summary(answers)
    false_404 = [x for x in answers if x.status == 404]
    assert not false_404, f"{len(false_404)} false 404s through a's Envoy, first: {false_404[0]!r}"
    _assert_no_panic(topo)
    # Before a is back: the old a's last answers (a request it was answering when told to stop gets its whole
    # answer: STOP_GRACE), then Envoy's 503 (it cannot connect). After: the guard answers the new a's 404 with
    # a 503 of its own (or the request reaches b). Nothing else, in particular no 503 from a failed wasm VM
    # and no answer cut off.
    bad = [x for x in answers if not (x.status == 200 and x.served_by == "b" or x.is_filter_503()
                                      or x.t0 < t_start and (x.status == 200 and x.served_by == "a"
                                                             or x.status == 503 and x.origin == "envoy"))]
    assert not bad, f"{len(bad)} unexpected answers, first: {bad[0]!r}; all: {_summary(answers)}"
    assert any(x.is_filter_503() or x.served_by == "b" for x in after), _summary(after)


def test_control_local_server_restarted_as_new_within_one_round_404s_what_a_peer_serves(topo):
    """The same requests without the filter: a's new API set answers them, with a (false) 404."""
    answers, _t_stop, t_start = _fast_local_restart(topo, with_filter=False)
    after = [x for x in answers if x.t0 >= t_start]
    false_404 = [x for x in after if x.status == 404 and x.served_by == "a"]
    assert len(false_404) >= 20 and len(false_404) == len(after), _summary(after)


def _restart_slowly(topo: Topology, name: str, apiset: str, down: float = 1.2, delay_ms: int = 800):
    """Stop `name`, wait `down` s (≥ 2 failed discovery rounds), start it with `apiset` and slow discovery."""
    inst = topo.cluster.instances[name]
    inst.stop()
    time.sleep(down)
    new = topo.cluster.start(name, inst.port, apiset=apiset)
    new.discovery_delay_ms = delay_ms
    return new, time.monotonic()


def test_local_server_restarted_as_new_does_not_404_resources_only_its_old_version_served(topo):
    topo.b = topo.cluster.restart("b", apiset="old")  # a peer that keeps serving the old-only resources
    topo.start()
    _wait_all_fresh(topo)
    with Hammer(topo.port, lambda w, s: ("GET", OLD_ONLY, None), workers=2, pace=0.01) as load:
        topo.a, t_back = _restart_slowly(topo, "a", "new")
        time.sleep(0.8)
    after = [x for x in load.answers if x.t0 >= t_back]
    print(f"{len(after)} answers after a is back: {_summary(after)}")
    # a's filter saw a down: a's old data is not trusted, b serves it (200), or the filter answers 503.
    false_404 = [x for x in after if x.status == 404]
    assert not false_404, f"{len(false_404)} false 404s, first: {false_404[0]!r}"
    _assert_no_panic(topo)
    bad = [x for x in after if not (x.status == 200 and x.served_by == "b" or x.is_filter_503())]
    assert not bad, f"{len(bad)} unexpected answers, first: {bad[0]!r}"


def test_peer_restarted_as_new_does_not_404_its_new_resources_before_the_next_round(topo):
    topo.b = topo.cluster.restart("b", apiset="old")
    topo.c = topo.cluster.restart("c", apiset="old")  # all old: nobody serves the new-only resources yet
    topo.start()
    _wait_all_fresh(topo)
    with Hammer(topo.port, lambda w, s: ("GET", NEW_ONLY, None), workers=2, pace=0.01) as load:
        topo.b, t_back = _restart_slowly(topo, "b", "new")
        harness.wait_until(lambda: any(x.status == 200 and x.t0 > t_back for x in load.snapshot()), 5,
                           message="b never routed to after its restart")
    after = [x for x in load.answers if x.t0 >= t_back]
    print(f"{len(after)} answers after b is back: {_summary(after)}")
    # b serves NEW_ONLY from t_back on (running; its discovery answers 0.8 s later). Expected: 503 + Retry-After
    # from the filter until it has b's new discovery, then 200 from b. A 404 here is false.
    false_404 = [x for x in after if x.status == 404]
    assert not false_404, (f"{len(false_404)} 404s while b served it, first {false_404[0]!r}, "
                           f"last {false_404[-1]!r} ({false_404[-1].t0 - t_back:.3f} s after b was back)")
    _assert_no_panic(topo)
    bad = [x for x in after if not (x.status == 200 and x.served_by == "b" or x.is_filter_503())]
    assert not bad, f"{len(bad)} unexpected answers, first: {bad[0]!r}"
