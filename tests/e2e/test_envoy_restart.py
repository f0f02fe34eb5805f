"""Restarts of Envoy itself, and what a failing wasm VM does .

* Between Envoy's start and the filter's first snapshot (a restarted Envoy has no routing table until its first
  discovery round), requests go to the local apiserver first: what it serves is answered at once, and its "not
  served here" 404 for a resource only the peers serve becomes a 503 `Status` with `Retry-After`, never a 404.
* `failure_policy`: kpp.render sets `FAIL_RELOAD`. What each policy does when the VM traps is measured here with
  a deliberately crashing filter (`crash_filter/`, built by the test; the real filter has no way to be made to
  trap): the request that crashes the VM gets a 503, and then
    - FAIL_RELOAD: that worker answers 503 while Envoy backs off (1 s base), then a fresh VM takes over (for our
      filter, a fresh VM reads the snapshot from shared data, which is per `vm_id` and outlives VMs);
    - FAIL_CLOSED: that worker answers 503 until Envoy restarts;
    - FAIL_OPEN: that worker skips the filter for good — for kube-peer-proxy, every peer-only resource would then
      be a false 404 on that worker, which is why it is not used.
"""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from kpp import render
from kpp.testing import harness
from kpp.testing.sim.probe import Hammer
from kpp.testing.topology import COMMON, FAST, NEW_ONLY, Topology, request

CRASH_CRATE = harness.ROOT / "tests" / "e2e" / "crash_filter"
CRASH_TARGET = harness.ROOT / "target" / "crash-filter"


def set_discovery_delay(topo: Topology, ms: int) -> None:
    for inst in (topo.a, topo.b, topo.c):
        body = json.dumps({"discovery": "ok", "delay_ms": ms}).encode()
        assert request(f"{inst.url}/__fake/fault", "POST", body=body).status == 200


def mixed(_worker, seq):
    return "GET", (NEW_ONLY if seq % 2 else COMMON), None


def describe(answers) -> str:
    return "\n".join(map(repr, answers[:20]))


def restart_under_load(topo: Topology, yaml: str, admin: int, old, name: str, hammer: Hammer):
    """Stops `old`, starts the same bootstrap again; returns (new envoy, t stopped, t of the first answer for the
    peer-only resource, i.e. once the first snapshot routes it)."""
    old.stop()
    t_stopped = time.monotonic()
    new = topo.envoys.start(yaml, name, admin)

    def routed():
        return [a.t1 for a in hammer.snapshot() if a.path == NEW_ONLY and a.status == 200 and a.t0 > t_stopped]

    harness.wait_until(routed, 20, message=f"{name}: {NEW_ONLY} never answered after the restart")
    return new, t_stopped, min(routed())


def test_restarted_envoy_serves_local_resources_at_once_and_guards_peer_only_ones_until_its_first_snapshot(topo):
    yaml, topo.port, admin = topo.bootstrap(plugin={"retry_after_seconds": 2})
    envoy = topo.envoys.start(yaml, "a", admin)
    envoy.wait_snapshot(20)
    # Every discovery answer now takes 0.7 s (below the 1 s fetch timeout): the restarted Envoy's first round,
    # and so its first snapshot, comes ~1 s after it starts listening.
    set_discovery_delay(topo, 700)
    guarded = "kube_peer_proxy_peer_proxy_errors_total;type=guarded_not_found"
    with Hammer(topo.port, mixed, workers=3, pace=0.005) as load:
        time.sleep(0.5)
        envoy, t_stopped, t_routed = restart_under_load(topo, yaml, admin, envoy, "a-restarted", load)
        time.sleep(0.5)
    answers = load.answers
    assert not [a for a in answers if a.status == 404], describe([a for a in answers if a.status == 404])
    # While Envoy is down the client cannot connect (status 0); t_listening is its first answer after that.
    t_listening = min(a.t1 for a in answers if a.t0 >= t_stopped and a.status != 0)
    window = [a for a in answers if t_stopped <= a.t0 and a.t1 < t_routed]
    local = [a for a in window if a.path == COMMON and a.status != 0]
    peer_only = [a for a in window if a.path == NEW_ONLY and a.status != 0]
    # Local first: the local server's resources never wait for the snapshot.
    assert all(a.status == 200 and a.served_by == "a" for a in local), describe(local)
    assert len(local) >= 5, f"the no-snapshot window was not observed: {describe(window)}"
    assert min(a.t1 for a in local) - t_listening < 0.5, "the first local answer waited"
    # The peer-only resource: a's 404 might be false (nothing is known yet), so 503 + Retry-After.
    assert all(a.is_filter_503() for a in peer_only), describe(peer_only)
    assert len(peer_only) >= 5, f"the no-snapshot window was not observed: {describe(window)}"
    assert {a.headers["retry-after"] for a in peer_only} == {"2"}
    assert {a.status_json()["details"]["retryAfterSeconds"] for a in peer_only} == {2}
    after = [a for a in answers if a.t0 > t_routed + 0.1]
    assert after and all(a.status == 200 for a in after), describe([a for a in after if a.status != 200])
    assert {a.served_by for a in after if a.path == NEW_ONLY} <= {"b", "c"}
    assert {a.served_by for a in after if a.path == COMMON} == {"a"}
    topo.envoy = envoy
    assert topo.counter(guarded) >= len(peer_only)
    print(f"restart: Envoy down {t_listening - t_stopped:.2f} s, then {len(local)} local 200s and "
          f"{len(peer_only)} 503 + Retry-After over {t_routed - t_listening:.2f} s until the first snapshot")


