"""Drop-in on a real kubeadm control-plane node: kube-peer-proxy's Envoy owns <node-ip>:6443, the
kube-apiserver moves to a node-local address, peers talk through the peer listener <node-ip>:6444.

Topology (module fixture, kpp.testing.kubeadm_node): one etcd; nodes cp-1 (node IP 127.0.0.11,
kube-apiserver v1.36.3 on 127.0.1.11:6443 with `--runtime-config=batch/v1=false`) and cp-2 (127.0.0.12,
apiserver 127.0.1.12:6443, everything). kubeadm v1.36.3 wrote every certificate, kubeconfig and the
apiserver manifest; each apiserver runs with exactly kubeadm's flags except the overrides that
`test_apiservers_run_kubeadms_flags` prints. Each node's Envoy is `kpp.render.render_kubeadm`
with the other node as peer. "local" below = configmaps through cp-1's Envoy, served by cp-1;
"rerouted" = batch/v1 jobs through cp-1's Envoy, served by cp-2 (through cp-2's peer listener).

Which server served a request, and as whom, comes from the apiservers' audit logs (Metadata, JSON,
blocking): the Audit-Id response header names the event, which must be in the expected node's log
and not in the other's. Every spoofing attempt is printed with what it got; the last test prints
them all together.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from kpp import render
from kpp.testing import harness
from kpp.testing.proc import server_tls
from kpp.testing.kubeadm_node import (APISERVER_PORT, OVERRIDES, PEER_PORT, SNI, TOKEN_GROUP, TOKEN_USER, KubeadmCluster,
                              kubeconfig_credentials, mint_cert, request, write_kubeconfig)
from k8senv import dumped, from_access_log

ROOT = Path(__file__).resolve().parents[2]

PATHS = {
    # kind: (served by, list path, a path the spoofing clients have no right to, resource, kubectl name)
    "local": ("cp-1", "/api/v1/namespaces/default/configmaps", "/api/v1/namespaces/kube-system/secrets",
              "configmaps", "configmap"),
    "rerouted": ("cp-2", "/apis/batch/v1/namespaces/default/jobs", "/apis/batch/v1/namespaces/kube-system/jobs",
                 "jobs", "job"),
}
KINDS = list(PATHS)
OTHER = {"cp-1": "cp-2", "cp-2": "cp-1"}
SPOOF = [("X-Remote-User", "system:admin"), ("X-Remote-Group", "system:masters")]
UID_FLAG = "--requestheader-uid-headers"  # added here (not by kubeadm), for the UID tests
CLIENT_IP = "127.0.0.99"  # clients bind this source address: Envoy's own connections come from 127.0.0.1

# Every attempt that must fail: (attempt, what it got). Printed by the last test.
ATTEMPTS: list[tuple[str, str]] = []
# (Audit-ID, the X-Remote-User cp-1's Envoy must have forwarded) of the header-spoofing requests
FORWARDED: list[tuple[str, str | None]] = []


def attempt(what: str, outcome: str):
    ATTEMPTS.append((what, outcome))
    print(f"ATTEMPT {what}\n    -> {outcome}")


class Creds:
    """Client certificates: kubeadm's, and minted ones (openssl) for the negative cases."""

    def __init__(self, kc: KubeadmCluster, d: Path):
        cp1 = kc.node("cp-1")
        pki = cp1.pki
        ca, cakey = pki / "ca.crt", pki / "ca.key"
        self.ca = ca
        self.admin = kubeconfig_credentials(cp1.kubeconfig("admin"), d)
        self.controller_manager = kubeconfig_credentials(cp1.kubeconfig("controller-manager"), d)
        self.nobody = mint_cert(d / "nobody", "kpp-nobody", ca_crt=ca, ca_key=cakey, orgs=["kpp:nobody"])
        self.impersonator = mint_cert(d / "impersonator", "kpp-impersonator", ca_crt=ca, ca_key=cakey)
        self.server_only = mint_cert(d / "server-only", "kpp-server-only", ca_crt=ca, ca_key=cakey,
                                     orgs=["system:masters"], eku="serverAuth")
        other_ca = mint_cert(d / "other-ca", "kpp-other-ca", ca_crt=None, ca_key=None)
        self.other_ca = mint_cert(d / "other-ca-admin", "kubernetes-admin", ca_crt=other_ca[0], ca_key=other_ca[1],
                                  orgs=["system:masters"])
        # A cluster-CA certificate whose CN is the front-proxy's: anyone whose CSR the cluster CA signs
        # could have one.
        self.fp_cn_cluster_ca = mint_cert(d / "fp-cn-cluster-ca", "front-proxy-client", ca_crt=ca, ca_key=cakey)
        # The real front-proxy client certificate (front-proxy CA) and one from that CA with another CN.
        self.front_proxy = (pki / "front-proxy-client.crt", pki / "front-proxy-client.key")
        self.fp_other_cn = mint_cert(d / "fp-other-cn", "kpp-not-a-proxy", ca_crt=pki / "front-proxy-ca.crt",
                                     ca_key=pki / "front-proxy-ca.key")
        self.other_ca_root = other_ca


class Env:
    def __init__(self, kc: KubeadmCluster, creds: Creds):
        self.kc, self.creds = kc, creds
        self.cp1, self.cp2 = kc.node("cp-1"), kc.node("cp-2")

    def via(self, path: str, cert=None, **kw):
        """Through cp-1's Envoy."""
        if cert:
            kw["cert"], kw["key"] = cert
        return self.cp1.via(path, **kw)

    def served(self, resp, node: str, timeout: float = 10.0) -> dict:
        """The audit event of resp on `node`; asserts the other node never saw it."""
        aid = resp.audit_id
        assert aid, f"no Audit-Id on {resp!r}"
        ev = self.kc.node(node).audit_event(aid, timeout)
        assert not self.kc.node(OTHER[node]).has_audit_id(aid), f"{aid} also audited on {OTHER[node]}"
        return ev

    def kubeconfig(self, name: str, cert=None, token=None) -> Path:
        d = self.kc.workdir / "kubeconfigs"
        d.mkdir(exist_ok=True)
        kw = {"token": token}
        if cert:
            kw["cert"], kw["key"] = cert
        return write_kubeconfig(d / f"{name}.json", f"https://{self.cp1.node_ip}:{APISERVER_PORT}", self.creds.ca,
                                **kw)

    def kubectl(self, kubeconfig: Path, *args, check=True, timeout=60, input=None):
        return self.kc.kubectl_run(kubeconfig, *args, check=check, timeout=timeout, input=input)


