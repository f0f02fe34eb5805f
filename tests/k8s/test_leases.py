"""Lease mode against real kube-apiservers: peers come from the `kube-system` identity leases
(`apiserver.kubernetes.io/identity=kube-apiserver`) that every kube-apiserver writes, with their
address from the `kubernetes.io/peer-advertise-address` annotation (`--peer-advertise-ip/port`).

Own control plane (one etcd): `a` and `b` (v1.36.3) both lack `autoscaling/v2`, `a` also lacks
`batch/v1`; `c` (v1.36.3, everything) joins and leaves while a's Envoy runs. a's Envoy is in lease
mode: no peer is configured, one `ORIGINAL_DST` cluster reaches whatever address a lease names,
with upstream TLS verified against the cluster CA and the SAN `kubernetes.default.svc`.
"""

from __future__ import annotations

import datetime
import signal
import socket
import ssl
import subprocess
import threading
import time

import pytest

from kpp.testing import harness
from kpp.testing.cluster import DEFAULT_VERSION, ControlPlane
from kpp.testing.envoyfront import Front
from kpp.testing.proc import server_tls
from k8senv import from_access_log, http

JOBS = "/apis/batch/v1/namespaces/default/jobs"
HPAS = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers"
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"
SELECTOR = "?labelSelector=apiserver.kubernetes.io%2Fidentity%3Dkube-apiserver"

# What the discovery identity needs in lease mode besides system:discovery.
LEASE_RBAC = [
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
     "metadata": {"name": "kube-peer-proxy-leases", "namespace": "kube-system"},
     "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list"]}]},
    {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
     "metadata": {"name": "kube-peer-proxy-leases", "namespace": "kube-system"},
     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kube-peer-proxy-leases"},
     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kpp-discovery"}]},
]


class LeaseEnv:
    def __init__(self, workdir):
        self.cp = ControlPlane(workdir, [("a", DEFAULT_VERSION, "batch/v1=false,autoscaling/v2=false"),
                                         ("b", DEFAULT_VERSION, "autoscaling/v2=false")],
                               kubectl=str(harness.tool("kubectl")), advertise=True)
        self.front = None

    def start(self):
        self.cp.start()
        self.cp.apply(LEASE_RBAC)
        a = self.cp.servers["a"]
        self.front = Front(self.cp, a, self.cp.workdir / "front-a", leases={"local_hostname": a.hostname})
        self.front.start()
        return self

    def stop(self):
        if self.front:
            self.front.stop()
        self.cp.stop()

    def via(self, path, **kw):
        kw.setdefault("token", self.cp.tokens["kpp-admin"])
        return http(self.front.url, path, ca=self.cp.ca, **kw)

    def direct(self, path, **kw):
        return http(self.cp.servers["a"].url, path, ca=self.cp.ca, token=self.cp.admin_token, **kw)

    def leases(self) -> dict[str, dict]:
        """hostname → identity lease."""
        r = self.direct(LEASES + SELECTOR)
        assert r.status == 200, r
        return {i["metadata"]["labels"].get("kubernetes.io/hostname", ""): i for i in r.json()["items"]}

    def dump(self) -> str:
        out = []
        for s in self.cp.servers.values():
            out += [f"===== kube-apiserver {s.name} =====", s.proc.log_tail(30) if s.proc else ""]
        if self.front:
            out += ["===== envoy a =====", self.front.envoy.log_tail(60)]
        return "\n".join(out)


@pytest.fixture(scope="module")
def lenv(request, tmp_path_factory):
    e = LeaseEnv(tmp_path_factory.mktemp("leases"))
    try:
        e.start()
    except BaseException:
        print(e.dump())
        e.stop()
        raise
    previous = getattr(request.session, "kpp_env", None)
    request.session.kpp_env = e  # conftest prints these logs when a test fails
    yield e
    request.session.kpp_env = previous
    e.stop()


def wait_status(lenv, path, want: int, timeout: float, allowed=(503,)) -> tuple[float, list[int]]:
    """Polls `path` through a's Envoy until it answers `want`; returns (seconds, codes seen)."""
    t0, seen = time.monotonic(), []

    def ok():
        r = lenv.via(path)
        seen.append(r.status)
        assert r.status in (want, *allowed), (r, seen[-20:])
        return r.status == want
    harness.wait_until(ok, timeout, 0.25, message=f"{path} did not answer {want} within {timeout}s: {seen[-20:]}")
    return time.monotonic() - t0, seen


def test_the_leases_carry_the_peer_address(lenv):
    leases = lenv.leases()
    for s in lenv.cp.servers.values():
        lease = leases[s.hostname]
        assert lease["metadata"]["annotations"]["kubernetes.io/peer-advertise-address"] == f"127.0.0.1:{s.port}"
        assert lease["spec"]["holderIdentity"].startswith(lease["metadata"]["name"] + "_")


def test_a_peer_learned_from_its_lease_serves_what_only_it_has(lenv):
    b = lenv.cp.servers["b"]
    assert lenv.direct(JOBS).status == 404, "a itself does not serve batch/v1"
    r = lenv.via(JOBS, headers={"Audit-ID": "kpp-lease-jobs-1"})
    assert r.status == 200, r
    entry = from_access_log(lenv.front.envoy, lambda: next((e for e in lenv.front.access_entries()
                                                             if e["audit_id"] == "kpp-lease-jobs-1"), None))
    assert entry["cluster"] == "peers-by-address" and entry["upstream_host"] == f"127.0.0.1:{b.port}", entry
    assert entry["peer_proxied"] == "true"
    # Nobody serves autoscaling/v2 and every member's API set is known: the genuine 404 stands.
    assert lenv.via(HPAS).status == 404


