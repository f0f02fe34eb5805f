"""The short version of `make upgrade-k8s` (`python -m kpp.testing.sim.upgrade_k8s --short`): real etcd, three
kubeadm nodes upgraded kube-apiserver v1.35.4 -> v1.36.3, then kube-controller-manager v1.36.3
(garbage collector + namespace controller) on cp-1's own endpoint while cp-1 is rolled back to
v1.35.4. The same schedule runs without the filter (control: plain TLS passthrough Envoys) and with it.

The pass rules are `kpp.testing.sim.upgrade_k8s.filter_rules` (the same `make upgrade-k8s` exits on): no dependent
of a live owner lost, no false 404 reaching a client (each apiserver 404 matched by audit ID to the
one access-log line that says what the client got), all real garbage collected, rerouted requests
answered by the peer (by code), client-visible 503s and workload failures under their bounds. The
control must show the hazard, and the filter rules must fail for it (mutation (c); the mutants (a) and
(b), a dead peer and a 503 for everything only a peer serves, are recorded in docs/upgrade-k8s.md).
`make test` builds the v1.35.4 binaries first (make k8s-build-skew), so this always runs.
"""

from __future__ import annotations

import time

import pytest

from kpp.testing.sim import upgrade_k8s

# The module fixture runs the short upgrade twice (control and filter): about 210 s on the shared 2-core
# machine (docs/upgrade-k8s.md), paid by the first test, past pytest.ini's 300 s default under load.
pytestmark = pytest.mark.timeout(1200)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    t = time.monotonic()
    base = tmp_path_factory.mktemp("upgrade-k8s")
    res = {m: upgrade_k8s.run_one(m, True, base) for m in ("control", "filter")}
    print(f"\n{upgrade_k8s.table(list(res.values()))}\n(total {time.monotonic() - t:.0f}s)")
    return res


def test_filter_passes_every_rule(results):
    f = results["filter"]
    assert upgrade_k8s.filter_rules(f) == [], upgrade_k8s.filter_rules(f)
    assert f["rerouted_metric"] > 0


def test_control_shows_the_hazard_and_fails_the_filter_rules(results):
    c = results["control"]
    assert upgrade_k8s.hazard_rules(c) == [], upgrade_k8s.hazard_rules(c)
    tripped = upgrade_k8s.filter_rules(c)
    print("the filter rules applied to the control:\n  " + "\n  ".join(tripped))
    assert any("dependents lost" in t for t in tripped), tripped
    assert any("false 404s" in t for t in tripped), tripped