def who(ev: dict) -> str:
    u = ev.get("user", {})
    s = f"user={u.get('username')!r} groups={u.get('groups')}"
    if u.get("extra"):
        s += f" extra={u['extra']}"
    if ev.get("impersonatedUser"):
        s += f" impersonated={ev['impersonatedUser'].get('username')!r}"
    return s


@pytest.fixture(scope="module")
def env(request, tmp_path_factory):
    t0 = time.monotonic()
    kc = KubeadmCluster(tmp_path_factory.mktemp("kubeadm"), [("cp-1", "batch/v1=false"), ("cp-2", "")])
    for n in kc.nodes.values():
        # the UID header (RemoteRequestHeaderUID, on in 1.36; kubeadm sets no such flag): a client's copy
        # must never reach an apiserver that would believe it
        n.extra_flags[UID_FLAG] = "X-Remote-Uid"
    try:
        kc.start()
        e = Env(kc, Creds(kc, kc.workdir / "creds"))
        # cp-1's Envoy reroutes batch/v1 once its snapshot knows cp-2 serves it
        harness.wait_until(lambda: e.via(PATHS["rerouted"][1], e.creds.admin).status == 200, 30,
                           message="batch/v1 through cp-1's Envoy")
    except BaseException:
        print(kc.dump())
        kc.stop()
        raise
    kc.timings["fixture total"] = round(time.monotonic() - t0, 2)
    print(f"\nkubeadm control plane up: {kc.timings}\nRBAC for kube-peer-proxy: {kc.rbac_source}\n"
          f"workdir {kc.workdir}")
    try:
        # tests/k8s/conftest.py appends session.kpp_env.dump() (logs) to a failing test's report
        with dumped(request, kc):
            yield e
    finally:
        t1 = time.monotonic()
        kc.stop()
        print(f"\nkubeadm control plane stopped in {time.monotonic() - t1:.1f}s")


@pytest.fixture(autouse=True)
def _timing(request):
    t0 = time.monotonic()
    yield
    print(f"\n[{request.node.name}: {time.monotonic() - t0:.2f}s]")


def refused(fn) -> str | None:
    """None if fn() got an HTTP answer (then the caller fails), else the TLS/connection error."""
    try:
        r = fn()
    except (ssl.SSLError, ConnectionError, OSError) as e:
        return f"{type(e).__name__}: {e}"
    return None if r is None else f"HTTP {r.status}"


# ---- the node layout -------------------------------------------------------------------------------

def test_bootstraps_validate_and_verify_every_hop(env, tmp_path):
    for n in (env.cp1, env.cp2):
        r = harness.validate_config(n.envoy_yaml, tmp_path / n.name)
        assert r.returncode == 0, r.stdout + r.stderr
        print(f"{n.name}: envoy --mode validate OK")
        b = json.loads(n.envoy_yaml)

        def secret(ref):
            """The PKI file(s) an SDS reference resolves to (the files pki-reload watches)."""
            doc = json.loads(Path(ref["sds_config"]["path_config_source"]["path"]).read_text())["resources"][0]
            assert doc["name"] == ref["name"]
            if "validation_context" in doc:
                return doc["validation_context"]["trusted_ca"]["filename"]
            return doc["tls_certificate"]["certificate_chain"]["filename"]

        for c in b["static_resources"]["clusters"]:
            tls = c["transport_socket"]["typed_config"]
            v = tls["common_tls_context"]["combined_validation_context"]
            assert secret(v["validation_context_sds_secret_config"]) == str(n.pki / "ca.crt"), c["name"]
            assert v["default_validation_context"]["match_typed_subject_alt_names"] == [
                {"san_type": "DNS", "matcher": {"exact": SNI}}]
            if c["name"] == "local-anon":
                # The certless twin for requests without an asserted identity (tokens, anonymous).
                assert "tls_certificate_sds_secret_configs" not in tls["common_tls_context"], c["name"]
                continue
            (cert,) = tls["common_tls_context"]["tls_certificate_sds_secret_configs"]
            assert secret(cert) == str(n.pki / "front-proxy-client.crt")
        listeners = {l["name"]: l for l in b["static_resources"]["listeners"]}
        main = listeners["apiserver"]["filter_chains"][0]["transport_socket"]["typed_config"]
        peer = listeners["peers"]["filter_chains"][0]["transport_socket"]["typed_config"]
        assert main.get("require_client_certificate") in (False, None)
        assert secret(main["common_tls_context"]["validation_context_sds_secret_config"]) == str(n.pki / "ca.crt")
        assert peer["require_client_certificate"] is True
        assert secret(peer["common_tls_context"]["validation_context_sds_secret_config"]) == \
            str(n.pki / "front-proxy-ca.crt")
        for l in (main, peer):
            (cert,) = l["common_tls_context"]["tls_certificate_sds_secret_configs"]
            assert secret(cert) == str(n.pki / "apiserver.crt")
        assert listeners["apiserver"]["address"]["socket_address"] == {"address": n.node_ip, "port_value": 6443}
        assert listeners["peers"]["address"]["socket_address"] == {"address": n.node_ip, "port_value": 6444}
        # Only a request that carries an identity the proxy asserted (X-Remote-User) goes out with
        # the front-proxy certificate; everything else to the certless twin.
        for name in ("apiserver", "peers"):
            hcm = listeners[name]["filter_chains"][0]["filters"][0]["typed_config"]
            routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
            local = [r for r in routes if r["route"].get("cluster") in ("local", "local-anon")]
            assert [(r["route"]["cluster"], [h["name"] for h in r["match"].get("headers", [])]) for r in local] == \
                [("local", ["x-remote-user"]), ("local-anon", [])], (name, local)
    static_pod = ROOT / "deploy" / "static-pod.yaml"
    r = env.kubectl(env.cp1.kubeconfig("admin"), "apply", "--dry-run=client", "-f", str(static_pod))
    print(f"deploy/static-pod.yaml: {r.stdout.strip()}")
    assert "(dry run)" in r.stdout


def test_apiservers_run_kubeadms_flags(env):
    for n in (env.cp1, env.cp2):
        changed = n.changed_flags()
        print(f"{n.name}: kubeadm's manifest {n.manifest}, {len(n.kubeadm_command) - 1} flags; changed/added:")
        for k, (theirs, ours) in changed.items():
            print(f"    {k}: {theirs!r} -> {ours!r}")
        assert set(changed) <= set(OVERRIDES) | {UID_FLAG}, set(changed) - set(OVERRIDES)
        flags = dict(a.split("=", 1) for a in n.kubeadm_command[1:])
        assert flags["--advertise-address"] == n.doc_ip  # kubeadm's view; never used to connect
        assert flags["--requestheader-allowed-names"] == "front-proxy-client"
        assert flags["--requestheader-username-headers"] == "X-Remote-User"
        assert flags["--requestheader-group-headers"] == "X-Remote-Group"
        assert flags["--requestheader-extra-headers-prefix"] == "X-Remote-Extra-"
        assert not any("192.0.2." in a for a in n.apiserver_flags()), "a documentation-only address is used"
        # kubeadm's kubeconfigs: admin/super-admin name controlPlaneEndpoint (the node's Envoy),
        # controller-manager/scheduler the node's advertise address (on a real node: the same Envoy)
        assert n.kubeconfig_server("admin") == f"https://{n.node_ip}:6443"
        assert n.kubeconfig_server("controller-manager") == f"https://{n.doc_ip}:6443"


