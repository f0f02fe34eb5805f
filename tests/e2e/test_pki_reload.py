"""Renewed PKI files reach a running Envoy (the kubeadm profile), however they are written.

Envoy reads every PKI file of the kubeadm profile through a file-based SDS secret
(`kpp.render.kubeadm_sds_files`) and re-reads the files only when something is renamed into the
secrets' watched directory. `kubeadm certs renew` and `kubeadm upgrade` (Go's os.WriteFile) and `cp`
rewrite a file in place, which Envoy alone never notices (the control test shows it), so the static
pod runs `pki-reload` beside Envoy: it renames a marker into that directory whenever a PKI file
changes. Here the loop is the manifest's own command (`kpp.pki_reload`).

Two nodes as on a kubeadm cluster: Envoy A and Envoy B (client listener, peer listener) in front of
fake apiservers a (old API set) and b (new) that speak TLS with certificates from the same cluster CA
and echo the serial of the client certificate each connection presented. Requests for what only b
serves go from A's filter to B's peer listener (front-proxy CA) and on to b.

Measured and asserted: new handshakes present a renewed serving certificate within RELOAD_BOUND for
a kubeadm-style in-place write, `cp` and an atomic `mv`; upstream connections opened after a
front-proxy-client renewal present it; a CA bundle holding the old and the new CA is honoured for
client and upstream verification (and a CA outside it is refused); under load (keep-alive and
new-connection clients, local and rerouted, and watches) no request fails and the watches opened
before the changes keep streaming; a half-written certificate and a key that does not match keep the
last good pair, counted in `sds.serving.key_rotation_failed` and named by pki-reload's log.
(tests/k8s/test_pki_renewal.py does the same with the real kubeadm and kube-apiserver.) The same
TLS node setup also shows that a single control-plane node needs no peers.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from kpp import pki_reload, render
from kpp.testing import harness
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.kubeadm_node import mint_cert, openssl
from kpp.testing.proc import client_tls, server_tls
from kpp.testing.tlsload import TlsLoad
from kpp.testing.topology import COMMON, FAST, NEW_ONLY

SNI = render.KUBEADM_SNI
RELOAD_BOUND = 10.0  # seconds: the bound for new handshakes to show a renewed serving certificate


# ---- PKI ---------------------------------------------------------------------------------------------

def serial_of(crt: Path) -> str:
    return openssl("x509", "-noout", "-serial", "-in", str(crt)).strip().split("=", 1)[1].upper()


class Pki:
    """A kubeadm-shaped PKI (file names as in /etc/kubernetes/pki) for two nodes, made with openssl."""

    def __init__(self, d: Path):
        self.d = d
        self.ca = mint_cert(d / "ca" / "ca1", "kubernetes", ca_crt=None, ca_key=None)
        self.fp_ca = mint_cert(d / "ca" / "fp1", "front-proxy-ca", ca_crt=None, ca_key=None)
        # the CAs a rotation moves to
        self.ca2 = mint_cert(d / "ca" / "ca2", "kubernetes-2", ca_crt=None, ca_key=None)
        self.fp_ca2 = mint_cert(d / "ca" / "fp2", "front-proxy-ca-2", ca_crt=None, ca_key=None)
        self.n = 0

    def mint(self, cn, ca, **kw) -> tuple[Path, Path]:
        self.n += 1
        return mint_cert(self.d / "minted" / f"{self.n}-{cn}", cn, ca_crt=ca[0], ca_key=ca[1], **kw)

    def serving(self, ip: str, ca=None):
        return self.mint("kube-apiserver", ca or self.ca, eku="serverAuth", sans=f"DNS:{SNI},IP:{ip}")

    def front_proxy_client(self, ca=None):
        return self.mint("front-proxy-client", ca or self.fp_ca)

    def node_dir(self, name: str, ip: str) -> Path:
        pki = self.d / name
        pki.mkdir(parents=True)
        shutil.copy(self.ca[0], pki / "ca.crt")
        shutil.copy(self.fp_ca[0], pki / "front-proxy-ca.crt")
        for (crt, key), base in ((self.serving(ip), "apiserver"), (self.front_proxy_client(), "front-proxy-client")):
            shutil.copy(crt, pki / f"{base}.crt")
            shutil.copy(key, pki / f"{base}.key")
            os.chmod(pki / f"{base}.key", 0o600)
        return pki


# The ways a renewed file lands. kubeadm (certutil.WriteCert / keyutil.WriteKey: os.WriteFile) and cp
# truncate and rewrite the existing file; mv replaces it with another inode.
def write_in_place(src: Path, dst: Path):
    with open(dst, "wb") as f:  # O_WRONLY|O_CREAT|O_TRUNC, like Go's os.WriteFile
        f.write(src.read_bytes())


def write_cp(src: Path, dst: Path):
    subprocess.run(["cp", str(src), str(dst)], check=True)


def write_mv(src: Path, dst: Path):
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.copy(src, tmp)
    os.rename(tmp, dst)


WRITERS = {"kubeadm-style in place": write_in_place, "cp": write_cp, "mv": write_mv}


def install(pair, pki: Path, base: str, writer=write_in_place):
    """Certificate first, then key, as kubeadm writes them (there is a moment where they do not match)."""
    writer(pair[0], pki / f"{base}.crt")
    writer(pair[1], pki / f"{base}.key")


def presented_serial(ip: str, port: int, ca: Path) -> str:
    """The serial of the serving certificate a new TLS handshake gets (verified against ca)."""
    ctx = client_tls(ca, check_hostname=False)
    with socket.create_connection((ip, port), timeout=5) as s, ctx.wrap_socket(s) as t:
        return t.getpeercert()["serialNumber"].upper()


def wait_serial(ip, port, ca, want, bound) -> float:
    """Seconds until new handshakes present `want`; fails past `bound`."""
    t0 = time.monotonic()
    seen = None
    while time.monotonic() - t0 < bound:
        seen = presented_serial(ip, port, ca)
        if seen == want:
            return time.monotonic() - t0
        time.sleep(0.1)
    raise AssertionError(f"{ip}:{port} still presents {seen} {bound}s after the change, want {want}")


# ---- nodes -------------------------------------------------------------------------------------------

def fake_tls(pki: Pki, ca=None) -> ssl.SSLContext:
    """A fake apiserver's TLS: a serving certificate from `ca` (default the cluster CA) with the SAN
    Envoy checks; client certificates asked for (and echoed) from either front-proxy CA, as an
    apiserver's --requestheader-client-ca-file holds both during a front-proxy CA rotation."""
    crt, key = pki.serving("127.0.0.1", ca)
    return server_tls(crt, key, client_cas=(pki.fp_ca[0], pki.fp_ca2[0]), client_cert=ssl.CERT_OPTIONAL)


