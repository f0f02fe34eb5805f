"""The local apiserver goes down under load: real Envoy with the filter in front of `a`, fake peers b and c.

Found on a real node (tests/node, step 3): while `kubeadm upgrade` restarted a kube-apiserver, clients whose
keep-alive connection the load balancer had pinned to that node's Envoy got 503s for longer than client-go
retries. The filter learned that the local server was down only from a failed discovery round, up to a refresh
interval (5 s by default) plus a fetch timeout late. Now the discovery service asks the local server's
`/readyz` every tick (at most a second): from the first failed probe what a peer serves goes to a peer, and
what only the local server serves stays local.

The control is plain Envoy (no filter) on the same topology: every request of the outage fails.
"""

from __future__ import annotations

import time

from kpp.testing.sim.probe import Hammer

COMMON = "/api/v1/namespaces/default/configmaps"  # every fake serves it
OUTAGE = 4.0
# Detection: one tick (1 s with the default 5 s refresh) plus the publish, on two busy cores.
SETTLE = 2.0
# The defaults, as deployed: the refresh interval alone would leave the outage unseen for up to 5 s.
PLUGIN = {"refresh_interval": "5s", "fetch_timeout": "2s", "staleness_limit": "30s"}


def common_get(_worker, _seq):
    return "GET", COMMON, None


def describe(answers) -> str:
    return "\n".join(map(repr, answers[:20]))


def outage(topo, with_filter: bool):
    topo.start(plugin=PLUGIN, wait_snapshot=with_filter, with_filter=with_filter)
    with Hammer(topo.port, common_get, workers=4, pace=0.01) as load:
        time.sleep(1.0)
        topo.a.stop()
        t_dead = time.monotonic()
        time.sleep(OUTAGE)
        t_restart = time.monotonic()  # a may listen before start() returns
        topo.a = topo.cluster.start("a", topo.a.port, apiset="old")
        t_back = time.monotonic()
        time.sleep(3.0)
    return load.answers, t_dead, t_restart, t_back


def test_a_local_apiserver_that_goes_down_is_bypassed_within_a_tick(topo):
    answers, t_dead, t_restart, t_back = outage(topo, with_filter=True)
    before = [a for a in answers if a.t1 < t_dead - 0.1]
    assert before and all(a.status == 200 and a.served_by == "a" for a in before), describe(before)
    settled = [a for a in answers if t_dead + SETTLE <= a.t0 and a.t1 < t_restart]
    assert len(settled) > 20, describe(settled)
    bad = [a for a in settled if not (a.status == 200 and a.served_by in ("b", "c"))]
    assert not bad, describe(bad)
    # Before the probe noticed: Envoy's 503 for the local server, with Retry-After (client-go waits and
    # retries), never anything else.
    early = [a for a in answers if t_dead <= a.t0 < t_dead + SETTLE and a.status != 200]
    assert all(a.status == 503 and "retry-after" in a.headers for a in early), describe(early)
    # Back: local again within a tick (the probe answers 200), and its discovery is fetched at once.
    back = [a for a in answers if a.t0 >= t_back + SETTLE]
    assert back and all(a.status == 200 and a.served_by == "a" for a in back), describe(back)
    log = topo.envoy.log_text()
    assert "the local apiserver is not ready (cannot connect)" in log
    assert "the local apiserver is ready again" in log
    print(f"{len([a for a in answers if t_dead <= a.t0 < t_restart])} requests during the {OUTAGE:.0f} s outage, "
          f"{len(early)} failed before the probe noticed; first rerouted answer "
          f"{min(a.t1 for a in answers if a.t0 >= t_dead and a.served_by in ('b', 'c')) - t_dead:.2f} s after the stop")


def test_control_without_the_filter_every_request_of_the_outage_fails(topo):
    answers, t_dead, t_restart, _ = outage(topo, with_filter=False)
    during = [a for a in answers if t_dead + SETTLE <= a.t0 and a.t1 < t_restart]
    assert len(during) > 20, describe(during)
    assert all(a.status != 200 for a in during), describe([a for a in during if a.status == 200])
