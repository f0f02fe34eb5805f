"""Lease mode in kubeadm's layout, against real kube-apiservers running kubeadm's flags.

kubeadm's manifest sets no feature gate and no --peer-advertise-* flag, and none is added here
(`KUBEADM_FLAGS` restores kubeadm's --feature-gates, i.e. none, where the kubeadm harness turns the
built-in proxy's gate off). What the apiservers then write (observed in the first test of each class):

* v1.36.3: `kubernetes.io/peer-advertise-address: <node-ip>:6443` (--advertise-address and
  --secure-port), which in kubeadm's layout is Envoy's *client* listener;
* v1.35.4: no annotation at all (the UnknownVersionInteroperabilityProxy gate is alpha, off).

The kubeadm profile's lease mode reaches the advertised host at the peer listener
(`lease_discovery.peer_port` = --peer-port, 6444), and a node whose apiserver writes no annotation
through `--lease-host` (`lease_discovery.hosts`). The control runs the same layout with the
advertised address used as-is: nothing is ever learned.

Nodes: 127.0.0.61-63 (index 51-53) and 127.0.0.65-66 (index 55-56); each cluster has its own etcd.
"""

from __future__ import annotations

import signal
import time

import pytest

from kpp.testing import harness
from kpp.testing.kubeadm_node import (APISERVER_PORT, PEER_PORT, KubeadmCluster, filter_metric,
                                      kubeconfig_credentials, server_fresh)
from k8senv import from_access_log, serving

SELECTOR = "?labelSelector=apiserver.kubernetes.io%2Fidentity%3Dkube-apiserver"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
ANNOTATION = "kubernetes.io/peer-advertise-address"
JOBS = "/apis/batch/v1/namespaces/default/jobs"
HPAS = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers"
# kubeadm writes no --feature-gates: None restores that (the harness otherwise turns the gate off).
KUBEADM_FLAGS = {"--feature-gates": None}


def leases_of(node) -> dict[str, dict]:
    """hostname → identity lease, read straight from the node's apiserver."""
    r = node.direct(LEASES + SELECTOR)
    assert r.status == 200, r
    return {i["metadata"]["labels"].get("kubernetes.io/hostname", ""): i for i in r.json()["items"]}


def lease_mode(node, **extra):
    """The kubeadm profile's lease mode for this node (render_kubeadm sets peer_port)."""
    return {"leases": {"local_hostname": node.hostname, **extra.pop("leases", {})}, **extra}


metric, fresh = filter_metric, server_fresh


def sync_errors(node, server: str) -> dict[str, int]:
    return {dict(k)["type"]: v for k, v in metric(node, "discovery_sync_errors_total").items()
            if dict(k).get("server") == server}


def wait_fresh(node, peers, timeout=45.0):
    want = {p.hostname: 1 for p in peers}
    return harness.wait_until(lambda: all(fresh(node).get(h) == 1 for h in want) and fresh(node), timeout, 0.5,
                              message=f"{node.name} did not learn {sorted(want)}: {fresh(node)}\n"
                                      f"{node.envoy.log_tail(40)}")


def admin(node):
    return kubeconfig_credentials(node.kubeconfig("admin"), node.workdir / "creds")


def served_by(client_node, path, server, others, cert):
    """GET path through client_node's Envoy; asserts it was served (and audited with the client's
    identity) by `server` only, arriving at server's peer listener."""
    r = client_node.via(path, cert=cert[0], key=cert[1])
    assert r.status == 200, (client_node.name, path, r)
    aid = r.audit_id
    ev = server.audit_event(aid)
    assert ev["user"]["username"] == "kubernetes-admin", ev["user"]
    assert "kubeadm:cluster-admins" in ev["user"]["groups"], ev["user"]
    for o in others:
        assert not o.has_audit_id(aid), f"{aid} also audited on {o.name}"
    entry = from_access_log(server.envoy, lambda: next((e for e in server.access_entries()
                                                        if e.get("resp_audit_id") == aid), None),
                            message=f"{aid} not in {server.name}'s access log")
    assert int(entry["listener_port"]) == PEER_PORT, entry
    sent = from_access_log(client_node.envoy, lambda: next((e for e in client_node.access_entries()
                                                            if e.get("resp_audit_id") == aid), None),
                           message=f"{aid} not in {client_node.name}'s access log")
    assert sent["cluster"] == "peers-by-address" and sent["upstream_host"] == f"{server.node_ip}:{PEER_PORT}", sent
    print(f"{path} via {client_node.name}: 200, audited on {server.name} as {ev['user']['username']} "
          f"{ev['user']['groups']}, sent to {sent['upstream_host']}")
    return ev