class Node:
    def __init__(self, name, ip, pki: Pki, fake, envoys, work: Path, client_port, peer_port, with_reload=True):
        self.name, self.ip, self.fake, self.client_port, self.peer_port = name, ip, fake, client_port, peer_port
        self.envoys = envoys
        self.pki = pki.node_dir(name, ip)
        self.reload_dir = work / name / "reload"
        self.reload_dir.mkdir(parents=True)
        self.reload = (pki_reload.start(self.pki, self.reload_dir, work / name / "pki-reload.log",
                                        f"pki-reload-{name}") if with_reload else None)
        self.sds = render.write_kubeadm_sds(work / name / "sds", self.pki, self.reload_dir)
        self.admin = harness.free_port()

    def start(self, peers: list["Node"]):
        yaml = render.render_kubeadm(
            node=self.name, node_ip=self.ip, apiserver=("127.0.0.1", self.fake.port),
            wasm_path=str(harness.wasm_path()), peers=[(p.name, p.ip) for p in peers], admin_port=self.admin,
            port=self.client_port, peer_port=self.peer_port, sds_dir=str(self.sds), plugin=FAST)
        self.envoy = self.envoys.start(yaml, f"pki-{self.name}", self.admin, component_log_level="wasm:info")
        return self

    def stop(self):
        if self.reload:
            self.reload.stop()

    def reload_log(self) -> str:
        return self.reload.log_tail(200) if self.reload else ""

    def client_ctx(self, cert=None, ca: Path | None = None) -> ssl.SSLContext:
        return client_tls(ca or self.pki / "ca.crt", *(cert or ()), check_hostname=False)

    def get(self, path, cert=None, ca=None, timeout=10.0):
        conn = http.client.HTTPSConnection(self.ip, self.client_port, context=self.client_ctx(cert, ca),
                                           timeout=timeout)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()


def two_nodes(tmp_path, envoys, with_reload=True):
    pki = Pki(tmp_path / "pki")
    fakes = Cluster()
    fa = fakes.start("a", apiset="old", tls=fake_tls(pki))
    fb = fakes.start("b", apiset="new", tls=fake_tls(pki))
    port, peer_port = harness.free_port(), harness.free_port()
    a = Node("a", "127.0.0.21", pki, fa, envoys, tmp_path, port, peer_port, with_reload)
    b = Node("b", "127.0.0.22", pki, fb, envoys, tmp_path, port, peer_port, with_reload)
    a.start([b])
    b.start([a])
    # A's first round can run before B's Envoy listens; wait until each sees both as fresh.
    a.envoy.wait_fresh(["a", "b"], 30)
    b.envoy.wait_fresh(["a", "b"], 30)
    return pki, fakes, a, b


