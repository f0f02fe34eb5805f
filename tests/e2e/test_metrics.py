"""The gauges and the error counter the README lists, moving as described: snapshot and per-server
ages, freshness, and `peer_proxy_errors_total{type=upstream_unreachable}` for a rerouted request
Envoy could not complete."""

from __future__ import annotations

from kpp.testing import harness
from kpp.testing.topology import NEW_ONLY, Topology


def gauge(topo, name: str) -> int | None:
    return topo.envoy.stats(name.replace(";", ".").replace("=", ".")).get(f"wasmcustom.{name}")


def test_ages_freshness_and_upstream_unreachable(topo):
    topo.start(plugin={"refresh_interval": "500ms", "staleness_limit": "2s"})
    assert topo.get(NEW_ONLY).status == 200
    harness.wait_until(lambda: gauge(topo, "kube_peer_proxy_snapshot_age_seconds") is not None, 5)
    assert gauge(topo, "kube_peer_proxy_snapshot_age_seconds") <= 1
    for server in "abc":
        assert gauge(topo, f"kube_peer_proxy_server_last_success_age_seconds;server={server}") <= 1, server
        assert gauge(topo, f"kube_peer_proxy_server_fresh;server={server}") == 1, server
    # Both peers die; the next request for what only they serve is rerouted before any discovery
    # round notices: Envoy cannot connect, the filter counts it.
    topo.b.stop()
    topo.c.stop()
    before = topo.counter("kube_peer_proxy_peer_proxy_errors_total;type=upstream_unreachable")
    r = topo.get(NEW_ONLY)
    assert r.status == 503 and r.headers.get("retry-after"), r
    harness.wait_until(
        lambda: topo.counter("kube_peer_proxy_peer_proxy_errors_total;type=upstream_unreachable") > before, 5,
        message="upstream_unreachable did not move")
    # Rounds keep completing (the snapshot age stays small) while b's last success ages and b goes
    # stale after staleness_limit. Waited for, bounded: past the 2 s limit plus a few rounds on a
    # loaded machine.
    harness.wait_until(lambda: gauge(topo, "kube_peer_proxy_server_fresh;server=b") == 0
                       and gauge(topo, "kube_peer_proxy_server_last_success_age_seconds;server=b") >= 3, 15,
                       message="b not stale with a last success 3 s old within 15 s of its stop")
    assert gauge(topo, "kube_peer_proxy_snapshot_age_seconds") <= 1
    age_b = gauge(topo, "kube_peer_proxy_server_last_success_age_seconds;server=b")
    assert age_b >= 3, age_b
    assert gauge(topo, "kube_peer_proxy_server_last_success_age_seconds;server=a") <= 1
    assert gauge(topo, "kube_peer_proxy_server_fresh;server=b") == 0
    assert gauge(topo, "kube_peer_proxy_server_fresh;server=a") == 1