def test_the_rerouted_path_really_is_served_by_cp2_only(env):
    r1 = env.cp1.direct(PATHS["rerouted"][1])
    r2 = env.cp2.direct(PATHS["rerouted"][1])
    assert (r1.status, r2.status) == (404, 200), (r1, r2)
    r = env.via(PATHS["rerouted"][1], env.creds.admin)
    assert r.status == 200, r
    ev = env.served(r, "cp-2")
    print(f"batch/v1 direct: cp-1 {r1.status}, cp-2 {r2.status}; through cp-1's Envoy {r.status}, "
          f"audited on cp-2 as {who(ev)}")


def test_discovery_runs_as_the_proxy_identity(env):
    for n in (env.cp1, env.cp2):
        evs = [e for e in n.audit_events() if e.get("requestURI") in ("/api", "/apis")
               and e["user"]["username"] == render.DISCOVERY_USER]
        assert evs, f"no discovery request as {render.DISCOVERY_USER} on {n.name}"
        assert all(e["responseStatus"]["code"] in (200, 304) for e in evs[-4:]), evs[-4:]
        print(f"{n.name}: {len(evs)} discovery requests as {who(evs[-1])}")


# ---- the ordinary clients ----------------------------------------------------------------------------

def job(name: str) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "busybox"}]}}}}


def configmap(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
            "data": {"k": "v"}}


def audited(node, pred, timeout=10.0):
    return harness.wait_until(lambda: [e for e in node.audit_events() if pred(e)], timeout,
                              interval=0.2, message=f"audit event on {node.name}")


@pytest.mark.parametrize("kind", KINDS)
def test_admin_conf_get_create_watch_delete(env, kind):
    serving, _, _, resource, singular = PATHS[kind]
    node, other = env.kc.node(serving), env.kc.node(OTHER[serving])
    kc = env.cp1.kubeconfig("admin")  # kubeadm's own admin.conf: https://127.0.0.11:6443, client cert
    name = f"kpp-admin-{kind}-{uuid.uuid4().hex[:6]}"
    obj = configmap(name) if kind == "local" else job(name)
    r = env.kubectl(kc, "create", "-f", "-", input=json.dumps(obj))
    print(r.stdout.strip())
    got = json.loads(env.kubectl(kc, "get", resource, name, "-o", "json").stdout)
    assert got["metadata"]["name"] == name
    out = Path(env.kc.workdir / f"watch-{name}.out")
    watch_env = {"KUBECACHEDIR": str(env.kc.workdir / "kubecache" / "watch")}
    with open(out, "w") as f:
        w = subprocess.Popen([env.kc.kubectl, f"--kubeconfig={kc}", "get", resource, "--watch",
                              "--output-watch-events", "-o", "jsonpath={.type} {.object.metadata.name}{\"\\n\"}",
                              "--request-timeout=5s"], stdout=f, stderr=subprocess.STDOUT,
                             env={**os.environ, **watch_env})
        try:
            harness.wait_until(lambda: f"ADDED {name}" in out.read_text(), 15, message=f"watch {out.read_text()}")
            r = env.kubectl(kc, "delete", resource, name)
            print(r.stdout.strip())
            harness.wait_until(lambda: f"DELETED {name}" in out.read_text(), 15, message=f"watch {out.read_text()}")
        finally:
            try:
                w.wait(20)  # --request-timeout ends it
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(10)
    print(f"watch saw: {out.read_text().strip()!r}")
    # served by the right apiserver, as kubernetes-admin
    for verb in ("create", "get", "watch", "delete"):
        def match(e, verb=verb):
            return (e["verb"] == verb and e.get("objectRef", {}).get("resource") == resource
                    and e["user"]["username"] == "kubernetes-admin"
                    and (verb == "watch" or e.get("objectRef", {}).get("name") == name))
        evs = audited(node, match)
        assert not [e for e in other.audit_events() if match(e)], f"{verb} also on {other.name}"
        print(f"  {verb}: audited on {node.name} as {who(evs[-1])}")


@pytest.mark.parametrize("kind", KINDS)
def test_certificate_user_without_rbac_gets_403(env, kind):
    serving, path, _, resource, _ = PATHS[kind]
    r = env.via(path, env.creds.nobody)
    assert r.status == 403, r
    assert 'User \\"kpp-nobody\\"' in r.body.decode() or 'User "kpp-nobody"' in r.body.decode(), r
    ev = env.served(r, serving)
    assert ev["user"]["username"] == "kpp-nobody"
    assert "kpp:nobody" in ev["user"]["groups"]
    kc = env.kubeconfig("nobody", cert=env.creds.nobody)
    k = env.kubectl(kc, "get", resource, check=False)
    assert k.returncode != 0 and "forbidden" in k.stderr.lower(), k.stderr
    print(f"{kind}: {r.status}, audited on {serving} as {who(ev)}; kubectl: {k.stderr.strip().splitlines()[-1]}")


@pytest.mark.parametrize("kind", KINDS)
def test_controller_manager_identity_and_client_source_ip_in_audit(env, kind):
    serving, path, _, _, _ = PATHS[kind]
    # kubeadm's controller-manager.conf, pointed at the node IP (see KubeadmNode.node_kubeconfig)
    kc = env.cp1.node_kubeconfig("controller-manager")
    r = env.via(path, env.creds.controller_manager, source=CLIENT_IP,
                headers=[("X-Forwarded-For", "203.0.113.7")])  # a client's own XFF must not count
    assert r.status == 200, r
    ev = env.served(r, serving)
    assert ev["user"]["username"] == "system:kube-controller-manager", who(ev)
    assert ev["sourceIPs"][0] == CLIENT_IP, ev["sourceIPs"]
    assert "203.0.113.7" not in ev["sourceIPs"], ev["sourceIPs"]
    k = env.kubectl(kc, "get", "--raw", path)
    assert json.loads(k.stdout)["items"] is not None
    print(f"{kind}: {r.status} audited on {serving} as {who(ev)}, sourceIPs={ev['sourceIPs']}")
    # Observation, not a requirement: for a peer at exactly 127.0.0.1 Envoy's use_remote_address
    # appends its own first non-loopback address instead (Envoy's loopback special case).
    r0 = env.via(path, env.creds.controller_manager)
    print(f"  the same from 127.0.0.1: sourceIPs={env.served(r0, serving)['sourceIPs']}")