def wait_code(node, path, want, cert, timeout, allowed=(503,)):
    seen = []

    def ok():
        r = node.via(path, cert=cert[0], key=cert[1])
        seen.append(r.status)
        assert r.status in (want, *allowed), (r, seen[-10:])
        return r.status == want
    t0 = time.monotonic()
    harness.wait_until(ok, timeout, 0.3, message=f"{path} via {node.name}: no {want} in {timeout}s: {seen[-10:]}")
    return time.monotonic() - t0, sorted(set(seen))


def start(kc: KubeadmCluster, names, **envoy_kw):
    """kubeadm phases, etcd, the named nodes' apiservers and RBAC (the other nodes join later)."""
    t0 = time.monotonic()
    first = kc.first
    for n in kc.nodes.values():
        n.extra_flags.update(KUBEADM_FLAGS)
    for name in names:
        node = kc.node(name)
        node.prepare(None if node is first else first)
    kc.etcd.start()
    for name in names:
        kc.node(name).start_apiserver()
    for name in names:
        kc.node(name).wait_apiserver(180)
    kc.apply_rbac()
    print(f"cluster {list(names)} ready in {time.monotonic() - t0:.1f}s")


def cp1_mode(kc: KubeadmCluster, mode: str):
    """cp-1's Envoy in lease mode "control" (the advertised address used as it is) or "peer-port" (the
    kubeadm profile's, reaching peers at their peer listener); restarted only if it runs the other one.
    The class's tests each say which they need, so that any of them runs alone."""
    if kc.cp1_mode == mode:
        return
    cp1 = kc.node("cp-1")
    if cp1.envoy:
        cp1.envoy.stop()
    cp1.start_envoy([], kc.wasm, **lease_mode(cp1, **({"leases": {"peer_port": None}} if mode == "control" else {})))
    cp1.envoy.wait_until_ready(60)
    cp1.envoy.wait_snapshot(60)
    kc.cp1_mode = mode


def join_cp3(kc: KubeadmCluster):
    """cp-3 joins (kubeadm phases with cp-1's CAs, its apiserver, its Envoy in lease mode), once."""
    cp1, cp3 = kc.node("cp-1"), kc.node("cp-3")
    if cp3.apiserver_proc is not None:
        return
    cp3.prepare(cp1)
    cp3.start_apiserver()
    cp3.wait_apiserver(180)
    cp3.start_envoy([], kc.wasm, **lease_mode(cp3))
    cp3.envoy.wait_until_ready(60)


def gone(node):
    """The node's processes are stopped (its apiserver with SIGTERM: it deletes its lease)."""
    if node.apiserver_proc is not None and node.apiserver_proc.alive():
        node.stop()