def test_a_server_joins_while_envoy_runs_and_leaves_when_stopped(lenv):
    c = lenv.cp.add_server("c", DEFAULT_VERSION, "")
    # Until a's Envoy has read c's lease the 404 is genuine; once c is a member but not yet learned,
    # 503; then c serves it.
    took, seen = wait_status(lenv, HPAS, 200, 60, allowed=(404, 503))
    print(f"c routable {took:.1f}s after it was ready; codes before: {sorted(set(seen))}")
    r = lenv.via(HPAS, headers={"Audit-ID": "kpp-lease-hpa-1"})
    assert r.status == 200
    harness.wait_until(lambda: any(e["auditID"] == "kpp-lease-hpa-1" for e in c.audit_events()), 10,
                       message="the request did not reach c")
    # A graceful stop deletes c's identity lease: c leaves, and the 404 is genuine again.
    c.stop(signal.SIGTERM)
    assert "kpp-apiserver-c" not in lenv.leases(), "a gracefully stopped kube-apiserver deletes its lease"
    took, seen = wait_status(lenv, HPAS, 404, 30)
    print(f"c left {took:.1f}s after its stop returned; codes meanwhile: {sorted(set(seen))}")


def test_a_killed_server_gives_503_until_its_lease_expires(lenv):
    c = lenv.cp.add_server("c", DEFAULT_VERSION, "")
    wait_status(lenv, HPAS, 200, 60, allowed=(404, 503))
    c.stop(signal.SIGKILL)
    assert "kpp-apiserver-c" in lenv.leases(), "a killed kube-apiserver leaves its lease behind"
    # While the lease lives (3600 s by default) c is a member: what only it served is a 503. The claim is
    # about a stretch of time, so this samples it for 8 s (the sleep paces the samples; it waits for nothing).
    deadline = time.monotonic() + 8
    codes = []
    while time.monotonic() < deadline:
        r = lenv.via(HPAS)
        codes.append(r.status)
        if r.status == 503:
            assert r.headers.get("retry-after"), r
        time.sleep(0.2)
    assert set(codes) == {503}, codes
    # Expire the lease the way time would: renewTime + leaseDurationSeconds in the past.
    lease = lenv.leases()["kpp-apiserver-c"]
    past = (datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=30)).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")
    r = lenv.direct(f"{LEASES}/{lease['metadata']['name']}", method="PATCH",
                    body={"spec": {"renewTime": past, "leaseDurationSeconds": 10}},
                    headers={"Content-Type": "application/merge-patch+json"})
    assert r.status == 200, r
    took, _ = wait_status(lenv, HPAS, 404, 20)
    print(f"expired lease: c left within {took:.1f}s")


class Impostor:
    """A TLS server with a certificate from another CA, counting connections and HTTP requests."""

    def __init__(self, workdir):
        key, crt = workdir / "impostor.key", workdir / "impostor.crt"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(crt), "-days", "1", "-subj", "/CN=kubernetes.default.svc",
                        "-addext", "subjectAltName=DNS:kubernetes.default.svc,IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
        self.ctx = server_tls(crt, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.settimeout(5)  # the handshake too
            try:
                with self.ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.settimeout(2)
                    if tls.recv(1024):
                        self.requests += 1
                        tls.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            except (OSError, ssl.SSLError):
                pass

    def close(self):
        self.sock.close()


def test_a_forged_lease_cannot_send_requests_to_an_impostor(lenv, tmp_path):
    """Whoever can write kube-system leases can name any address; upstream TLS verification (cluster
    CA + SAN) stops the proxy from talking to it. The forged member is never learned, so while it
    exists 404s that might be false are answered 503 (fail safe, not fail open)."""
    impostor = Impostor(tmp_path)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    forged = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
              "metadata": {"name": "apiserver-forged", "namespace": "kube-system",
                           "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver",
                                      "kubernetes.io/hostname": "kpp-impostor"},
                           "annotations": {"kubernetes.io/peer-advertise-address": f"127.0.0.1:{impostor.port}"}},
              "spec": {"holderIdentity": "apiserver-forged_1", "leaseDurationSeconds": 3600, "renewTime": now}}
    r = lenv.direct(LEASES, method="POST", body=forged)
    assert r.status == 201, r
    try:
        harness.wait_until(lambda: impostor.connections >= 2, 20,
                           message="the proxy never tried the forged lease's address")
        # Envoy refused the impostor's certificate (a connection it refuses carries no request): wait
        # for those refusals to be counted rather than for a fixed time
        harness.wait_until(lambda: sum(v for k, v in lenv.front.envoy.stats("ssl").items()
                                       if k.startswith("cluster.peers-by-address.ssl.fail_verify")) >= 2, 20, 0.2,
                           message="Envoy never refused the impostor's certificate")
        assert impostor.requests == 0, "TLS to a peer must be verified: an impostor got an HTTP request"
        # Its API set can never be learned: a 404 nobody is known to serve might be false now.
        r = lenv.via(HPAS)
        assert r.status == 503 and r.headers.get("retry-after"), r
        assert lenv.via(JOBS).status == 200, "what a known member serves still routes"
    finally:
        lenv.direct(f"{LEASES}/apiserver-forged", method="DELETE")
        impostor.close()
    wait_status(lenv, HPAS, 404, 20)
    stats = lenv.front.envoy.stats("ssl")
    failures = sum(v for k, v in stats.items() if k.startswith("cluster.peers-by-address.ssl.fail_verify"))
    assert failures >= 1, {k: v for k, v in stats.items() if "peers-by-address" in k}
    print(f"impostor: {impostor.connections} TLS connections refused, {failures} verification failures")
