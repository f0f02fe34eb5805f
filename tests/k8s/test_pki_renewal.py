"""Certificate renewal on the kubeadm layout with the real binaries, while clients keep running.

Two kubeadm nodes (kpp.testing.kubeadm_node: real kubeadm v1.36.3 PKI and manifests, real kube-apiservers,
one etcd); cp-1 serves everything but batch/v1, so jobs requests through cp-1's Envoy go to cp-2's
peer listener. Each Envoy runs with the static pod's pki-reload loop beside it (kpp.pki_reload).

1. `kubeadm certs renew all` (the real binary; it rewrites every file in place) on both nodes while
   certificate, token and new-connection clients and watches run through cp-1's Envoy: new
   handshakes on cp-1's client and peer listeners present the renewed serving certificate within
   the bound, no request fails, the watches keep streaming, and no SDS secret of either Envoy counts
   a `key_rotation_failed` (cp-1's Envoy is checked again at the end).
2. Both kube-apiservers restart on their renewed certificates (as kubeadm tells the operator to),
   and cp-2's Envoy restarts so cp-1 opens new connections to its peer listener: those present
   cp-1's renewed front-proxy client certificate (cp-2's access log records the serial).
3. The audit logs show that a certificate client, a token client and the proxy's own discovery keep
   their identities through Envoy, on the local path (cp-1) and the rerouted path (cp-2).
"""

from __future__ import annotations

import time

import pytest

from kpp.testing import harness
from kpp.testing.kubeadm_node import APISERVER_PORT, PEER_PORT, TOKEN_GROUP, TOKEN_USER, KubeadmCluster, \
    kubeconfig_credentials, openssl
from kpp.render import DISCOVERY_USER
from kpp.testing.proc import client_tls
from kpp.testing.sds import NoKeyRotationFailures
from kpp.testing.tlsload import TlsLoad
from k8senv import serving

LOCAL = "/api/v1/namespaces/default/configmaps"
REROUTED = "/apis/batch/v1/namespaces/default/jobs"
RELOAD_BOUND = 10.0


def file_serial(crt) -> str:
    return openssl("x509", "-noout", "-serial", "-in", str(crt)).strip().split("=", 1)[1].upper()


def presented_serial(host, port, ca) -> str:
    import socket
    ctx = client_tls(ca, check_hostname=False)
    with socket.create_connection((host, port), timeout=5) as s, ctx.wrap_socket(s) as t:
        return t.getpeercert()["serialNumber"].upper()


def configmap(n):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"renew-{n}"}, "data": {"n": str(n)}}


def job(n):
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": f"renew-{n}"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "registry.invalid/none"}]}}}}


@pytest.fixture(scope="module")
def kc(request, tmp_path_factory):
    # nodes 5 and 6 (127.0.0.15, .16): clear of the other kubeadm tests' addresses
    kc = KubeadmCluster(tmp_path_factory.mktemp("renewal"), [("cp-1", "batch/v1=false"), ("cp-2", "")], first_index=5)
    with serving(request, kc, kc.start):
        yield kc


