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
a kubeadm-style in-place write, `cp` and an atomic `mv`; after a front-proxy-client renewal (same CA,
checked before the rotation replaces it, then from the new CA) A's Envoy holds it, and a new
connection from A (rerouted watches held until A's pool opens one) presents it to B's peer listener,
which answers (B's access log records its serial); a CA bundle holding the old and the new CA is
honoured for client and upstream verification (and a CA outside it is refused), and B's peer listener
answers a new connection presenting a certificate of the new front-proxy CA, which it refused before
(the control test: without pki-reload it keeps refusing it); under load (keep-alive and
new-connection clients, local and rerouted, and watches) no request fails and the watches opened
before the changes keep streaming; no SDS secret of either Envoy counts a `key_rotation_failed`
through these normal changes (kpp.testing.sds); a half-written certificate and a key that does not
match keep the last good pair, counted in `sds.serving.key_rotation_failed` (which that check then
reports) and named by pki-reload's log.
(tests/k8s/test_pki_renewal.py does the same with the real kubeadm and kube-apiserver.) The same
TLS node setup also shows that a single control-plane node needs no peers.
"""

from __future__ import annotations

import http.client
import json
import os
import re
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
from kpp.testing.proc import client_tls, get_json, request, server_tls
from kpp.testing.sds import NoKeyRotationFailures, key_rotation_failed as sds_key_rotation_failed
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
        self.work = work / name
        self.pki = pki.node_dir(name, ip)
        self.reload_dir = work / name / "reload"
        self.reload_dir.mkdir(parents=True)
        self.reload = None
        if with_reload:
            self.start_reload()
        self.sds = render.write_kubeadm_sds(work / name / "sds", self.pki, self.reload_dir)
        self.admin = harness.free_port()
        # which front-proxy certificate (serial) each request on the peer listener came with
        self.access_log = work / name / "access.log"

    def start(self, peers: list["Node"]):
        yaml = render.render_kubeadm(
            node=self.name, node_ip=self.ip, apiserver=("127.0.0.1", self.fake.port),
            wasm_path=str(harness.wasm_path()), peers=[(p.name, p.ip) for p in peers], admin_port=self.admin,
            port=self.client_port, peer_port=self.peer_port, sds_dir=str(self.sds), plugin=FAST,
            access_log=str(self.access_log))
        self.envoy = self.envoys.start(yaml, f"pki-{self.name}", self.admin, component_log_level="wasm:info")
        return self

    def start_reload(self):
        self.reload = pki_reload.start(self.pki, self.reload_dir, self.work / "pki-reload.log",
                                       f"pki-reload-{self.name}")

    def stop(self):
        if self.reload:
            self.reload.stop()

    def reload_log(self) -> str:
        return self.reload.log_tail(200) if self.reload else ""

    def client_ctx(self, cert=None, ca: Path | None = None) -> ssl.SSLContext:
        return client_tls(ca or self.pki / "ca.crt", *(cert or ()), check_hostname=False)

    def get(self, path, cert=None, ca=None, timeout=10.0, port=None, headers=None):
        conn = http.client.HTTPSConnection(self.ip, port or self.client_port, context=self.client_ctx(cert, ca),
                                           timeout=timeout)
        try:
            conn.request("GET", path, headers=headers or {})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def peer_refusal(self, cert) -> str | None:
        """None when this node's peer listener answers 200 to a request on a new TLS connection (never a
        pooled one) presenting `cert`, as another node's proxy sends it; otherwise why not."""
        try:
            status, _, body = self.get(COMMON, cert, port=self.peer_port, headers={"x-remote-user": "alice"})
        except (ssl.SSLError, ConnectionError) as e:
            return f"{type(e).__name__}: {e}"
        return None if status == 200 else f"HTTP {status} {body[:200]!r}"

    def peer_serials(self) -> set[int]:
        """Serials of the client certificates that requests answered 200 on this node's peer listener came
        with (its access log; admin /reopen_logs flushes Envoy's buffer)."""
        request(f"http://127.0.0.1:{self.admin}/reopen_logs", method="POST", timeout=5)
        try:
            lines = self.access_log.read_text().splitlines()
        except FileNotFoundError:
            return set()
        out = set()
        for line in lines:
            try:
                e = json.loads(line)
            except ValueError:  # a line still being written
                continue
            if (str(e.get("listener_port")) == str(self.peer_port) and str(e.get("code")) == "200"
                    and e.get("peer_serial") not in (None, "", "-")):
                out.add(int(e["peer_serial"], 16))
        return out

    def peer_verify_failures(self) -> int:
        """Client certificates this node's peer listener refused at the TLS handshake (no trusted CA)."""
        stat = f"listener.{self.ip}_{self.peer_port}.ssl.fail_verify_error"
        return self.envoy.stats(rf"^listener\.{re.escape(self.ip)}_{self.peer_port}\.ssl\.fail_verify_error$")[stat]

    def held_serials(self) -> set[int]:
        """Serials of every certificate chain this node's Envoy holds (admin /certs: listeners and clusters)."""
        doc = get_json(f"http://127.0.0.1:{self.admin}/certs", timeout=5)
        return {int(c["serial_number"], 16) for cert in doc.get("certificates", []) for c in cert.get("cert_chain", [])}


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
    return sds_key_rotation_failed(node.envoy)["serving"]


MAX_HELD_WATCHES = 30


def open_new_upstream_connection(a: Node, peer: Node, cert) -> int:
    """Makes A's Envoy open a new connection to the peer's listener. Its HTTP/1.1 pool reuses idle
    connections, and a watch holds one for as long as it runs: rerouted watches through A are opened
    (and held) until A's cluster.peer-<peer>.upstream_cx_total rises. Returns how many it took."""
    stat = f"cluster.peer-{peer.name}.upstream_cx_total"

    def total() -> int:
        return a.envoy.stats(rf"^cluster\.peer-{peer.name}\.upstream_cx_total$")[stat]

    before = total()
    held = []
    try:
        for n in range(1, MAX_HELD_WATCHES + 1):
            conn = http.client.HTTPSConnection(a.ip, a.client_port, context=a.client_ctx(cert), timeout=10)
            held.append(conn)
            conn.request("GET", f"{NEW_ONLY}?watch=true")
            r = conn.getresponse()
            assert r.status == 200 and r.getheader("x-fake-apiserver") == peer.name, (r.status, r.getheaders())
            if total() > before:
                return n
        raise AssertionError(f"{MAX_HELD_WATCHES} rerouted watches held, and A opened no new connection to "
                             f"{peer.name} ({stat} stayed {before})")
    finally:
        for conn in held:
            conn.close()


def front_proxy_cert_reaches_peer(a: Node, b: Node, crt: Path, cert) -> tuple[float, int]:
    """A renewed front-proxy client certificate on A's disk: seconds until A's Envoy holds it, then a new
    connection from A to B's peer listener presents it and B answers on it (B's access log has its
    serial). Returns (the seconds, the watches it took to make A open the connection)."""
    want = int(serial_of(crt), 16)
    t0 = time.monotonic()
    harness.wait_until(lambda: want in a.held_serials(), RELOAD_BOUND,
                       message=f"A's Envoy does not hold the front-proxy client certificate {crt.name}")
    took = time.monotonic() - t0
    watches = open_new_upstream_connection(a, b, cert)
    harness.wait_until(lambda: want in b.peer_serials(), RELOAD_BOUND,
                       message=f"B's peer listener answered nothing that came with {crt.name}; seen "
                               f"{sorted(hex(s) for s in b.peer_serials())}")
    return took, watches


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


def test_without_pki_reload_the_peer_listener_refuses_a_rotated_front_proxy_ca(tmp_path, envoys):
    """The control for the CA rotation on the peer listener: with no pki-reload, the bundle of the old and
    the new front-proxy CA written into B's front-proxy-ca.crt is never taken, and a new TLS connection
    presenting a certificate of the new CA is refused for the whole bound. Then pki-reload starts (its
    first round renames the marker) and the same connection is answered: the reload is what does it."""
    pki, fakes, a, b = two_nodes(tmp_path, envoys, with_reload=False)
    try:
        old, new = pki.front_proxy_client(), pki.front_proxy_client(pki.fp_ca2)
        assert b.peer_refusal(old) is None, b.peer_refusal(old)
        failures0 = b.peer_verify_failures()
        refused = b.peer_refusal(new)
        assert refused, "B's peer listener accepted a certificate of a CA it does not trust"
        write_in_place_bytes(b.pki / "front-proxy-ca.crt", pki.fp_ca[0].read_bytes() + pki.fp_ca2[0].read_bytes())
        t0, tries = time.monotonic(), 0
        while time.monotonic() - t0 < RELOAD_BOUND:  # watching for the bound, not waiting for anything
            why = b.peer_refusal(new)
            tries += 1
            assert why, (f"accepted {time.monotonic() - t0:.1f} s after the change without pki-reload "
                         "(the control changed)")
            time.sleep(0.5)
        print(f"without pki-reload: a new connection with the new front-proxy CA refused {tries} times over "
              f"{RELOAD_BOUND:.0f} s after the bundle was written ({why})")
        # refused by the certificate check, not for another reason
        assert b.peer_verify_failures() - failures0 == tries + 1, (b.peer_verify_failures(), failures0, tries)
        b.start_reload()
        t0 = time.monotonic()
        harness.wait_until(lambda: b.peer_refusal(new) is None, RELOAD_BOUND, interval=0.2,
                           message="with pki-reload, B's peer listener still refuses the new front-proxy CA")
        print(f"pki-reload started: the same connection answered after {time.monotonic() - t0:.2f} s")
        assert b.peer_refusal(old) is None, "the bundle still holds the old front-proxy CA"
    finally:
        for n in (a, b):
            n.stop()
        fakes.stop_all()


def test_renewed_files_are_picked_up_under_load_and_bad_files_keep_the_last_good_ones(nodes):
    pki, fakes, a, b = nodes
    alice = pki.mint("alice", pki.ca, orgs=("devs",))
    assert presented_serial(a.ip, a.client_port, a.pki / "ca.crt") == serial_of(a.pki / "apiserver.crt")
    for path in (COMMON, NEW_ONLY):
        status, headers, body = a.get(path, alice)
        assert status == 200, (path, status, body[:300])
    assert a.get(NEW_ONLY, alice)[1]["x-fake-apiserver"] == "b", "the rerouted path goes through B's peer listener"
    # docs/deploy.md: sds.<secret>.key_rotation_failed stays 0 through every normal renewal (KeyRotationFailed)
    rotations = NoKeyRotationFailures([a.envoy, b.envoy])

    load = load_through(a, alice).start()
    try:
        harness.wait_until(lambda: all(load.watch_events.values()), 20, message="watches saw no events")
        times, peer = {}, {}
        # 1. the serving certificate, each way a renewed file lands
        for how, writer in WRITERS.items():
            new = pki.serving(a.ip)
            install(new, a.pki, "apiserver", writer)
            times[how] = wait_serial(a.ip, a.client_port, a.pki / "ca.crt", serial_of(new[0]), RELOAD_BOUND)
            print(f"serving certificate, {how}: new handshakes present it after {times[how]:.2f} s")
        # 2. the front-proxy client certificate (same CA), in place, checked before step 3 replaces it: A's
        # Envoy takes it, and a new connection from A presents it to B's peer listener, which answers
        fpc = pki.front_proxy_client()
        install(fpc, a.pki, "front-proxy-client")
        peer["same-CA front-proxy client certificate held by A"], watches = front_proxy_cert_reaches_peer(
            a, b, fpc[0], alice)
        print(f"same-CA front-proxy client renewal: B's peer listener answered A's new connection presenting it "
              f"({watches} held watches made A open it)")
        # 3. a CA rotation: bundles with the old and the new CA (cluster CA on A, front-proxy CA on B), then
        # A's front-proxy client certificate from the new front-proxy CA, all while the load runs
        ca2, fp2 = pki.ca2, pki.fp_ca2
        fpc2 = pki.front_proxy_client(fp2)
        # the direct probe's own certificate of the new CA: its requests must not put fpc2's serial into
        # B's access log before A presents fpc2
        probe2 = pki.front_proxy_client(fp2)
        bob = pki.mint("bob", ca2, orgs=("ops",))
        refused = b.peer_refusal(probe2)
        assert refused, "B's peer listener accepted the new front-proxy CA before its bundle held it"
        write_in_place_bytes(a.pki / "ca.crt", pki.ca[0].read_bytes() + ca2[0].read_bytes())
        write_in_place_bytes(b.pki / "front-proxy-ca.crt", pki.fp_ca[0].read_bytes() + fp2[0].read_bytes())
        t0 = time.monotonic()
        # B's peer listener takes the bundle: a new TLS connection presenting a certificate of the new
        # front-proxy CA (the one A is about to use), refused until then, is answered
        harness.wait_until(lambda: b.peer_refusal(probe2) is None, RELOAD_BOUND, interval=0.2,
                           message="B's peer listener still refuses the new front-proxy CA")
        peer["front-proxy CA bundle: B's peer listener accepts a new connection with the new CA"] = \
            time.monotonic() - t0
        print(f"before the bundle, B's peer listener refused it: {refused}")
        # A's client listener takes its bundle (client certificates of the new cluster CA)
        harness.wait_until(lambda: a.get(COMMON, bob)[0] == 200, RELOAD_BOUND, interval=0.2, retry_errors=True,
                           message="A's client listener still refuses the new cluster CA")
        peer["cluster CA bundle: A's client listener accepts the new CA"] = time.monotonic() - t0
        # B's access log records the probe's serial (so reading it works), and not yet A's
        harness.wait_until(lambda: int(serial_of(probe2[0]), 16) in b.peer_serials(), RELOAD_BOUND,
                           message="B's access log does not show the probe's accepted request")
        assert int(serial_of(fpc2[0]), 16) not in b.peer_serials()
        install(fpc2, a.pki, "front-proxy-client")
        peer["new-CA front-proxy client certificate held by A"], watches = front_proxy_cert_reaches_peer(
            a, b, fpc2[0], alice)
        print(f"CA rotation: B's peer listener answered A's new connection presenting the new-CA front-proxy "
              f"client certificate ({watches} held watches made A open it)")
        t_last_change = time.monotonic()
        time.sleep(3)  # the load runs on after the last change (not a wait for anything)
    finally:
        load.stop()
    events_after = load.events_after(t_last_change)
    print("under load:", load.summary(t_last_change))
    assert load.failures == [], load.failures[:10]
    assert load.ok > 100
    assert load.watch_broken == {}, "watches opened before the changes must keep streaming"
    assert all(n > 0 for n in events_after.values()), events_after
    assert max(times.values()) <= RELOAD_BOUND
    print("seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in peer.items()))
    assert max(peer.values()) <= RELOAD_BOUND

    # 4. client verification honours the bundle: a certificate from either CA is accepted and its identity
    # asserted; one from a CA outside the bundle is refused at TLS
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

    # every change so far was a normal renewal or rotation: no SDS secret of either Envoy refused one
    print("key_rotation_failed after the renewals and the rotation:", rotations.check("the renewals and the rotation"))

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
    # and the check the normal renewals pass catches it
    with pytest.raises(AssertionError, match=r"pki-a: sds\.serving\.key_rotation_failed"):
        rotations.check("the bad files")
    print("envoy:", [line[-160:] for line in a.envoy.log_text().splitlines() if "Failed to reload" in line][:2])
    print("pki-reload:", [line for line in a.reload_log().splitlines() if "apiserver" in line][-3:])
    # and the matching key completes the pair
    write_in_place(new[1], a.pki / "apiserver.key")
    wait_serial(a.ip, a.client_port, a.pki / "ca.crt", serial_of(new[0]), RELOAD_BOUND)


def write_in_place_bytes(dst: Path, data: bytes):
    with open(dst, "wb") as f:
        f.write(data)


def test_a_single_control_plane_node_needs_no_peers(tmp_path, envoys):
    """`kpp.render --kubeadm --no-peers` (one control-plane node):
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