class TestV136:
    """cp-1 lacks batch/v1 and autoscaling/v2, cp-2 lacks autoscaling/v2, cp-3 (joins later) has both."""

    @pytest.fixture(scope="class")
    def kc(self, request, tmp_path_factory):
        kc = KubeadmCluster(tmp_path_factory.mktemp("leases-kubeadm"),
                            [("cp-1", "batch/v1=false,autoscaling/v2=false"), ("cp-2", "autoscaling/v2=false"),
                             ("cp-3", "")], first_index=51)
        def up():
            start(kc, ["cp-1", "cp-2"])
            cp1, cp2 = kc.node("cp-1"), kc.node("cp-2")
            cp2.start_envoy([], kc.wasm, **lease_mode(cp2))
            # the control first: cp-1 uses the advertised address as it is (the old behaviour)
            kc.cp1_mode = None
            cp1_mode(kc, "control")
            cp2.envoy.wait_until_ready(60)
            cp2.envoy.wait_snapshot(60)
        with serving(request, kc, up):
            yield kc

    def test_kubeadms_flags_and_what_the_leases_say(self, kc):
        cp1, cp2 = kc.node("cp-1"), kc.node("cp-2")
        for n in (cp1, cp2):
            flags = n.apiserver_flags()
            assert not [f for f in flags if f.startswith(("--feature-gates", "--peer-"))], flags
            assert [f for f in n.kubeadm_command if f.startswith("--peer-")] == []
        leases = leases_of(cp1)
        for n in (cp1, cp2):
            lease = leases[n.hostname]
            print(f"v1.36.3 lease of {n.hostname}: name {lease['metadata']['name']}, "
                  f"annotations {lease['metadata'].get('annotations')}, labels {lease['metadata']['labels']}")
            assert lease["metadata"]["annotations"][ANNOTATION] == f"{n.node_ip}:{APISERVER_PORT}", lease

    def test_control_the_advertised_address_as_is_learns_no_peer(self, kc):
        """cp-1 reaches cp-2 where its lease says, <node-ip>:6443: Envoy's client listener, which
        verifies client certificates against the cluster CA and refuses the front-proxy one."""
        cp1, cp2 = kc.node("cp-1"), kc.node("cp-2")
        cp1_mode(kc, "control")
        harness.wait_until(lambda: sync_errors(cp1, cp2.hostname).get("unreachable", 0) >= 3, 30, 0.5,
                           message=f"no unreachable errors: {sync_errors(cp1, cp2.hostname)}")
        assert fresh(cp1).get(cp2.hostname) == 0, fresh(cp1)
        r = cp1.via(JOBS, cert=admin(cp1)[0], key=admin(cp1)[1])
        assert r.status == 503, r  # a member whose API set is unknown: the 404 might be false
        # the TCP connection is made (cp-2's Envoy listens there); the TLS handshake is what fails
        ssl = {k: v for k, v in cp1.envoy.stats(r"cluster\.peers-by-address\.ssl\.").items() if v}
        assert sum(v for k, v in ssl.items() if k.endswith(("connection_error", "fail_verify_error"))) >= 1, ssl
        print(f"control: server_fresh {fresh(cp1)}, sync errors for {cp2.hostname} "
              f"{sync_errors(cp1, cp2.hostname)}, {JOBS} -> {r.status}, upstream TLS {ssl}")
        # the fix: the same node, the kubeadm profile's lease mode (peer_port 6444)
        cp1_mode(kc, "peer-port")

    def test_two_nodes_learn_each_other(self, kc):
        cp1, cp2 = kc.node("cp-1"), kc.node("cp-2")
        cp1_mode(kc, "peer-port")
        t0 = time.monotonic()
        wait_fresh(cp1, [cp2])
        wait_fresh(cp2, [cp1])
        print(f"two nodes: cp-1 {fresh(cp1)}, cp-2 {fresh(cp2)} ({time.monotonic() - t0:.1f}s)")
        assert cp1.direct(JOBS).status == 404 and cp2.direct(JOBS).status == 200
        served_by(cp1, JOBS, cp2, [cp1], admin(cp1))
        r = cp1.via(HPAS, cert=admin(cp1)[0], key=admin(cp1)[1])
        assert r.status == 404, r  # nobody serves it, every member known: the genuine 404

    def test_a_third_node_joins_and_all_three_learn_each_other(self, kc):
        cp1, cp2, cp3 = kc.node("cp-1"), kc.node("cp-2"), kc.node("cp-3")
        cp1_mode(kc, "peer-port")
        join_cp3(kc)
        t0 = time.monotonic()
        for n, peers in ((cp1, [cp2, cp3]), (cp2, [cp1, cp3]), (cp3, [cp1, cp2])):
            wait_fresh(n, peers)
        print(f"three nodes ({time.monotonic() - t0:.1f}s): " +
              "; ".join(f"{n.name} {fresh(n)}" for n in (cp1, cp2, cp3)))
        assert leases_of(cp1)[cp3.hostname]["metadata"]["annotations"][ANNOTATION] == f"{cp3.node_ip}:6443"
        # autoscaling/v2 is cp-3's only: both others reroute to its peer listener
        served_by(cp1, HPAS, cp3, [cp1, cp2], admin(cp1))
        served_by(cp2, HPAS, cp3, [cp1, cp2], admin(cp2))

    def test_a_node_leaves(self, kc):
        cp1, cp2, cp3 = kc.node("cp-1"), kc.node("cp-2"), kc.node("cp-3")
        # the starting point: three nodes that know each other (as the test before leaves them)
        cp1_mode(kc, "peer-port")
        join_cp3(kc)
        for n, peers in ((cp1, [cp2, cp3]), (cp2, [cp1, cp3])):
            wait_fresh(n, peers)
        cp3.apiserver_proc.stop(signal.SIGTERM)
        assert cp3.hostname not in leases_of(cp1), "a gracefully stopped kube-apiserver deletes its lease"
        for n in (cp1, cp2):
            took, seen = wait_code(n, HPAS, 404, admin(n), 30)
            print(f"{n.name}: cp-3 left, {HPAS} genuine 404 after {took:.1f}s (codes {seen}); fresh {fresh(n)}")
            # (a gauge cannot be removed: the filter sets a departed member's to 0)
            harness.wait_until(lambda n=n: fresh(n).get(cp3.hostname) == 0, 10, 0.5,
                               message=f"{n.name}: {fresh(n)}")
        # (counted once Envoy has written what it holds: its stop below writes the rest, see flush_logs)
        assert cp3.envoy.flush_logs(), "cp-3's Envoy did not write its access log"
        n_before = len([e for e in cp3.access_entries() if str(e.get("listener_port")) == str(PEER_PORT)])
        cp3.stop()
        for n in (cp1, cp2):
            assert n.via(JOBS, cert=admin(n)[0], key=admin(n)[1]).status == 200
        assert len([e for e in cp3.access_entries() if str(e.get("listener_port")) == str(PEER_PORT)]) == n_before

    def test_a_single_remaining_node(self, kc):
        """cp-2 leaves too: cp-1 alone in lease mode serves what it has, and what nobody serves is a
        genuine 404 (no member is unknown)."""
        cp1, cp2 = kc.node("cp-1"), kc.node("cp-2")
        # the starting point: cp-1 in the kubeadm profile's lease mode knows cp-2, and cp-3 has left
        cp1_mode(kc, "peer-port")
        gone(kc.node("cp-3"))
        wait_fresh(cp1, [cp2])
        cp2.apiserver_proc.stop(signal.SIGTERM)
        assert set(leases_of(cp1)) == {cp1.hostname}, leases_of(cp1)
        took, seen = wait_code(cp1, JOBS, 404, admin(cp1), 30)
        harness.wait_until(lambda: fresh(cp1).get(cp2.hostname) == 0, 10, 0.5, message=str(fresh(cp1)))
        r = cp1.via("/api/v1/namespaces/default/configmaps", cert=admin(cp1)[0], key=admin(cp1)[1])
        assert r.status == 200, r
        print(f"cp-1 alone: {JOBS} 404 after {took:.1f}s (codes {seen}), configmaps 200, fresh {fresh(cp1)}")