@pytest.mark.parametrize("kind", KINDS)
def test_token_user_authenticates_through_envoy(env, kind):
    serving, path, _, resource, _ = PATHS[kind]
    r = env.via(path, token=env.kc.token, source=CLIENT_IP)
    assert r.status == 200, r
    ev = env.served(r, serving)
    assert ev["user"]["username"] == TOKEN_USER and TOKEN_GROUP in ev["user"]["groups"], who(ev)
    assert ev["sourceIPs"][0] == CLIENT_IP, ev["sourceIPs"]
    k = env.kubectl(env.kubeconfig("token", token=env.kc.token), "get", resource)
    print(f"{kind}: {r.status} audited on {serving} as {who(ev)}; kubectl get {resource}: rc {k.returncode}")


def test_http2_through_envoy(env):
    crt, key = env.creds.admin
    for kind in KINDS:
        serving, path = PATHS[kind][0], PATHS[kind][1]
        aid = str(uuid.uuid4())
        r = subprocess.run(["curl", "-sS", "--http2", "--cacert", str(env.creds.ca), "--cert", str(crt),
                            "--key", str(key), "-H", f"Audit-ID: {aid}", "-o", "/dev/null",
                            "-w", "%{http_version} %{http_code}", f"https://{env.cp1.node_ip}:6443{path}"],
                           capture_output=True, text=True, timeout=30)
        assert r.stdout == "2 200", (r.stdout, r.stderr)
        ev = env.kc.node(serving).audit_event(aid)
        print(f"{kind}: curl --http2 -> HTTP/{r.stdout}; audited on {serving} as {who(ev)}")
    h2 = env.cp1.envoy.stats("http.apiserver.downstream_cx_http2_total")
    assert h2.get("http.apiserver.downstream_cx_http2_total", 0) > 0  # kubectl (client-go) used h2 too
    print(f"cp-1 Envoy h2 connections so far: {h2}")


def test_upgrades_pass_through(env):
    import websocket  # websocket-client, in the venv

    crt, key = env.creds.admin
    admin_kc = env.cp1.kubeconfig("admin")
    for kind in KINDS:
        serving, path, _, resource, _ = PATHS[kind]
        name = f"kpp-ws-{kind}-{uuid.uuid4().hex[:6]}"
        ws = websocket.create_connection(f"wss://{env.cp1.node_ip}:6443{path}?watch=true",
                                         sslopt={"ca_certs": str(env.creds.ca), "certfile": str(crt),
                                                 "keyfile": str(key)}, timeout=15)
        try:
            assert ws.getstatus() == 101
            obj = configmap(name) if kind == "local" else job(name)
            env.kubectl(admin_kc, "create", "-f", "-", input=json.dumps(obj))
            deadline = time.monotonic() + 30  # (each recv is bounded by the 15 s socket timeout)
            while True:
                ev = json.loads(ws.recv())
                if ev["object"]["metadata"]["name"] == name:
                    break
                assert time.monotonic() < deadline, f"no event for {name} on the websocket watch"
            assert ev["type"] == "ADDED"
        finally:
            ws.close()
        env.kubectl(admin_kc, "delete", resource, name, "--wait=false")
        # (Envoy writes the access log entry when the upgraded stream ends)
        entries = from_access_log(env.cp1.envoy, lambda: [e for e in env.cp1.access_entries() if e["code"] == 101
                                                          and e["path"] == path + "?watch=true"],
                                  message="no 101 in cp-1's access log")
        want = "local" if serving == "cp-1" else "peer-cp-2"
        assert entries[-1]["cluster"] == want, entries[-1]
        print(f"{kind}: websocket watch 101 via cluster {entries[-1]['cluster']}, event {ev['type']} {name}")
    # SPDY (what kubectl exec/attach/port-forward fall back to): no kubelet here, so the pod is missing;
    # the apiserver's own 404 Status (audited on cp-1) shows the upgrade request got through Envoy.
    aid = str(uuid.uuid4())
    r = env.via("/api/v1/namespaces/default/pods/kpp-missing/exec?command=true&stdout=true", env.creds.admin,
                method="POST", headers=[("Connection", "Upgrade"), ("Upgrade", "SPDY/3.1"),
                                        ("X-Stream-Protocol-Version", "v4.channel.k8s.io"), ("Audit-ID", aid)])
    assert r.status == 404 and r.json()["details"]["name"] == "kpp-missing", r
    ev = env.cp1.audit_event(aid)
    print(f"SPDY exec upgrade of a missing pod: {r.status} {r.json()['message']!r}, audited on cp-1 "
          f"({ev['objectRef']}) as {who(ev)}")


# ---- impersonation --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_impersonation_needs_the_permission(env, kind):
    serving, _, _, resource, _ = PATHS[kind]
    node = env.kc.node(serving)
    nobody = env.kubeconfig("nobody", cert=env.creds.nobody)
    # kubectl reads discovery first. Not yet cached, that read is refused under --as too, and kubectl
    # prints only "Error from server (Forbidden): unknown" (the same straight to the apiserver); with
    # it cached, as kpp-nobody's own kubectl leaves it, the refusal printed is the request's own.
    env.kubectl(nobody, "get", resource, "-n", "kube-system", check=False)
    no = env.kubectl(nobody, "--as=system:admin",
                     "--as-group=system:masters", "get", resource, "-n", "kube-system", check=False)
    assert no.returncode != 0 and "cannot impersonate" in no.stderr, no.stderr
    attempt(f"[{kind}] kubectl --as=system:admin --as-group=system:masters as kpp-nobody (no impersonate right)",
            "kubectl exit %d: %s" % (no.returncode, no.stderr.strip().splitlines()[-1]))
    yes = env.kubectl(env.kubeconfig("impersonator", cert=env.creds.impersonator), "--as=system:admin",
                      "--as-group=system:masters", "get", resource, "-n", "kube-system", "-o", "name")
    evs = audited(node, lambda e: e["user"]["username"] == "kpp-impersonator"
                  and e.get("impersonatedUser", {}).get("username") == "system:admin"
                  and e.get("objectRef", {}).get("resource") == resource and e["verb"] == "list")
    print(f"{kind}: with the impersonate right: rc {yes.returncode}; audited on {serving} as {who(evs[-1])}, "
          f"code {evs[-1]['responseStatus']['code']}")
    assert evs[-1]["responseStatus"]["code"] == 200


# ---- spoofing: every attempt must fail -----------------------------------------------------------------

CLIENTS = ["anonymous", "token", "certificate"]