@pytest.fixture
def nodes(tmp_path, envoys):
    pki, fakes, a, b = two_nodes(tmp_path, envoys)
    yield pki, fakes, a, b
    for n in (a, b):
        n.stop()
    fakes.stop_all()


# ---- load --------------------------------------------------------------------------------------------

def load_through(node: Node, cert) -> TlsLoad:
    """Clients through node A while the files change: local and rerouted GETs with a client certificate
    (so the request carries an asserted identity upstream), keep-alive and on new connections, and a
    watch on each, fed by objects created through A."""
    kinds = {COMMON: ("apps/v1", "Deployment"), NEW_ONLY: ("resource.k8s.io/v1", "ResourceClaim")}
    creates = [(p, lambda n, api=api, kind=kind: {"apiVersion": api, "kind": kind,
                                                  "metadata": {"name": f"obj-{n}", "namespace": "default"}})
               for p, (api, kind) in kinds.items()]
    return TlsLoad(node.ip, node.client_port, lambda: node.client_ctx(cert), [COMMON, NEW_ONLY],
                   [COMMON, NEW_ONLY], creates)


def key_rotation_failed(node: Node) -> int:
    return node.envoy.stats().get("sds.serving.key_rotation_failed", 0)


# ---- the tests ---------------------------------------------------------------------------------------

def test_without_pki_reload_envoy_keeps_presenting_the_old_certificate(tmp_path, envoys):
    """The control: Envoy's own file watch reacts only to renames in the watched directory, so a
    kubeadm-style in-place write, `cp` and even a `mv` into the PKI directory are never noticed."""
    pki, fakes, a, b = two_nodes(tmp_path, envoys, with_reload=False)
    try:
        before = presented_serial(a.ip, a.client_port, a.pki / "ca.crt")
        assert before == serial_of(a.pki / "apiserver.crt")
        for how, writer in WRITERS.items():
            new = pki.serving(a.ip)
            install(new, a.pki, "apiserver", writer)
            time.sleep(RELOAD_BOUND if how == "kubeadm-style in place" else 3)
            seen = presented_serial(a.ip, a.client_port, a.pki / "ca.crt")
            print(f"without pki-reload, {how}: presents {seen}, the file has {serial_of(new[0])}")
            assert seen == before, f"{how}: Envoy picked the change up without pki-reload (the control changed)"
    finally:
        fakes.stop_all()


