"""The kubeadm profile's default membership on real kubeadm nodes: peers from the `default/kubernetes`
EndpointSlice, with nothing per node in any bootstrap, across the 1.35 -> 1.36 boundary where lease mode
needs a hand-written `--lease-host` for every 1.35 node.

Inside kpp.testing.netns each node has a real address (198.18.0.15-18: kubeadm's advertise address, Envoy's
listeners), kube-apiserver runs kubeadm's own flags apart from the harness's few overrides, and its endpoint
reconciler is kubeadm's default (lease). cp-1 runs v1.35.4 without batch/v1, cp-2 v1.36.3 without
autoscaling/v2; cp-3 (v1.36.3, everything) joins, cp-4 (v1.36.3, everything, another address) replaces it, and
leaves. Every Envoy is rendered by `render_kubeadm(endpoints=True)`, what `kube-peer-proxy-render --kubeadm`
gives without --peer or --lease-local-hostname (tests/k8s/test_deploy.py checks that default).
"""

from __future__ import annotations

import time

import pytest

from kpp.testing import harness, netns
from kpp.testing.cluster import DEFAULT_VERSION, SKEW_OLD_VERSION
from kpp.testing.kubeadm_node import PEER_PORT, KubeadmCluster, kubeconfig_credentials, server_fresh

pytestmark = pytest.mark.timeout(900)

JOBS = "/apis/batch/v1/namespaces/default/jobs"
HPAS = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers"
SLICE = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"
FIRST_INDEX = 5  # node IPs 198.18.0.15-18 (kpp.testing.netns)


fresh = server_fresh


def slice_ips(node) -> set[str]:
    r = node.direct(SLICE)
    assert r.status == 200, r
    return {a for e in (r.json().get("endpoints") or []) for a in e.get("addresses") or []}


def wait_slice(node, want: set, timeout=60.0) -> float:
    t0 = time.monotonic()
    harness.wait_until(lambda: slice_ips(node) == want, timeout, 0.3,
                       message=f"the kubernetes EndpointSlice never listed exactly {sorted(want)}")
    return time.monotonic() - t0


def served_by(client, path, server, cert):
    """GET path through client's Envoy: served (and audited as the admin) by `server`, at its peer listener."""
    r = client.via(path, cert=cert[0], key=cert[1])
    assert r.status == 200, (client.name, path, r)
    ev = server.audit_event(r.audit_id)
    assert ev["user"]["username"] == "kubernetes-admin", ev["user"]
    client.envoy.flush_logs()
    sent = harness.wait_until(lambda: next((e for e in client.access_entries()
                                            if e.get("resp_audit_id") == r.audit_id), None), 30, 0.2,
                              message=f"{r.audit_id} not in {client.name}'s access log")
    assert sent["upstream_host"] == f"{server.node_ip}:{PEER_PORT}", sent
    return ev


@pytest.fixture(scope="module")
def kc(request, tmp_path_factory):
    netns.require()
    kc = KubeadmCluster(tmp_path_factory.mktemp("kubeadm-endpoints"),
                        [("cp-1", "batch/v1=false"), ("cp-2", "autoscaling/v2=false"), ("cp-3", ""), ("cp-4", "")],
                        first_index=FIRST_INDEX, netns=True)
    kc.node("cp-1").version = SKEW_OLD_VERSION
    for n in kc.nodes.values():
        n.extra_flags["--feature-gates"] = None  # kubeadm writes none: the built-in proxy's own default
    try:
        first = kc.first
        for name in ("cp-1", "cp-2"):
            kc.node(name).prepare(None if name == "cp-1" else first)
        kc.etcd.start()
        for name in ("cp-1", "cp-2"):
            kc.node(name).start_apiserver()
        for name in ("cp-1", "cp-2"):
            kc.node(name).wait_apiserver(180)
        kc.apply_rbac()
        # Each apiserver writes the slice from the master leases it sees at its 10 s reconcile: wait until
        # one has written it with both.
        wait_slice(kc.first, {kc.node("cp-1").node_ip, kc.node("cp-2").node_ip})
        for name in ("cp-1", "cp-2"):
            kc.node(name).start_envoy([], kc.wasm, endpoints=True)
        for name in ("cp-1", "cp-2"):
            kc.node(name).envoy.wait_until_ready(60)
            kc.node(name).envoy.wait_snapshot(60)
    except BaseException:
        print(kc.dump())
        kc.stop()
        raise
    request.session.kpp_env = kc
    try:
        yield kc
    finally:
        request.session.kpp_env = None
        kc.stop()


def join(kc, name):
    node = kc.node(name)
    node.prepare(kc.first)
    node.start_apiserver()
    node.wait_apiserver(180)
    node.start_envoy([], kc.wasm, endpoints=True)
    node.envoy.wait_until_ready(60)
    return node