def client_kw(env, client):
    if client == "token":
        return {"token": env.kc.token}
    if client == "certificate":
        return {"cert": env.creds.nobody[0], "key": env.creds.nobody[1]}
    return {}


REAL = {"anonymous": "system:anonymous", "token": TOKEN_USER, "certificate": "kpp-nobody"}


SPOOF_HEADERS = {
    "x-remote-user+group": SPOOF,
    "mixed-case": [("x-REMOTE-user", "system:admin"), ("X-REMOTE-GROUP", "system:masters")],
    "extra+user": [("X-Remote-Extra-Scopes", "everything"), ("x-remote-extra-acme.io%2fscope", "all")] + SPOOF,
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("headers", list(SPOOF_HEADERS.values()), ids=list(SPOOF_HEADERS))
def test_client_sent_identity_headers_are_never_believed(env, kind, client, headers):
    serving, _, privileged, _, _ = PATHS[kind]
    aid = str(uuid.uuid4())
    r = env.cp1.via(privileged, headers=headers + [("Audit-ID", aid)], **client_kw(env, client))
    hdrs = ", ".join(f"{k}: {v}" for k, v in headers)
    ev = env.served(r, serving)
    u = ev.get("user", {})
    attempt(f"[{kind}] {client} client sends {hdrs} -> GET {privileged}",
            f"HTTP {r.status}; audit on {serving}: {who(ev)}")
    assert r.status == 403, r
    assert u.get("username") != "system:admin" and "system:masters" not in (u.get("groups") or []), who(ev)
    assert not u.get("extra"), who(ev)
    if client == "anonymous":
        assert u.get("username") == "system:anonymous", who(ev)
    else:
        assert u["username"] == REAL[client], who(ev)
    # checked by the closing test (Envoy flushes its access log every 10 s): the X-Remote-User that
    # cp-1's Envoy forwarded, after the filter, is the real certificate identity or nothing
    FORWARDED.append((aid, REAL[client] if client == "certificate" else None))


def test_client_sent_identity_headers_over_http2(env):
    for kind in KINDS:
        serving, _, privileged, _, _ = PATHS[kind]
        aid = str(uuid.uuid4())
        r = subprocess.run(["curl", "-sS", "--http2", "--cacert", str(env.creds.ca), "-H", f"Audit-ID: {aid}",
                            "-H", f"Authorization: Bearer {env.kc.token}", "-H", "X-Remote-User: system:admin",
                            "-H", "X-Remote-Group: system:masters", "-H", "X-Remote-Extra-Scopes: all",
                            "-o", "/dev/null", "-w", "%{http_version} %{http_code}",
                            f"https://{env.cp1.node_ip}:6443{privileged}"], capture_output=True, text=True, timeout=30)
        ev = env.kc.node(serving).audit_event(aid)
        attempt(f"[{kind}] token client over HTTP/2 sends X-Remote-User/Group/Extra -> GET {privileged}",
                f"HTTP/{r.stdout}; audit on {serving}: {who(ev)}")
        assert r.stdout == "2 403", r
        assert ev["user"]["username"] == TOKEN_USER and not ev["user"].get("extra"), who(ev)


def test_certificate_from_another_ca_is_refused(env):
    why = refused(lambda: env.via(PATHS["local"][1], env.creds.other_ca))
    attempt("client certificate CN=kubernetes-admin O=system:masters from another CA -> cp-1:6443", str(why))
    assert why and "HTTP" not in why


def test_cluster_ca_certificate_without_client_auth_purpose_is_refused(env):
    why = refused(lambda: env.via(PATHS["local"][1], env.creds.server_only))
    attempt("cluster-CA certificate with extendedKeyUsage=serverAuth only (O=system:masters) -> cp-1:6443",
            str(why))
    assert why and "HTTP" not in why
    stats = env.cp1.envoy.stats(r"listener\..*6443\.ssl\.fail_verify_error")
    assert sum(stats.values()) > 0, stats


def test_front_proxy_cn_from_the_cluster_ca(env):
    fp = env.creds.fp_cn_cluster_ca
    # the peer listener only trusts the front-proxy CA
    why = refused(lambda: request(env.cp2.node_ip, PEER_PORT, PATHS["local"][1], ca=env.creds.ca, cert=fp[0],
                                  key=fp[1], headers=SPOOF))
    attempt("cluster-CA certificate CN=front-proxy-client + X-Remote-User: system:admin -> cp-2 peer listener "
            f"{env.cp2.node_ip}:{PEER_PORT}", str(why))
    assert why and "HTTP" not in why
    # the client listener takes it as what it is: an ordinary user called front-proxy-client
    for kind in KINDS:
        serving, _, privileged, _, _ = PATHS[kind]
        r = env.via(privileged, fp, headers=SPOOF)
        ev = env.served(r, serving)
        attempt(f"[{kind}] cluster-CA certificate CN=front-proxy-client + X-Remote-User: system:admin "
                f"-> cp-1:6443 GET {privileged}", f"HTTP {r.status}; audit on {serving}: {who(ev)}")
        assert r.status == 403 and ev["user"]["username"] == "front-proxy-client", who(ev)


def test_peer_listener_without_client_certificate_is_refused(env):
    why = refused(lambda: request(env.cp2.node_ip, PEER_PORT, PATHS["local"][1], ca=env.creds.ca,
                                  token=env.kc.token, headers=SPOOF))
    attempt(f"no client certificate (token + X-Remote-User: system:admin) -> cp-2 peer listener "
            f"{env.cp2.node_ip}:{PEER_PORT}", str(why))
    assert why and "HTTP" not in why


def test_peer_listener_takes_only_the_front_proxy_cn(env):
    # front-proxy CA, but not CN front-proxy-client: TLS passes, the peer gate says no (as the apiserver)
    r = request(env.cp2.node_ip, PEER_PORT, PATHS["local"][1], ca=env.creds.ca, cert=env.creds.fp_other_cn[0],
                key=env.creds.fp_other_cn[1], headers=SPOOF)
    attempt(f"front-proxy-CA certificate CN=kpp-not-a-proxy + X-Remote-User: system:admin -> cp-2 peer listener",
            f"HTTP {r.status} {r.body[:60]!r}")
    assert r.status == 401 and b"not an allowed front proxy" in r.body, r
    # the real front-proxy client (what cp-1's Envoy presents) is what the peer listener is for
    aid = str(uuid.uuid4())
    r = request(env.cp2.node_ip, PEER_PORT, PATHS["local"][1], ca=env.creds.ca, cert=env.creds.front_proxy[0],
                key=env.creds.front_proxy[1], headers=[("X-Remote-User", "kpp-peer-check"), ("Audit-ID", aid)])
    ev = env.cp2.audit_event(aid)
    print(f"front-proxy-client (front-proxy CA) asserting kpp-peer-check on the peer listener: {r.status}, "
          f"audited on cp-2 as {who(ev)}")
    assert r.status == 403 and ev["user"]["username"] == "kpp-peer-check"
    # and the real front-proxy certificate is no client certificate on the client listener
    why = refused(lambda: env.via(PATHS["local"][1], env.creds.front_proxy, headers=SPOOF))
    attempt("front-proxy-client certificate (front-proxy CA) + X-Remote-User: system:admin -> cp-1:6443 "
            "(client listener trusts the cluster CA only)", str(why))
    assert why and "HTTP" not in why


# The outside review's certificates: signed by the front-proxy CA, with SANs that spell an allowed
# name. kube-apiserver's --requestheader-allowed-names compares the subject CN only (x509.go
# verifySubject; Go's CommonName is the last CN in certificate order); the peer listener must answer
# each exactly as the apiserver does when the same certificate is sent to it directly.
PEER_CERTS = {  # case: (mint_cert keywords, kube-apiserver accepts it as a front proxy)
    "CN=evil-proxy, DNS SAN front-proxy-client": ({"cn": "evil-proxy", "sans": "DNS:front-proxy-client"}, False),
    "CN=evil-proxy, DNS SAN 'CN=front-proxy-client'": ({"cn": "evil-proxy", "sans": "DNS:CN=front-proxy-client"},
                                                       False),
    "CN=evil-proxy, URI SAN 'CN=front-proxy-client'": ({"cn": "evil-proxy", "sans": "URI:CN=front-proxy-client"},
                                                       False),
    "CN=evil-proxy, email SAN front-proxy-client": ({"cn": "evil-proxy", "sans": "email:front-proxy-client"}, False),
    "CN=evil-proxy, IP SAN": ({"cn": "evil-proxy", "sans": "IP:127.0.0.12"}, False),
    "O=front-proxy-client, CN=evil-proxy": ({"cn": "evil-proxy", "orgs": ["front-proxy-client"]}, False),
    "CN=front-proxy-client then CN=evil-proxy": ({"cn": "x", "subject": "/CN=front-proxy-client/CN=evil-proxy"},
                                                 False),
    "CN=evil-proxy then CN=front-proxy-client": ({"cn": "x", "subject": "/CN=evil-proxy/CN=front-proxy-client"},
                                                 True),
    "CN=front-proxy-client, DNS SAN evil-proxy": ({"cn": "front-proxy-client", "sans": "DNS:evil-proxy"}, True),
}


@pytest.mark.parametrize("case", list(PEER_CERTS))
def test_peer_listener_answers_front_proxy_certificates_as_kube_apiserver_does(env, tmp_path, case):
    kw, accepted = PEER_CERTS[case]
    kw = dict(kw)
    pki = env.cp2.pki
    cert = mint_cert(tmp_path / "peer", kw.pop("cn"), ca_crt=pki / "front-proxy-ca.crt",
                     ca_key=pki / "front-proxy-ca.key", **kw)
    path = PATHS["local"][2]  # kube-system secrets: only system:masters may list them
    # The attack asserts system:admin; a certificate the apiserver accepts is a real front proxy, which
    # may assert anyone: it asserts an unprivileged user instead (the closing test checks that no
    # audit event anywhere has system:admin).
    asserted = [("X-Remote-User", "kpp-peer-check")] if accepted else SPOOF
    got = {}
    for where, (host, port, sni) in {"direct": (env.cp2.apiserver_ip, APISERVER_PORT, SNI),
                                     "peer listener": (env.cp2.node_ip, PEER_PORT, None)}.items():
        aid = str(uuid.uuid4())
        r = request(host, port, path, ca=env.creds.ca, cert=cert[0], key=cert[1], sni=sni,
                    headers=asserted + [("Audit-ID", aid)])
        got[where] = (r.status, aid)
    outcome = f"HTTP {got['peer listener'][0]} (kube-apiserver directly: HTTP {got['direct'][0]})"
    if accepted:
        print(f"front-proxy-CA certificate {case} asserting kpp-peer-check -> cp-2 peer listener: {outcome}")
    else:
        attempt(f"front-proxy-CA certificate {case} + X-Remote-User: system:admin -> cp-2 peer listener", outcome)
    assert got["peer listener"][0] == got["direct"][0], got
    if accepted:
        assert got["direct"][0] == 403
        ev = env.cp2.audit_event(got["peer listener"][1])
        assert ev["user"]["username"] == "kpp-peer-check", who(ev)
    else:
        assert got["direct"][0] == 401
        # The audit log is written in blocking mode: had the gate let the request through, its event
        # would be in the log by the time the answer came back. A later request's event, once there,
        # shows the log is current (a bounded wait instead of a guess at how long writing takes).
        marker = str(uuid.uuid4())
        env.cp2.direct("/version", headers=[("Audit-ID", marker)])
        env.cp2.audit_event(marker)
        assert not env.cp2.has_audit_id(got["peer listener"][1]), "the gate let it reach the apiserver"


@pytest.mark.parametrize("client", CLIENTS)
def test_client_sent_uid_and_real_ip_never_reach_the_apiserver(env, client):
    """X-Remote-Uid (the apiservers here run with --requestheader-uid-headers=X-Remote-Uid) and
    X-Real-Ip (kube-apiserver's sourceIPs) from a client are removed; the control sends the same to the
    apiserver directly, where both are believed."""
    serving, path = "cp-1", PATHS["local"][1]
    spoof = [("X-Remote-Uid", "spoofed-uid"), ("x-remote-UID", "spoofed-uid-2"), ("X-Real-Ip", "203.0.113.9")]
    aid = str(uuid.uuid4())
    r = env.cp1.via(path, headers=spoof + [("Audit-ID", aid)], source=CLIENT_IP, **client_kw(env, client))
    ev = env.served(r, serving)
    attempt(f"{client} client sends X-Remote-Uid: spoofed-uid, X-Real-Ip: 203.0.113.9 -> GET {path}",
            f"HTTP {r.status}; audit on {serving}: {who(ev)} uid={ev['user'].get('uid')!r} "
            f"sourceIPs={ev['sourceIPs']}")
    assert not (ev["user"].get("uid") or "").startswith("spoofed"), ev["user"]
    if client == "token":
        assert ev["user"].get("uid") == "kpp-token-uid", ev["user"]  # the token file's UID, as without a proxy
    assert "203.0.113.9" not in ev["sourceIPs"] and ev["sourceIPs"][0] == CLIENT_IP, ev["sourceIPs"]
    if client != "certificate":
        return
    # control: the same headers from a front proxy, straight to the apiserver, are believed
    aid = str(uuid.uuid4())
    d = env.cp1.direct(path, cert=env.creds.front_proxy[0], key=env.creds.front_proxy[1],
                       headers=[("X-Remote-User", "kpp-nobody")] + spoof + [("Audit-ID", aid)])
    dev = env.cp1.audit_event(aid)
    print(f"control, front proxy straight to the apiserver: HTTP {d.status}, uid={dev['user'].get('uid')!r}, "
          f"sourceIPs={dev['sourceIPs']}")
    assert dev["user"].get("uid") == "spoofed-uid" and "203.0.113.9" in dev["sourceIPs"], dev


def test_a_certificate_uid_is_asserted_in_the_uid_header_or_refused(env, tmp_path):
    """A client certificate with Kubernetes' user-UID attribute: the apiserver's x509 authenticator
    gives the user that UID. Through the kubeadm profile (no UID header configured, as kubeadm
    configures none) the request is refused rather than forwarded without it; with the UID header
    configured (render_kubeadm requestheader uid_headers, --requestheader-uid-headers on the
    apiservers) the asserted user has the same UID as directly."""
    cp1 = env.cp1
    cert = mint_cert(tmp_path / "uid", "x", ca_crt=env.creds.ca, ca_key=cp1.pki / "ca.key",
                     subject="/O=kpp:uid-users/CN=kpp-uid-user/k8suid=kpp-uid-1234")
    path = PATHS["local"][1]
    aid = str(uuid.uuid4())
    d = cp1.direct(path, cert=cert[0], key=cert[1], headers=[("Audit-ID", aid)])
    direct_user = cp1.audit_event(aid)["user"]
    assert direct_user["username"] == "kpp-uid-user" and direct_user.get("uid") == "kpp-uid-1234", direct_user
    r = env.via(path, cert)
    attempt("certificate with a user UID through the kubeadm profile (no UID header configured)",
            f"HTTP {r.status} {r.body[:100]!r}")
    assert r.status == 401 and b"UID" in r.body, r
    admin = harness.free_port()
    rh = {**render.KUBEADM_REQUESTHEADER, "uid_headers": ["x-remote-uid"]}
    yaml = cp1.render_envoy([], env.kc.wasm, node_ip="127.0.0.17", admin_port=admin, requestheader=rh,
                            access_log=str(tmp_path / "access.log"))
    envoy = harness.Envoy(yaml, "kubeadm-uid", admin, workdir=tmp_path / "envoy", log_level="info",
                          component_log_level="wasm:info")
    try:
        envoy.start(timeout=60)
        aid = str(uuid.uuid4())
        v = request("127.0.0.17", APISERVER_PORT, path, ca=env.creds.ca, cert=cert[0], key=cert[1], sni=SNI,
                    headers=[("Audit-ID", aid), ("X-Remote-Uid", "spoofed")])
        via_user = cp1.audit_event(aid)["user"]
    finally:
        envoy.stop()
    print(f"directly: {d.status} {direct_user}; with the UID header configured: {v.status} {via_user}")
    assert v.status == d.status
    assert {k: via_user.get(k) for k in ("username", "uid")} == {k: direct_user.get(k) for k in ("username", "uid")}
    assert "kpp:uid-users" in via_user["groups"]


@pytest.mark.parametrize("layer", ["filter-only", "envoy-only"])
def test_each_layer_alone_removes_client_identity_headers(env, tmp_path, layer):
    """Defence in depth: cp-1's bootstrap with one of the two layers taken out (a test-only edit of
    render_kubeadm's output) still never forwards a client's identity headers."""
    cp1 = env.cp1
    admin = harness.free_port()
    b = json.loads(cp1.render_envoy([], env.kc.wasm, node_ip="127.0.0.17", admin_port=admin,
                                    access_log=str(tmp_path / "access.log")))
    hcm = b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    if layer == "filter-only":
        assert hcm.pop("early_header_mutation_extensions")
    else:
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "envoy.filters.http.wasm"]
        b.pop("bootstrap_extensions")
    envoy = harness.Envoy(json.dumps(b), f"kubeadm-{layer}", admin, workdir=tmp_path / "envoy",
                          log_level="info", component_log_level="wasm:info")
    clients = {"token": {"token": env.kc.token}}
    if layer == "filter-only":  # without the filter nothing asserts a certificate's identity
        clients["certificate"] = {"cert": env.creds.nobody[0], "key": env.creds.nobody[1]}
    headers = [("X-Remote-User", "system:admin"), ("x-REMOTE-group", "system:masters"),
               ("X-Remote-Extra-Scopes", "everything"), ("X-REMOTE-EXTRA-acme", "all")]
    try:
        envoy.start(timeout=60)
        if layer == "filter-only":
            envoy.wait_snapshot(30)
        for client, kw in clients.items():
            aid = str(uuid.uuid4())
            r = request("127.0.0.17", APISERVER_PORT, PATHS["local"][2], ca=env.creds.ca, sni=SNI,
                        headers=headers + [("Audit-ID", aid)], **kw)
            ev = cp1.audit_event(aid)
            attempt(f"[{layer}] {client} client sends {', '.join(k for k, _ in headers)} "
                    f"-> GET {PATHS['local'][2]}", f"HTTP {r.status}; audit on cp-1: {who(ev)}")
            assert r.status == 403, r
            assert ev["user"]["username"] == REAL[client] and not ev["user"].get("extra"), who(ev)
            assert "system:masters" not in ev["user"]["groups"], who(ev)
    finally:
        envoy.stop()