def test_kubeadm_certs_renew_reaches_envoy_and_every_identity_survives(kc, tmp_path):
    cp1, cp2 = kc.node("cp-1"), kc.node("cp-2")
    ca = cp1.pki / "ca.crt"
    admin = kubeconfig_credentials(cp1.kubeconfig("admin"), tmp_path / "creds")
    cert_ctx = lambda: client_tls(ca, *admin)  # noqa: E731
    harness.wait_until(lambda: cp1.via(REROUTED, cert=admin[0], key=admin[1]).status == 200, 30,
                       message="batch/v1 through cp-1's Envoy")
    old = {n.name: (file_serial(n.pki / "apiserver.crt"), file_serial(n.pki / "front-proxy-client.crt"))
           for n in (cp1, cp2)}
    assert presented_serial(cp1.node_ip, APISERVER_PORT, ca) == old["cp-1"][0]
    # docs/deploy.md: a normal renewal leaves sds.<secret>.key_rotation_failed at 0 (KubePeerProxyKeyRotationFailed)
    rotations = NoKeyRotationFailures([cp1.envoy, cp2.envoy])

    cert_load = TlsLoad(cp1.node_ip, APISERVER_PORT, cert_ctx, [LOCAL, REROUTED], [LOCAL, REROUTED],
                        [(f"{LOCAL}", configmap), (REROUTED, job)], create_every=0.5)
    token_load = TlsLoad(cp1.node_ip, APISERVER_PORT, lambda: client_tls(ca), [LOCAL, REROUTED], [], [],
                         keepalive_workers=1, headers={"Authorization": f"Bearer {kc.token}"})
    cert_load.start()
    token_load.start()
    try:
        harness.wait_until(lambda: all(cert_load.watch_events.values()), 30, message="the watches saw no events")
        t0 = time.monotonic()
        out = {n.name: n.kubeadm("certs", "renew", "all", f"--config={n.rootfs / 'kubeadm.yaml'}") for n in (cp1, cp2)}
        assert "certificate for serving the Kubernetes API renewed" in out["cp-1"], out["cp-1"]
        assert "certificate for the front proxy client renewed" in out["cp-1"], out["cp-1"]
        new = {n.name: (file_serial(n.pki / "apiserver.crt"), file_serial(n.pki / "front-proxy-client.crt"))
               for n in (cp1, cp2)}
        assert all(new[k][i] != old[k][i] for k in new for i in (0, 1)), (old, new)
        took = {}
        for what, port in (("client listener", APISERVER_PORT), ("peer listener", PEER_PORT)):
            harness.wait_until(lambda: presented_serial(cp1.node_ip, port, ca) == new["cp-1"][0], RELOAD_BOUND,
                               interval=0.1, message=f"cp-1's {what} still presents the old certificate")
            took[what] = time.monotonic() - t0
        print("kubeadm certs renew all on both nodes, then the renewed serving certificate on cp-1's "
              "listeners after: " + ", ".join(f"{k} {v:.2f} s" for k, v in took.items()))
        t_last = time.monotonic()
        time.sleep(3)
    finally:
        cert_load.stop()
        token_load.stop()
    print("certificate clients:", cert_load.summary(t_last))
    print("token client:", token_load.summary(t_last))
    assert cert_load.failures == [] and token_load.failures == [], (cert_load.failures + token_load.failures)[:10]
    assert cert_load.watch_broken == {}
    assert all(n > 0 for n in cert_load.events_after(t_last).values()), cert_load.events_after(t_last)
    assert cert_load.ok > 50 and token_load.ok > 20
    print("key_rotation_failed after kubeadm certs renew all:", rotations.check("kubeadm certs renew all"))

    # 2. the apiservers restart on their renewed certificates; cp-2's Envoy restarts (new peer connections)
    for n in (cp1, cp2):
        n.apiserver_proc.stop()
        n.start_apiserver()
    for n in (cp1, cp2):
        n.wait_apiserver()
        assert presented_serial(n.apiserver_ip, APISERVER_PORT, ca) == new[n.name][0], f"{n.name} apiserver"
    cp2.envoy.stop()
    cp2.start_envoy([cp1], kc.wasm)
    cp2.envoy.wait_until_ready(60)
    t_restarted = time.time()
    harness.wait_until(lambda: cp1.via(REROUTED, cert=admin[0], key=admin[1]).status == 200, 60,
                       message="the rerouted path after the restarts")

    # 3. identities, local and rerouted, judged by the audit logs
    def audited(node, resp):
        assert resp.status == 200, resp
        return node.audit_event(resp.audit_id)["user"]

    for path, node in ((LOCAL, cp1), (REROUTED, cp2)):
        u = audited(node, cp1.via(path, cert=admin[0], key=admin[1]))
        assert u["username"] == "kubernetes-admin" and "kubeadm:cluster-admins" in u["groups"], (path, u)
        u = audited(node, cp1.via(path, token=kc.token))
        assert u["username"] == TOKEN_USER and TOKEN_GROUP in u["groups"], (path, u)
        print(f"{path} on {node.name}: certificate and token clients keep their identities")
    for n in (cp1, cp2):
        def discovery_seen(n=n):
            return [e for e in n.audit_events()
                    if e.get("user", {}).get("username") == DISCOVERY_USER and e.get("stage") == "ResponseComplete"
                    and e.get("responseStatus", {}).get("code") in (200, 304)
                    and _ts(e) > t_restarted]
        harness.wait_until(discovery_seen, 30, message=f"no discovery by {DISCOVERY_USER} on {n.name} since")
    print(f"the proxy's discovery is {DISCOVERY_USER} on both apiservers after the restarts")

    # cp-1's new connections to cp-2's peer listener present cp-1's renewed front-proxy client certificate
    def peer_serials():
        return {int(e["peer_serial"], 16) for e in cp2.access_entries()
                if e.get("peer_serial") not in (None, "-", "") and e.get("peer_proxied") == "true"}
    harness.wait_until(lambda: int(new["cp-1"][1], 16) in peer_serials(), 30,
                       message="cp-2's peer listener never saw cp-1's renewed front-proxy certificate")
    print(f"cp-2's peer listener saw cp-1's front-proxy client certificate serials: "
          f"{sorted(hex(s) for s in peer_serials())} (renewed: {new['cp-1'][1]})")
    # cp-1's Envoy ran through all of it (cp-2's was restarted)
    rotations.check("the renewal and the restarts", envoys=[cp1.envoy])


def _ts(ev) -> float:
    from datetime import datetime
    return datetime.fromisoformat(ev["stageTimestamp"].replace("Z", "+00:00")).timestamp()