def test_envoy_restart_under_load_without_delay_never_gives_a_404(topo):
    yaml, topo.port, admin = topo.bootstrap()
    envoy = topo.envoys.start(yaml, "a0", admin)
    envoy.wait_snapshot(20)
    with Hammer(topo.port, mixed, workers=3, pace=0.002) as load:
        time.sleep(0.3)
        # No discovery delay here: the window between listening and the first snapshot is as short as it gets.
        envoy, _, _ = restart_under_load(topo, yaml, admin, envoy, "a1", load)
        time.sleep(0.3)
    answers = load.answers
    assert not [a for a in answers if a.status == 404], describe([a for a in answers if a.status == 404])
    bad = [a for a in answers if a.status not in (0, 200) and not a.is_503_status_with_retry_after()]
    assert not bad, describe(bad)


def test_bootstrap_sets_failure_policy_fail_reload():
    yaml = render.render_bootstrap(node="a", listen_port=1, admin_port=2, local=("127.0.0.1", 3), peers=[],
                                   wasm_path="x.wasm")
    filters = json.loads(yaml)["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]["http_filters"]
    wasm = next(f for f in filters if f["name"] == "envoy.filters.http.wasm")
    assert wasm["typed_config"]["config"]["failure_policy"] == "FAIL_RELOAD"


@pytest.fixture(scope="module")
def crash_wasm():
    r = subprocess.run(["cargo", "build", "--offline", "--release", "--target", "wasm32-wasip1", "--manifest-path",
                        str(CRASH_CRATE / "Cargo.toml"), "--target-dir", str(CRASH_TARGET)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return CRASH_TARGET / "wasm32-wasip1" / "release" / "crash_filter.wasm"


@pytest.mark.parametrize("policy", ["FAIL_RELOAD", "FAIL_CLOSED", "FAIL_OPEN"])
def test_what_a_vm_failure_does_under_each_failure_policy(envoys, crash_wasm, policy):
    from kpp.testing.fake_apiserver import Cluster

    cluster = Cluster()
    try:
        a = cluster.start("a", apiset="old")
        port, admin = harness.free_port(), harness.free_port()
        yaml = render.render_bootstrap(node="a", listen_port=port, admin_port=admin, local=("127.0.0.1", a.port),
                                       peers=[], wasm_path=str(crash_wasm), plugin=FAST, failure_policy=policy)
        envoy = envoys.start(yaml, "crash", admin)
        url = f"http://127.0.0.1:{port}/version"

        def probe(seconds: float) -> list:
            out, end = [], time.monotonic() + seconds
            while time.monotonic() < end:
                r = request(url)  # a new connection each time: Envoy spreads them over both workers
                out.append((time.monotonic(), r.status, r.headers.get("x-crash-filter-vm")))
                time.sleep(0.01)
            return out

        before = probe(0.3)
        assert all(s == 200 and vm for _, s, vm in before), before
        vms_before = {vm for _, _, vm in before}
        crashed = request(url, headers={"x-crash-vm": "1"})
        assert crashed.status == 503, "the request that traps the VM is failed, never passed on"
        # Envoy's own reply (`wasm_fail_stream`) is rewritten by the bootstrap's local-reply mapper.
        assert crashed.headers.get("retry-after") == "1", crashed.headers
        assert crashed.json()["kind"] == "Status" and crashed.json()["code"] == 503, crashed
        t_crash = time.monotonic()
        if policy == "FAIL_RELOAD":
            # Envoy reloads the crashed worker's VM on that worker's first request after the backoff (1 s
            # base). Waited for while probing, bounded, then one more second of requests: a fixed 2.2 s probe
            # whose last second had to be clean left ~200 ms for the reload on a loaded machine.
            after: list = []

            def reloaded() -> bool:
                after.extend(probe(0.1))
                return envoy.stats(filter="vm_reload_success").get("wasm.kube-peer-proxy.vm_reload_success", 0) >= 1

            harness.wait_until(reloaded, 15, 0, message="no VM reload within 15 s of the crash")
            t_reloaded = time.monotonic()
            last = probe(1.0)
            # Recovered: every request goes through a filter VM again, and one of them is a new VM.
            assert all(s == 200 and vm for _, s, vm in last), last
            assert {vm for _, _, vm in after + last if vm} - vms_before, "no fresh VM after the crash"
            print(f"FAIL_RELOAD: reloaded {t_reloaded - t_crash:.2f} s after the crash")
        else:
            # The controls: still failing (or bypassing) in the last second of 3 s, twice the reload backoff.
            after = probe(3.0)
            last = [x for x in after if x[0] > after[-1][0] - 1.0]
            if policy == "FAIL_CLOSED":
                assert any(s == 503 for _, s, _ in last), "the crashed worker should still fail"
                assert all(vm in vms_before for _, s, vm in after if s == 200)
            else:
                bypassed = [x for x in last if x[1] == 200 and not x[2]]
                assert bypassed, "the crashed worker should pass requests on without the filter"
    finally:
        cluster.stop_all()
