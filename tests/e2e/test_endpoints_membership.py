"""Membership from the `default/kubernetes` EndpointSlice (`lease_discovery.source: "kubernetes_endpoints"`),
through real Envoy with the real .wasm.

Every kube-apiserver's lease endpoint reconciler writes the live servers' `--advertise-address` into that
slice, all at one `--secure-port`. Here fake apiservers stand in on their own loopback addresses at one
shared port, over one store holding the slice (the fake writes it in the reconciler's wire format,
tests/fake_apiserver): a (old API set) at 127.0.0.11, b and c (new) at .12 and .13, and an impostor (new)
at .14 whose certificate comes from another CA. Every hop is TLS, verified against the cluster CA with
the SAN `kubernetes.default.svc`, as the kubeadm profile does. One Envoy in front of a; it names every
member by its IP, itself too.

* A peer listed in the slice is learned and routed to (a type only it serves).
* A peer that leaves the slice is dropped within a round or two, and one that joins is learned.
* Before the first slice is read (none exists: `--endpoint-reconciler-type=none`), membership is unknown
  and a possibly-false 404 is a 503; the log says what to check; once a slice exists the 404 stands, and
  a slice that goes away again keeps the last good membership.
* A slice that does not list this server (written before the reconciler saw it, up to 10 s after a start,
  or local_address is not its --advertise-address) is not used: counted as decode, logged with what to
  check; membership stays unknown (503s) or the last good one is kept.
* A slice naming the impostor's address: Envoy refuses its certificate, so it never gets a request and a
  type only it serves is a 503, never its answer. The control, the same Envoy without upstream
  verification, is served by the impostor: the certificate check is what stops it.
"""

from __future__ import annotations

import socket
import time

import pytest

from kpp import render
from kpp.testing import harness
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.kubeadm_node import mint_cert
from kpp.testing.proc import request, served_by, server_tls
from kpp.testing.topology import COMMON, FAST, NEW_ONLY, NOWHERE

A, B, C, EVIL = "127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"
SLICE_PATH = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"
FRESH = "wasmcustom.kube_peer_proxy_server_fresh;server="
# FAST refreshes every 500 ms; "within a round or two" with room for a loaded 2-core machine.
ROUNDS = 2 * 0.5 + 2.0