@pytest.mark.parametrize("kind", KINDS)
def test_anonymous_client_is_system_anonymous(env, kind):
    """No certificate, no token: the request must reach the apiserver exactly as without the proxy.
    Envoy sends it through the certless twin of the cluster (a front-proxy certificate with no
    username header would make the apiserver's x509 authenticator fail, and anonymous requests would
    get 401 instead of being system:anonymous)."""
    got = {}
    for path in ("/version", "/healthz", "/livez", "/readyz"):
        d = env.cp1.direct(path, cert=None, key=None, token="")
        v = env.cp1.via(path)
        got[path] = (d.status, v.status)
    print(f"anonymous (direct, via Envoy): {got}")
    assert all(d == v == 200 for d, v in got.values()), got
    serving, path, _, _, _ = PATHS[kind]
    r = env.via(path)
    ev = env.served(r, serving)
    assert r.status == 403, r
    assert ev["user"]["username"] == "system:anonymous", who(ev)
    print(f"{kind}: anonymous GET {path}: HTTP {r.status}, audited on {serving} as {who(ev)}")


# ---- upstream TLS is verified -------------------------------------------------------------------------

class Impostor:
    """A TLS server that records every connection, handshake and byte of HTTP it receives."""

    def __init__(self, host: str, port: int, cert: tuple[Path, Path]):
        self.ctx = server_tls(*cert)
        self.sock = socket.create_server((host, port))
        self.sock.settimeout(0.5)
        self.connections = self.handshakes = 0
        self.requests: list[bytes] = []
        self.errors: list[str] = []
        self._stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            self.connections += 1
            conn.settimeout(3)
            try:
                tls = self.ctx.wrap_socket(conn, server_side=True)
                self.handshakes += 1
                data = tls.recv(65536)
                if data:
                    self.requests.append(data[:200])
                tls.close()
            except (ssl.SSLError, OSError) as e:
                self.errors.append(f"{type(e).__name__}: {e}")
                conn.close()

    def stop(self):
        self._stop = True
        self.thread.join(5)
        self.sock.close()


