"""The short version of `make upgrade-k8s` (`python -m kpp.upgrade_k8s --short`): real etcd, three
kubeadm nodes upgraded kube-apiserver v1.35.4 -> v1.36.3, then kube-controller-manager v1.36.3
(garbage collector + namespace controller) on cp-1's own endpoint while cp-1 is rolled back to
v1.35.4. The same schedule runs without the filter (control: plain TLS passthrough Envoys) and with it.

Asserted: with the filter no dependent whose owner exists is deleted and no apiserver answers a false
404; the control shows the hazard (see docs/upgrade-k8s.md for why it is reliable in this schedule).
Runs only when the v1.35.4 apiserver is cached (`make k8s-build-skew`).
"""

from __future__ import annotations

import time

import pytest

from kpp import upgrade_k8s
from kpp.cluster import CACHE

NEEDED = [CACHE / "k8s" / upgrade_k8s.OLD / "kube-apiserver", CACHE / "k8s" / upgrade_k8s.NEW / "kube-apiserver",
          CACHE / "k8s" / upgrade_k8s.NEW / "kube-controller-manager", CACHE / "k8s" / upgrade_k8s.NEW / "kubeadm"]

pytestmark = pytest.mark.skipif(not all(p.is_file() for p in NEEDED),
                                reason="needs cached binaries: make k8s-build k8s-build-skew")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    t = time.monotonic()
    base = tmp_path_factory.mktemp("upgrade-k8s")
    res = {m: upgrade_k8s.run_one(m, True, base) for m in ("control", "filter")}
    print(f"\n{upgrade_k8s.table(list(res.values()))}\n(total {time.monotonic() - t:.0f}s)")
    return res


def test_filter_loses_nothing(results):
    f = results["filter"]
    assert f["dependents"] > 0 and f["owners"] > 0, f
    assert f["lost"] == [], f["lost"]
    assert f["gc_deletes_live_owner"] == 0
    assert f["false404_total"] == 0, f["false404"]
    assert all(e["seconds"] is not None for e in f["namespaces"]), f["namespaces"]
    assert f["rerouted_metric"] > 0


def test_control_shows_the_hazard(results):
    c = results["control"]
    assert c["false404_total"] > 0, c["false404"]
    assert c["lost"], "the control lost no dependent: the schedule did not expose the GC (see docs/upgrade-k8s.md)"