class TestMixed:
    """m-1 runs v1.35.4 (kubeadm v1.35.4) without batch/v1; m-2 runs v1.36.3 without autoscaling/v2."""

    @pytest.fixture(scope="class")
    def kc(self, request, tmp_path_factory):
        kc = KubeadmCluster(tmp_path_factory.mktemp("leases-kubeadm-mixed"),
                            [("m-1", "batch/v1=false"), ("m-2", "autoscaling/v2=false")], first_index=55)
        kc.node("m-1").version = "v1.35.4"
        def up():
            start(kc, ["m-1", "m-2"])
            m1, m2 = kc.node("m-1"), kc.node("m-2")
            m1.start_envoy([], kc.wasm, **lease_mode(m1))
            # m-1's v1.35.4 apiserver writes no address: the kubeadm profile's --lease-host
            m2.start_envoy([], kc.wasm, **lease_mode(m2, lease_hosts=[(m1.hostname, m1.node_ip)]))
            for n in (m1, m2):
                n.envoy.wait_until_ready(60)
                n.envoy.wait_snapshot(60)
        with serving(request, kc, up):
            yield kc

    def test_what_each_version_writes(self, kc):
        m1, m2 = kc.node("m-1"), kc.node("m-2")
        for n in (m1, m2):
            v = n.direct("/version").json()["gitVersion"]
            assert v == n.version, (n.name, v)
            assert not [f for f in n.apiserver_flags() if f.startswith(("--feature-gates", "--peer-"))]
        leases = leases_of(m2)
        for n in (m1, m2):
            lease = leases[n.hostname]
            print(f"{n.version} lease of {n.hostname}: annotations {lease['metadata'].get('annotations')}, "
                  f"labels {lease['metadata']['labels']}, holder {lease['spec']['holderIdentity']}")
        assert ANNOTATION not in (leases[m1.hostname]["metadata"].get("annotations") or {})
        assert leases[m2.hostname]["metadata"]["annotations"][ANNOTATION] == f"{m2.node_ip}:{APISERVER_PORT}"

    def test_the_mixed_pair_learn_each_other_and_reroute_both_ways(self, kc):
        m1, m2 = kc.node("m-1"), kc.node("m-2")
        wait_fresh(m1, [m2])
        wait_fresh(m2, [m1])
        print(f"mixed pair: m-1 {fresh(m1)}, m-2 {fresh(m2)}")
        assert m1.direct(JOBS).status == 404 and m2.direct(HPAS).status == 404
        served_by(m1, JOBS, m2, [m1], admin(m1))   # v1.35.4 → v1.36.3 (from its lease's annotation)
        served_by(m2, HPAS, m1, [m2], admin(m2))   # v1.36.3 → v1.35.4 (--lease-host)
