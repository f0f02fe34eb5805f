"""Why the peer listener checks the client certificate's CN with the wasm peer gate, not Envoy's RBAC.

docs/deploy.md: the peer listener admits a front-proxy-CA certificate only when its subject CN is an
allowed name (`front-proxy-client`), as kube-apiserver's --requestheader-allowed-names does; Envoy's
RBAC `principal_name` cannot do that, because it matches a URI SAN, then a DNS SAN, and only then the
subject (envoy/config/rbac/v3/rbac.proto, `Principal.Authenticated.principal_name`: "If set, The URI
SAN or DNS SAN in that order is used from the certificate, otherwise the subject field is used";
source/extensions/filters/common/rbac/matchers.cc `AuthenticatedMatcher::matches` tries every URI
SAN, every DNS SAN, then the subject, and any match admits).

Shown here with the real Envoy and the real .wasm, every certificate signed by the front-proxy CA and
each sent on a new TLS connection asserting `X-Remote-User: system:admin`:

* the gate: the kubeadm profile's peer listener exactly as `kpp.render.render_kubeadm` renders it;
* RBAC: the same bootstrap with the gate replaced by the RBAC filter the profile used before the gate
  (principal_name exact `CN=front-proxy-client`: Envoy gives the subject in RFC 2253 form, so that is
  how the allowed CN is spelled), and a second peer listener whose principal_name is the bare name
  `front-proxy-client`. Nothing else differs (same TLS context, same routes, same fake apiserver).

A certificate with CN `evil-proxy` and a SAN spelling the allowed principal passes RBAC and reaches
the apiserver as `system:admin`; the gate refuses it. The controls: kubeadm's own front-proxy-client
certificate passes both (the subject form) and a plain `CN=evil-proxy` certificate is refused by both,
so RBAC is enforcing and the gate is not refusing everything.
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import shutil
from pathlib import Path

from kpp import render
from kpp.testing import harness
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.kubeadm_node import mint_cert
from kpp.testing.proc import client_tls, server_tls
from kpp.testing.topology import COMMON

ALLOWED = "front-proxy-client"
ADMITTED, RBAC_REFUSED, GATE_REFUSED = 200, 403, 401
RBAC_SUBJECT, RBAC_BARE = f"RBAC principal_name exact 'CN={ALLOWED}'", f"RBAC principal_name exact '{ALLOWED}'"
GATE = "kubeadm profile's peer listener (peer gate)"

# certificate -> (mint_cert arguments, answer of RBAC `CN=front-proxy-client`, of RBAC `front-proxy-client`,
# of the peer gate)
CASES = {
    "kubeadm's front-proxy-client (CN=front-proxy-client, no SAN)":
        ({"cn": ALLOWED}, ADMITTED, RBAC_REFUSED, ADMITTED),
    "CN=evil-proxy, DNS SAN 'CN=front-proxy-client'":
        ({"cn": "evil-proxy", "sans": f"DNS:CN={ALLOWED}"}, ADMITTED, RBAC_REFUSED, GATE_REFUSED),
    "CN=evil-proxy, URI SAN 'CN=front-proxy-client'":
        ({"cn": "evil-proxy", "sans": f"URI:CN={ALLOWED}"}, ADMITTED, RBAC_REFUSED, GATE_REFUSED),
    "CN=evil-proxy, DNS SAN front-proxy-client":
        ({"cn": "evil-proxy", "sans": f"DNS:{ALLOWED}"}, RBAC_REFUSED, ADMITTED, GATE_REFUSED),
    "CN=evil-proxy (no SAN)":
        ({"cn": "evil-proxy"}, RBAC_REFUSED, RBAC_REFUSED, GATE_REFUSED),
}


def kubeadm_pki(d: Path) -> tuple[Path, dict]:
    """A kubeadm-named PKI directory for one node (127.0.0.41), plus the CAs."""
    ca = mint_cert(d / "ca" / "ca", "kubernetes", ca_crt=None, ca_key=None)
    fp_ca = mint_cert(d / "ca" / "fp", "front-proxy-ca", ca_crt=None, ca_key=None)
    serving = mint_cert(d / "minted" / "serving", "kube-apiserver", ca_crt=ca[0], ca_key=ca[1], eku="serverAuth",
                        sans=f"DNS:{render.KUBEADM_SNI},IP:127.0.0.1,IP:127.0.0.41,IP:127.0.0.42")
    fpc = mint_cert(d / "minted" / "fpc", ALLOWED, ca_crt=fp_ca[0], ca_key=fp_ca[1])
    pki = d / "node"
    pki.mkdir(parents=True)
    shutil.copy(ca[0], pki / "ca.crt")
    shutil.copy(fp_ca[0], pki / "front-proxy-ca.crt")
    for (crt, key), base in ((serving, "apiserver"), (fpc, "front-proxy-client")):
        shutil.copy(crt, pki / f"{base}.crt")
        shutil.copy(key, pki / f"{base}.key")
        os.chmod(pki / f"{base}.key", 0o600)
    return pki, {"ca": ca, "fp_ca": fp_ca, "serving": serving}


def rbac_filter(principal: str) -> dict:
    """The RBAC filter the kubeadm profile had on its peer listener before the gate (commit 20af336)."""
    return {"name": "envoy.filters.http.rbac", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.rbac.v3.RBAC",
        "rules": {"action": "ALLOW", "policies": {"front-proxy": {
            "permissions": [{"any": True}],
            "principals": [{"authenticated": {"principal_name": {"exact": principal}}}]}}}}}


def rbac_bootstrap(gate_bootstrap: str, admin_port: int, ip: str, ports: dict[str, int]) -> str:
    """The kubeadm bootstrap with only its peer listener kept, once per RBAC principal (port), the wasm
    peer gate replaced by RBAC; no wasm at all is left in this Envoy."""
    b = json.loads(gate_bootstrap)
    b.pop("bootstrap_extensions", None)
    b["admin"]["address"]["socket_address"]["port_value"] = admin_port
    (peer,) = [lst for lst in b["static_resources"]["listeners"] if lst["name"] == "peers"]
    listeners = []
    for principal, port in ports.items():
        lst = copy.deepcopy(peer)
        lst["name"] = f"peers-rbac-{port}"
        lst["address"]["socket_address"].update(address=ip, port_value=port)
        hcm = lst["filter_chains"][0]["filters"][0]["typed_config"]
        filters = hcm["http_filters"]
        assert [f["name"] for f in filters] == ["envoy.filters.http.wasm", "envoy.filters.http.router"], filters
        filters[0] = rbac_filter(principal)
        listeners.append(lst)
    b["static_resources"]["listeners"] = listeners
    return json.dumps(b, indent=2) + "\n"


def peer_request(ip: str, port: int, ca: Path, cert) -> tuple[int, dict, bytes]:
    """One request on a new TLS connection to a peer listener, as another node's proxy sends it."""
    conn = http.client.HTTPSConnection(ip, port, context=client_tls(ca, *cert, check_hostname=False), timeout=10)
    try:
        conn.request("GET", COMMON, headers={"x-remote-user": "system:admin", "x-remote-group": "system:masters"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_rbac_principal_name_matches_sans_first_and_the_peer_gate_does_not(tmp_path, envoys):
    pki, cas = kubeadm_pki(tmp_path / "pki")
    (tmp_path / "reload").mkdir()  # the SDS secrets' watched directory must exist, or Envoy loads none
    sds = render.write_kubeadm_sds(tmp_path / "sds", pki, tmp_path / "reload")
    fakes = Cluster()
    try:
        fake = fakes.start("a", apiset="old", tls=server_tls(
            *mint_cert(tmp_path / "pki" / "minted" / "fake", "kube-apiserver", ca_crt=cas["ca"][0],
                       ca_key=cas["ca"][1], eku="serverAuth", sans=f"DNS:{render.KUBEADM_SNI},IP:127.0.0.1")))
        gate_ip, rbac_ip = "127.0.0.41", "127.0.0.42"
        gate_admin, gate_port = harness.free_port(), harness.free_port()
        gate_yaml = render.render_kubeadm(
            node="a", node_ip=gate_ip, apiserver=("127.0.0.1", fake.port), wasm_path=str(harness.wasm_path()),
            peers=[], admin_port=gate_admin, port=harness.free_port(), peer_port=gate_port, sds_dir=str(sds))
        rbac_admin = harness.free_port()
        rbac_ports = {f"CN={ALLOWED}": harness.free_port(), ALLOWED: harness.free_port()}
        rbac_yaml = rbac_bootstrap(gate_yaml, rbac_admin, rbac_ip, rbac_ports)
        assert "wasm" not in rbac_yaml and "envoy.filters.http.rbac" in rbac_yaml
        gate_envoy = envoys.start(gate_yaml, "peer-gate", gate_admin)
        rbac_envoy = envoys.start(rbac_yaml, "rbac", rbac_admin)

        targets = {RBAC_SUBJECT: (rbac_ip, rbac_ports[f"CN={ALLOWED}"]), RBAC_BARE: (rbac_ip, rbac_ports[ALLOWED]),
                   GATE: (gate_ip, gate_port)}
        seen, wrong = {}, []
        for i, (what, (kw, *want)) in enumerate(CASES.items()):
            cert = mint_cert(tmp_path / "pki" / "minted" / f"case-{i}", ca_crt=cas["fp_ca"][0],
                             ca_key=cas["fp_ca"][1], **kw)
            for (target, (ip, port)), expect in zip(targets.items(), want):
                fake.clear_requests()
                status, headers, body = peer_request(ip, port, pki / "ca.crt", cert)
                reached = [r["headers"].get("x-remote-user") for r in fake.requests() if r["path"] == COMMON]
                seen[(what, target)] = status
                print(f"{what:62} -> {target:45}: {status}"
                      + (f", the apiserver saw X-Remote-User {reached}" if reached else ""))
                if status != expect:
                    wrong.append((what, target, status, expect, body[:200]))
                # admitted means the asserted identity reached the apiserver; refused means nothing did
                assert reached == (["system:admin"] if status == ADMITTED else []), (what, target, status, reached)
                if status == RBAC_REFUSED:
                    assert body == b"RBAC: access denied", (what, target, body[:200])
                if status == GATE_REFUSED:
                    assert headers.get("x-fake-apiserver") is None, (what, target, headers)
        assert wrong == [], wrong

        # the flaw, stated as the docs state it: a certificate whose CN is not allowed passes RBAC through a SAN
        flaw = [w for w, (kw, *_) in CASES.items() if kw["cn"] != ALLOWED
                and any(seen[(w, t)] == ADMITTED for t in (RBAC_SUBJECT, RBAC_BARE))]
        assert len(flaw) == 3, flaw
        assert all(seen[(w, GATE)] == GATE_REFUSED for w in flaw), seen
        refused = gate_envoy.stats("peer_listener_refused").get(
            "wasmcustom.kube_peer_proxy_peer_listener_refused_total", 0)
        assert refused == len(CASES) - 1, gate_envoy.stats("peer_listener_refused")
        # both RBAC listeners count into http.peers.rbac.denied (same stat prefix)
        rbac_denied = sum(rbac_envoy.stats(r"rbac\.denied$").values())
        assert rbac_denied == sum(1 for (_, t), s in seen.items() if t != GATE and s == RBAC_REFUSED), rbac_denied
    finally:
        fakes.stop_all()