def shared_port() -> int:
    """A port free on every fake's address (apiservers share --secure-port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((A, 0))
            port = s.getsockname()[1]
        try:
            for ip in (A, B, C, EVIL):
                with socket.socket() as t:
                    t.bind((ip, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on all fake addresses")


class Env:
    def __init__(self, tmp, envoys):
        self.tmp, self.envoys = tmp, envoys
        sans = "DNS:kubernetes.default.svc," + ",".join(f"IP:{ip}" for ip in (A, B, C, EVIL))
        self.ca = mint_cert(tmp / "pki" / "ca", "kubernetes", ca_crt=None, ca_key=None, days=30)
        serving = mint_cert(tmp / "pki" / "apiserver", "kube-apiserver", ca_crt=self.ca[0], ca_key=self.ca[1],
                            eku="serverAuth", sans=sans)
        other_ca = mint_cert(tmp / "pki" / "other-ca", "kubernetes", ca_crt=None, ca_key=None, days=30)
        forged = mint_cert(tmp / "pki" / "impostor", "kube-apiserver", ca_crt=other_ca[0], ca_key=other_ca[1],
                           eku="serverAuth", sans=sans)
        self.port = shared_port()
        self.cluster = Cluster()
        tls = server_tls(*serving)
        self.fakes = {"a": self.cluster.start("a", self.port, "old", tls=tls, host=A),
                      "b": self.cluster.start("b", self.port, "new", tls=tls, host=B),
                      "c": self.cluster.start("c", self.port, "new", tls=tls, host=C),
                      "evil": self.cluster.start("evil", self.port, "new", tls=server_tls(*forged), host=EVIL)}

    def slice(self, *ips):
        self.cluster.set_kubernetes_endpoints(list(ips), self.port)

    def envoy(self, name="a", verify=True):
        """An Envoy in front of a, members from the slice; verify=False: upstream certificates unchecked."""
        listen, admin = harness.free_port(), harness.free_port()
        text = render.render_bootstrap(
            node=name, listen_port=listen, admin_port=admin, local=(A, self.port), peers=[],
            wasm_path=str(harness.wasm_path()), plugin=dict(FAST, local_name=A),
            upstream_tls_sni=render.KUBEADM_SNI, upstream_ca=str(self.ca[0]) if verify else None,
            leases={"source": "kubernetes_endpoints", "local_address": f"{A}:{self.port}"})
        envoy = self.envoys.start(text, name, admin, component_log_level="wasm:info")
        return envoy, listen

    def close(self):
        self.cluster.stop_all()


@pytest.fixture
def env(tmp_path, envoys):
    e = Env(tmp_path, envoys)
    yield e
    e.close()


def get(port, path):
    return request(f"http://127.0.0.1:{port}{path}")


def fresh_members(envoy) -> set[str]:
    return {k.removeprefix(FRESH) for k, v in envoy.stats("kube_peer_proxy_server_fresh").items()
            if k.startswith(FRESH) and v == 1}


def discovery_requests(fake) -> list[str]:
    return [q["path"] for q in fake.requests() if q["path"] in ("/api", "/apis")]


def timed_wait(predicate, timeout, message) -> float:
    t0 = time.monotonic()
    harness.wait_until(predicate, timeout, 0.05, message=message)
    return time.monotonic() - t0


def test_a_peer_listed_in_the_slice_is_routed_to(env):
    env.slice(A, B)
    envoy, port = env.envoy()
    envoy.wait_fresh([A, B], 20)
    assert fresh_members(envoy) == {A, B}, "named by IP, the local server too"
    r = get(port, NEW_ONLY)
    assert (r.status, served_by(r)) == (200, "b"), r
    r = get(port, COMMON)
    assert (r.status, served_by(r)) == (200, "a"), r
    # The slice was read through a (the local server), by its name, never listed.
    slice_reads = [q for q in env.fakes["a"].requests() if q["path"].startswith("/apis/discovery.k8s.io")]
    assert slice_reads and all(q["path"] == SLICE_PATH for q in slice_reads), slice_reads
    assert not any(q["path"].startswith("/apis/discovery.k8s.io") for q in env.fakes["b"].requests())
    assert discovery_requests(env.fakes["c"]) == [] and env.fakes["evil"].requests() == []


def test_a_peer_that_leaves_is_dropped_and_one_that_joins_is_learned(env):
    env.slice(A, B)
    envoy, port = env.envoy()
    envoy.wait_fresh([A, B], 20)
    assert served_by(get(port, NEW_ONLY)) == "b"

    # b leaves (shut down, or its master lease expired), c joins: one slice update, as the reconciler writes it.
    env.slice(A, C)
    took = timed_wait(lambda: fresh_members(envoy) == {A, C} and served_by(get(port, NEW_ONLY)) == "c", ROUNDS,
                      f"b not replaced by c within {ROUNDS}s: {fresh_members(envoy)}")
    print(f"b left and c joined within {took:.2f}s")
    env.fakes["b"].clear_requests()
    time.sleep(4 * 0.5)
    assert discovery_requests(env.fakes["b"]) == [], "a member that left is not asked any more"
    assert len(discovery_requests(env.fakes["c"])) >= 2

    # c leaves too: nobody else serves the new type, a's 404 stands (no member can vouch otherwise).
    env.slice(A)
    took = timed_wait(lambda: get(port, NEW_ONLY).status == 404, ROUNDS, "c was not dropped")
    print(f"c left within {took:.2f}s")
    r = get(port, NEW_ONLY)
    assert (r.status, served_by(r)) == (404, "a"), r
    assert fresh_members(envoy) == {A}


def test_before_the_first_slice_a_possibly_false_404_is_a_503(env):
    # No slice at all (--endpoint-reconciler-type=none): membership unknown, every member might serve it.
    envoy, port = env.envoy()
    envoy.wait_snapshot(20)
    r = get(port, NOWHERE)
    assert r.status == 503 and r.headers.get("retry-after") and "kube-peer-proxy" in r.text, r
    assert get(port, COMMON).status == 200, "what the local server serves still passes"
    harness.wait_until(lambda: "--endpoint-reconciler-type" in envoy.log_text(), 10,
                       message="the log does not say what to check")
    line = next(l for l in envoy.log_text().splitlines() if "--endpoint-reconciler-type" in l)
    print(line.strip())
    assert "EndpointSlice default/kubernetes" in line and "HTTP 404" in line, line
    errors = envoy.stats("discovery_sync_errors")
    assert any("type=http_status" in k and f"server={A}" in k and v >= 1 for k, v in errors.items()), errors

    # The slice appears (only a in it): membership known, nobody serves the type, the 404 stands.
    env.slice(A)
    timed_wait(lambda: get(port, NOWHERE).status == 404, ROUNDS, "the 404 never stood once the slice existed")
    # The slice goes away again: the last good membership is kept (the 404 still stands) and it is counted.
    before = sum(v for k, v in envoy.stats("discovery_sync_errors").items() if "type=http_status" in k)
    env.cluster.delete_kubernetes_endpoints()
    harness.wait_until(lambda: sum(v for k, v in envoy.stats("discovery_sync_errors").items()
                                   if "type=http_status" in k) >= before + 2, 10,
                       message="a missing slice was not counted")
    r = get(port, NOWHERE)
    assert (r.status, served_by(r)) == (404, "a"), r


def decode_errors(envoy) -> int:
    return sum(v for k, v in envoy.stats("discovery_sync_errors").items() if "type=decode" in k and f"server={A}" in k)


def test_a_slice_that_does_not_list_this_server_is_not_used(env):
    """The apiservers write the slice from the master leases they see when they reconcile (every 10 s): right
    after a server starts, the slice can list only the others, and a slice written from a view without this
    server may lack more. Such a slice is not used: before any membership it stays unknown (a possibly-false
    404 is a 503), later the last good membership is kept; counted as decode, and the log says what to check."""
    env.slice(B)
    envoy, port = env.envoy()
    envoy.wait_snapshot(20)
    harness.wait_until(lambda: decode_errors(envoy) >= 2, 10, message="a slice without this server was not counted")
    for path in (NOWHERE, NEW_ONLY):
        r = get(port, path)
        assert r.status == 503 and r.headers.get("retry-after") and "kube-peer-proxy" in r.text, (path, r)
    assert get(port, COMMON).status == 200, "what the local server serves still passes"
    assert discovery_requests(env.fakes["b"]) == [], "a member of a slice that was not used was asked"
    lines = [l for l in envoy.log_text().splitlines() if "does not list this server" in l]
    assert lines, "the log does not say the slice lacks this server"
    print(lines[-1].strip())
    assert (f"EndpointSlice default/kubernetes does not list this server ({A})" in lines[-1]
            and "(decode)" in lines[-1] and "lease_discovery.local_address" in lines[-1]
            and "--advertise-address" in lines[-1]), lines[-1]

    # The reconciler catches up and lists this server too: the membership is used at once.
    env.slice(A, B)
    timed_wait(lambda: get(port, NOWHERE).status == 404, ROUNDS, "the slice listing this server was not used")
    envoy.wait_fresh([A, B], 10)
    r = get(port, NEW_ONLY)
    assert (r.status, served_by(r)) == (200, "b"), r

    # Without this server again (a writer with an incomplete view): the last good membership is kept; c, only
    # in the unusable slice, never joins, and b, missing from it, does not leave.
    before = decode_errors(envoy)
    env.slice(C)
    harness.wait_until(lambda: decode_errors(envoy) >= before + 2, 10, message="the second bad slice was not counted")
    r = get(port, NEW_ONLY)
    assert (r.status, served_by(r)) == (200, "b"), r
    assert get(port, NOWHERE).status == 404, "the last good membership (a, b) still stands"
    assert fresh_members(envoy) == {A, B}
    assert discovery_requests(env.fakes["c"]) == []


def fail_verify(envoy) -> int:
    return sum(v for k, v in envoy.stats("ssl").items()
               if k.startswith(f"cluster.{render.LEASE_CLUSTER}.ssl.fail_verify"))


def test_a_slice_naming_an_impostor_is_never_served(env):
    """Whoever can write the slice (the apiservers; anyone granted update on endpointslices in default) can
    name any address; TLS to every peer is verified against the cluster CA, so no request reaches an
    address whose server cannot prove it is an apiserver. Its API set is never learned: a type only it
    serves is a 503 while it is listed (fail safe, not fail open)."""
    env.slice(A, B, EVIL)
    envoy, port = env.envoy()
    envoy.wait_fresh([A, B], 20)
    harness.wait_until(lambda: fail_verify(envoy) >= 2, 10, 0.1,
                       message="Envoy never refused the impostor's certificate")
    r = get(port, NEW_ONLY)
    assert (r.status, served_by(r)) == (200, "b"), r
    env.slice(A, EVIL)  # now only the impostor would serve the new type
    harness.wait_until(lambda: fresh_members(envoy) == {A}, ROUNDS, message="b did not leave")
    for _ in range(5):
        r = get(port, NEW_ONLY)
        assert r.status == 503 and r.headers.get("retry-after") and served_by(r) != "evil", r
        time.sleep(0.2)
    assert (get(port, COMMON).status, served_by(get(port, COMMON))) == (200, "a")
    assert env.fakes["evil"].requests() == [], "an impostor got an HTTP request"
    assert EVIL not in fresh_members(envoy)
    print(f"impostor: {fail_verify(envoy)} certificates refused, no request")


def test_control_without_upstream_verification_the_impostor_is_served(env):
    env.slice(A, EVIL)
    envoy, port = env.envoy(name="a-unverified", verify=False)
    envoy.wait_fresh([A, EVIL], 20)
    r = get(port, NEW_ONLY)
    assert (r.status, served_by(r)) == (200, "evil"), r
    assert discovery_requests(env.fakes["evil"]), "the impostor was never asked"