def test_a_v135_and_a_v136_node_find_each_other_without_any_address_list(kc):
    cp1, cp2 = kc.node("cp-1"), kc.node("cp-2")
    cert = kubeconfig_credentials(cp1.kubeconfig("admin"), cp1.workdir / "creds")
    assert cp1.direct("/version").json()["gitVersion"] == SKEW_OLD_VERSION
    assert cp2.direct("/version").json()["gitVersion"] == DEFAULT_VERSION
    assert slice_ips(cp1) == {cp1.node_ip, cp2.node_ip}
    for n in (cp1, cp2):
        # this node's bootstrap names no other node: the plugin knows only its own address
        assert cp1.node_ip not in n.envoy_yaml or n is cp1
        assert cp2.node_ip not in n.envoy_yaml or n is cp2
        harness.wait_until(lambda n=n: fresh(n) == {cp1.node_ip: 1, cp2.node_ip: 1}, 45, 0.5,
                           message=f"{n.name}: {fresh(n)}")
    served_by(cp1, JOBS, cp2, cert)
    served_by(cp2, HPAS, cp1, cert)


def test_a_node_joins_is_replaced_and_leaves(kc):
    cp1, cp2 = kc.node("cp-1"), kc.node("cp-2")
    cert = kubeconfig_credentials(cp1.kubeconfig("admin"), cp1.workdir / "creds")
    base = {cp1.node_ip, cp2.node_ip}
    timings = {}
    # Nobody serves both batch/v1 and autoscaling/v2 yet, but each is served by one node: the baseline.
    cp3 = join(kc, "cp-3")
    timings["cp-3 listed"] = round(wait_slice(cp1, base | {cp3.node_ip}), 1)
    for n in (cp1, cp2):
        t0 = time.monotonic()
        harness.wait_until(lambda n=n: fresh(n).get(cp3.node_ip) == 1, 45, 0.3, message=f"{n.name}: {fresh(n)}")
        timings[f"cp-3 learned by {n.name}"] = round(time.monotonic() - t0, 1)
    # cp-3 knows the others from the slice too (it was started with no address of anyone).
    harness.wait_until(lambda: fresh(cp3) == {cp1.node_ip: 1, cp2.node_ip: 1, cp3.node_ip: 1}, 45, 0.5,
                       message=f"cp-3: {fresh(cp3)}")
    cp4 = join(kc, "cp-4")
    wait_slice(cp1, base | {cp3.node_ip, cp4.node_ip})
    for n in (cp1, cp2):
        harness.wait_until(lambda n=n: fresh(n).get(cp4.node_ip) == 1, 45, 0.3, message=f"{n.name}: {fresh(n)}")
    cp3.stop()  # SIGTERM: the apiserver removes its address from the slice
    timings["cp-3 unlisted after stop"] = round(wait_slice(cp1, base | {cp4.node_ip}), 1)
    for n in (cp1, cp2):
        t0 = time.monotonic()
        harness.wait_until(lambda n=n: fresh(n).get(cp3.node_ip, 0) == 0, 45, 0.3, message=f"{n.name}: {fresh(n)}")
        timings[f"cp-3 dropped by {n.name}"] = round(time.monotonic() - t0, 1)
    # cp-1 lacks batch/v1: cp-2 and cp-4 serve it; never the gone cp-3, and never a 503.
    for _ in range(8):
        ev = cp1.via(JOBS, cert=cert[0], key=cert[1])
        assert ev.status == 200, ev
        assert not cp3.has_audit_id(ev.audit_id)
    cp4.stop()
    timings["cp-4 unlisted after stop"] = round(wait_slice(cp1, base), 1)
    for n in (cp1, cp2):
        harness.wait_until(lambda n=n: fresh(n).get(cp4.node_ip, 0) == 0, 45, 0.3, message=f"{n.name}: {fresh(n)}")
    served_by(cp1, JOBS, cp2, cert)
    print(f"\nkubeadm endpoints membership: {timings}")


def test_control_lease_mode_without_a_hand_written_address_cannot_reach_the_v135_node(kc):
    """The same two nodes with cp-2's Envoy in lease mode and no --lease-host: v1.35.4 writes no address on
    its identity lease, so cp-2 knows cp-1 is a member but can never learn what it serves, and what only
    cp-1 serves (autoscaling/v2) is a 503 through cp-2. With the EndpointSlice it is served (first test)."""
    cp1, cp2 = kc.node("cp-1"), kc.node("cp-2")
    cert = kubeconfig_credentials(cp1.kubeconfig("admin"), cp1.workdir / "creds")
    cp2.envoy.stop()
    try:
        cp2.start_envoy([], kc.wasm, leases={"local_hostname": cp2.hostname})
        cp2.envoy.wait_until_ready(60)
        cp2.envoy.wait_snapshot(60)
        # cp-1 is a member (its lease was read) whose address is unknown: its discovery is never fetched
        harness.wait_until(lambda: f"apiserver {cp1.hostname} joined" in cp2.envoy.log_text()
                           and "address unknown" in cp2.envoy.log_text(), 30, 0.3,
                           message=f"cp-2 never read cp-1's lease:\n{cp2.envoy.log_tail(30)}")
        r = cp2.via(HPAS, cert=cert[0], key=cert[1])
        assert r.status == 503 and r.headers.get("x-kube-peer-proxy-reply") == "true", r
        assert fresh(cp2).get(cp1.hostname, 0) == 0, fresh(cp2)
    finally:
        cp2.envoy.stop()
        cp2.start_envoy([], kc.wasm, endpoints=True)
        cp2.envoy.wait_until_ready(60)
        cp2.envoy.wait_snapshot(60)
    harness.wait_until(lambda: fresh(cp2).get(cp1.node_ip) == 1, 45, 0.5, message=f"cp-2: {fresh(cp2)}")
    served_by(cp2, HPAS, cp1, cert)