def test_renewed_files_are_picked_up_under_load_and_bad_files_keep_the_last_good_ones(nodes):
    pki, fakes, a, b = nodes
    alice = pki.mint("alice", pki.ca, orgs=("devs",))
    assert presented_serial(a.ip, a.client_port, a.pki / "ca.crt") == serial_of(a.pki / "apiserver.crt")
    for path in (COMMON, NEW_ONLY):
        status, headers, body = a.get(path, alice)
        assert status == 200, (path, status, body[:300])
    assert a.get(NEW_ONLY, alice)[1]["x-fake-apiserver"] == "b", "the rerouted path goes through B's peer listener"

    load = load_through(a, alice).start()
    try:
        harness.wait_until(lambda: all(load.watch_events.values()), 20, message="watches saw no events")
        times = {}
        # 1. the serving certificate, each way a renewed file lands
        for how, writer in WRITERS.items():
            new = pki.serving(a.ip)
            install(new, a.pki, "apiserver", writer)
            times[how] = wait_serial(a.ip, a.client_port, a.pki / "ca.crt", serial_of(new[0]), RELOAD_BOUND)
            print(f"serving certificate, {how}: new handshakes present it after {times[how]:.2f} s")
        # 2. the front-proxy client certificate (same CA), in place
        fpc = pki.front_proxy_client()
        install(fpc, a.pki, "front-proxy-client")
        # 3. a CA rotation: bundles with the old and the new CA (cluster CA on A, front-proxy CA on B), then
        # A's front-proxy client certificate from the new front-proxy CA, all while the load runs
        ca2, fp2 = pki.ca2, pki.fp_ca2
        write_in_place_bytes(a.pki / "ca.crt", pki.ca[0].read_bytes() + ca2[0].read_bytes())
        write_in_place_bytes(b.pki / "front-proxy-ca.crt", pki.fp_ca[0].read_bytes() + fp2[0].read_bytes())
        time.sleep(3)
        fpc2 = pki.front_proxy_client(fp2)
        install(fpc2, a.pki, "front-proxy-client")
        t_last_change = time.monotonic()
        time.sleep(3)
    finally:
        load.stop()
    events_after = load.events_after(t_last_change)
    print("under load:", load.summary(t_last_change))
    assert load.failures == [], load.failures[:10]
    assert load.ok > 100
    assert load.watch_broken == {}, "watches opened before the changes must keep streaming"
    assert all(n > 0 for n in events_after.values()), events_after
    assert max(times.values()) <= RELOAD_BOUND

    # 4. client verification honours the bundle: a certificate from either CA is accepted and its identity
    # asserted; one from a CA outside the bundle is refused at TLS
    bob = pki.mint("bob", ca2, orgs=("ops",))
    fakes.instances["a"].clear_requests()
    for who, cert in (("alice", alice), ("bob", bob)):
        status, _, body = a.get(COMMON, cert)
        assert status == 200, (who, status, body[:200])
    users = [r["headers"].get("x-remote-user") for r in fakes.instances["a"].requests() if r["path"].startswith(COMMON)]
    assert users[-2:] == ["alice", "bob"], users
    ca3 = mint_cert(pki.d / "ca" / "ca3", "kubernetes-3", ca_crt=None, ca_key=None)
    mallory = pki.mint("mallory", ca3)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        a.get(COMMON, mallory)

    # 5. upstream verification honours the bundle, and connections opened after the renewal present the new
    # front-proxy client certificate: a restarts (every upstream connection is new) with a serving
    # certificate from the new CA
    fakes.restart("a", tls=fake_tls(pki, ca2))
    harness.wait_until(lambda: a.get(COMMON, alice)[0] == 200, 10, message="a unreachable after its restart")
    status, headers, _ = a.get(COMMON, alice)
    assert headers["x-fake-client-cert-serial"].upper() == serial_of(fpc2[0]), headers

    # 6. bad files keep the last good pair: a half-written certificate, then a key that does not match
    good = serial_of(a.pki / "apiserver.crt")
    failed0 = key_rotation_failed(a)
    new = pki.serving(a.ip)
    write_in_place_bytes(a.pki / "apiserver.crt", new[0].read_bytes()[:200])
    harness.wait_until(lambda: key_rotation_failed(a) > failed0, RELOAD_BOUND,
                       message="the half-written certificate was not rejected")
    assert presented_serial(a.ip, a.client_port, a.pki / "ca.crt") == good
    failed1 = key_rotation_failed(a)
    write_in_place(new[0], a.pki / "apiserver.crt")  # whole now, but the key on disk is the old one
    harness.wait_until(lambda: key_rotation_failed(a) > failed1, RELOAD_BOUND,
                       message="the certificate whose key does not match was not rejected")
    assert presented_serial(a.ip, a.client_port, a.pki / "ca.crt") == good
    assert "Failed to reload certificates" in a.envoy.log_text()
    assert "pki-reload: changed:" in a.reload_log() and "apiserver.crt" in a.reload_log(), a.reload_log()
    print("rejections: sds.serving.key_rotation_failed", failed0, "->", key_rotation_failed(a))
    print("envoy:", [line[-160:] for line in a.envoy.log_text().splitlines() if "Failed to reload" in line][:2])
    print("pki-reload:", [line for line in a.reload_log().splitlines() if "apiserver" in line][-3:])
    # and the matching key completes the pair
    write_in_place(new[1], a.pki / "apiserver.key")
    wait_serial(a.ip, a.client_port, a.pki / "ca.crt", serial_of(new[0]), RELOAD_BOUND)


def write_in_place_bytes(dst: Path, data: bytes):
    with open(dst, "wb") as f:
        f.write(data)


def test_a_single_control_plane_node_needs_no_peers(tmp_path, envoys):
    """`kpp.render --kubeadm` with neither --peer nor --lease-local-hostname (one control-plane node):
    the bootstrap loads, local requests are served, and once the only member's API set is known a
    resource nobody serves gets the apiserver's genuine 404 (not the guard's 503)."""
    pki = Pki(tmp_path / "pki")
    fakes = Cluster()
    try:
        fa = fakes.start("a", apiset="old", tls=fake_tls(pki))
        a = Node("a", "127.0.0.23", pki, fa, envoys, tmp_path, harness.free_port(), harness.free_port())
        a.start([])
        a.envoy.wait_snapshot(30)
        alice = pki.mint("alice", pki.ca)
        assert a.get(COMMON, alice)[0] == 200
        status, headers, body = a.get(NEW_ONLY, alice)
        assert status == 404 and headers.get("x-fake-apiserver") == "a", (status, body[:200])
        assert "x-kube-peer-proxy-reply" not in headers, headers
        a.stop()
    finally:
        fakes.stop_all()