def test_upstream_tls_fails_closed_against_impostors(env, tmp_path):
    cp1 = env.cp1
    # impostor 1 on the local apiserver address: another CA, the right SAN
    other_ca = env.creds.other_ca_root
    cert_a = mint_cert(tmp_path / "impostor-a", "kube-apiserver", ca_crt=other_ca[0], ca_key=other_ca[1],
                       eku="serverAuth", sans=f"DNS:{SNI},IP:127.0.1.19")
    # impostor 2 on a peer listener: the cluster CA (any CSR the cluster CA signs), without the SAN
    cert_b = mint_cert(tmp_path / "impostor-b", "kube-apiserver", ca_crt=env.creds.ca, ca_key=cp1.pki / "ca.key",
                       eku="serverAuth", sans="DNS:impostor.example,IP:127.0.0.18")
    a = Impostor("127.0.1.19", APISERVER_PORT, cert_a)
    b = Impostor("127.0.0.18", PEER_PORT, cert_b)
    admin = harness.free_port()
    render.write_kubeadm_sds(tmp_path / "sds", cp1.pki, tmp_path / "reload")
    (tmp_path / "reload").mkdir()
    yaml = render.render_kubeadm(node="cp-9", node_ip="127.0.0.19", apiserver=("127.0.1.19", APISERVER_PORT),
                                 wasm_path=str(env.kc.wasm), peers=[("imp", "127.0.0.18")],
                                 admin_port=admin, port=APISERVER_PORT, peer_port=PEER_PORT,
                                 access_log=str(tmp_path / "access.log"), sds_dir=str(tmp_path / "sds"))
    envoy = harness.Envoy(yaml, "kubeadm-impostor", admin, workdir=tmp_path / "envoy", log_level="info",
                          component_log_level="wasm:info")
    try:
        envoy.start(timeout=60)
        # discovery tried both at least once
        harness.wait_until(lambda: a.connections and b.connections, 20, message="envoy never dialled the impostors")
        results = {}
        for kind in KINDS:
            r = request("127.0.0.19", APISERVER_PORT, PATHS[kind][1], ca=env.creds.ca, cert=env.creds.admin[0],
                        key=env.creds.admin[1], sni=SNI)
            results[kind] = r.status
            assert r.status == 503, r

        def fail_verify(both=False):
            s = envoy.stats(r"cluster\.(local|peer-imp)\.ssl\.fail_verify")
            if both:  # Envoy has counted both kinds of failed handshake (asserted below with what was seen)
                return s if s.get("cluster.local.ssl.fail_verify_error", 0) > 0 and \
                    s.get("cluster.peer-imp.ssl.fail_verify_san", 0) > 0 else None
            return s
        try:
            stats = harness.wait_until(lambda: fail_verify(both=True), 20, 0.2)
        except AssertionError:
            stats = fail_verify()
        print(f"through an Envoy whose apiserver and peer are impostors: {results}; {stats}")
        print(f"impostor a (other CA): {a.connections} connections, {a.handshakes} handshakes, "
              f"{len(a.requests)} HTTP requests, errors {a.errors[:2]}")
        print(f"impostor b (cluster CA, no SAN {SNI}): {b.connections} connections, {b.handshakes} handshakes, "
              f"{len(b.requests)} HTTP requests, errors {b.errors[:2]}")
        assert stats.get("cluster.local.ssl.fail_verify_error", 0) > 0, stats
        assert stats.get("cluster.peer-imp.ssl.fail_verify_san", 0) > 0, stats
        assert a.requests == [] and b.requests == [], (a.requests, b.requests)
        attempt("Envoy's upstream (local apiserver) is an impostor with another CA's certificate",
                f"clients got {results}; impostor saw {len(a.requests)} HTTP requests")
        attempt("Envoy's peer is an impostor with a cluster-CA certificate lacking SAN kubernetes.default.svc",
                f"impostor saw {len(b.requests)} HTTP requests (cluster.peer-imp.ssl.fail_verify_san="
                f"{stats.get('cluster.peer-imp.ssl.fail_verify_san')})")
    finally:
        envoy.stop()
        a.stop()
        b.stop()


# ---- the closing note ---------------------------------------------------------------------------------

def test_zz_closing_note_every_attempt_failed(env):
    if not FORWARDED:
        # run without the spoofing tests (alone, or -k): make the requests they make, with their checks
        for kind in KINDS:
            for client in CLIENTS:
                for headers in SPOOF_HEADERS.values():
                    test_client_sent_identity_headers_are_never_believed(env, kind, client, headers)
    want = dict(FORWARDED)

    def logged():
        got = {e["audit_id"]: e for e in env.cp1.access_entries() if e.get("audit_id") in want}
        return got if len(got) == len(want) else None
    entries = from_access_log(env.cp1.envoy, logged, message="spoofing requests in cp-1's access log",
                              interval=0.5)
    for aid, user in want.items():
        assert entries[aid]["user"] == user, entries[aid]
    print(f"cp-1's access log: the X-Remote-User forwarded for the {len(want)} header-spoofing requests was "
          f"{sorted({str(e['user']) for e in entries.values()})} (None: removed, nothing asserted)")
    for n in (env.cp1, env.cp2):
        bad = [e for e in n.audit_events()
               if e.get("user", {}).get("username") == "system:admin" and not e.get("impersonatedUser")]
        assert not bad, bad[:2]
        masters = {e["user"]["username"] for e in n.audit_events()
                   if "system:masters" in (e.get("user", {}).get("groups") or [])}
        assert masters <= {"kubernetes-super-admin"}, masters
    print(f"\n{len(ATTEMPTS)} attempts that had to fail, and what each got:")
    for what, outcome in ATTEMPTS:
        print(f"  - {what}\n      {outcome}")
    print("\nno audit event on any apiserver has the user system:admin (other than as an impersonation "
          "target with the impersonate right), and only kubeadm's super-admin is in system:masters")
