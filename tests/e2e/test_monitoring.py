"""deploy/monitoring (Prometheus rules, Grafana dashboard) against what the product really exports.

* The names: every metric, label and label value the rules and the dashboard use is in a live Envoy's
  /stats/prometheus after traffic that reroutes, gets the filter's 503s of both kinds (peer_unavailable,
  guarded_not_found), a rerouted request that could not connect (code 503) and discovery errors
  (http_status, unreachable), plus a kubeadm-profile Envoy's certificate and SDS stats. A renamed metric,
  label or value fails the test (the control mutates the expressions and sees each one reported).
* promtool: deploy/monitoring/rules_test.yaml is generated from that capture (kpp.testing.rules_test),
  must equal the committed file, and `promtool test rules` passes it; with a rule's `for:` changed it fails.
* A real Prometheus (Debian's, 1 s scrape and evaluation, the rules' durations divided by SCALE) scrapes the
  three Envoys of the upgrade simulation (kpp.testing.sim.upgrade_sim): every dashboard query has data at
  its moment, and no alert fires for an ordinary rolling upgrade.
* The same Prometheus setup sees each alert fire when its condition happens and clear afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import threading
import time
from pathlib import Path

import pytest

from kpp import pki_reload, render
from kpp.testing import harness, mutants
from kpp.testing import prometheus as P
from kpp.testing import rules_test
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.kubeadm_node import mint_cert
from kpp.testing.proc import request, server_tls, status, wait_until
from kpp.testing.topology import FAST, NEW_ONLY, NOWHERE, V2

SCALE = 60  # the real-Prometheus tests run the rules with every duration divided by this
RATE = "5s"  # the dashboard's $__rate_interval there (5m / SCALE)
COMMITTED = P.MONITORING / "rules_test.yaml"
SLOW = {"refresh_interval": "5s", "fetch_timeout": "1s", "staleness_limit": "30s"}


def fault(inst, mode: str):
    r = request(f"{inst.url}/__fake/fault", "POST", body=json.dumps({"discovery": mode}).encode())
    assert r.status == 200, r


def exposition(envoy) -> str:
    code, body = harness.http_get(envoy.admin_url + "/stats/prometheus")
    assert code == 200, body[:300]
    return body


# ---- a kubeadm-profile node (TLS everywhere, file-based SDS secrets, pki-reload) ---------------------

class KubeadmNode:
    """One control-plane node of the kubeadm profile in front of a TLS fake apiserver: the PKI files
    kubeadm writes (CAs for 10 years, leaves for `days`), pki-reload, Envoy rendered by kpp.render."""

    SNI = render.KUBEADM_SNI

    def __init__(self, tmp: Path, envoys, ip: str = "127.0.0.24", days: int = 2):
        self.tmp, self.ip = tmp, ip
        self.ca = mint_cert(tmp / "ca" / "ca", "kubernetes", ca_crt=None, ca_key=None, days=3650)
        self.fp_ca = mint_cert(tmp / "ca" / "fp", "front-proxy-ca", ca_crt=None, ca_key=None, days=3650)
        self.pki = tmp / "pki"
        self.pki.mkdir()
        shutil.copy(self.ca[0], self.pki / "ca.crt")
        shutil.copy(self.fp_ca[0], self.pki / "front-proxy-ca.crt")
        self.n = 0
        self.install(self.leaf("apiserver", days), "apiserver")
        self.install(self.leaf("front-proxy-client", days), "front-proxy-client")
        crt, key = self.leaf("fake-serving", 3650)
        self.fakes = Cluster()
        self.fake = self.fakes.start("a", apiset="old", tls=server_tls(
            crt, key, client_cas=(self.fp_ca[0],), client_cert=ssl.CERT_OPTIONAL))
        reload_dir = tmp / "reload"
        reload_dir.mkdir()
        self.reload = pki_reload.start(self.pki, reload_dir, tmp / "pki-reload.log", "pki-reload-mon")
        sds = render.write_kubeadm_sds(tmp / "sds", self.pki, reload_dir)
        self.admin = harness.free_port()
        yaml = render.render_kubeadm(
            node="a", node_ip=ip, apiserver=("127.0.0.1", self.fake.port), wasm_path=str(harness.wasm_path()),
            peers=[], admin_port=self.admin, port=harness.free_port(), peer_port=harness.free_port(),
            sds_dir=str(sds), plugin=FAST)
        self.envoy = envoys.start(yaml, "kubeadm-a", self.admin, component_log_level="wasm:info")
        self.envoy.wait_snapshot(30)

    def leaf(self, base: str, days: int) -> tuple[Path, Path]:
        self.n += 1
        out = self.tmp / "minted" / f"{self.n}-{base}"
        if base == "front-proxy-client":
            return mint_cert(out, "front-proxy-client", ca_crt=self.fp_ca[0], ca_key=self.fp_ca[1], days=days)
        return mint_cert(out, "kube-apiserver", ca_crt=self.ca[0], ca_key=self.ca[1], eku="serverAuth",
                         sans=f"DNS:{self.SNI},IP:{self.ip},IP:127.0.0.1", days=days)

    def install(self, pair, base: str, key: bool = True):
        """Certificate, then key, written in place as kubeadm does."""
        (self.pki / f"{base}.crt").write_bytes(pair[0].read_bytes())
        if key:
            (self.pki / f"{base}.key").write_bytes(pair[1].read_bytes())
            os.chmod(self.pki / f"{base}.key", 0o600)

    def close(self):
        self.reload.stop()
        self.fakes.stop_all()


# ---- the live capture ---------------------------------------------------------------------------------

def exercised_capture(envoys, tmp: Path) -> tuple[str, str]:
    """(before, after): Envoy A's /stats/prometheus right after its first snapshot, and after traffic
    that exercises reroutes, both kinds of the filter's 503s, a reroute that cannot connect and discovery
    errors; the kubeadm node's stats are appended to both."""
    cluster = Cluster()
    try:
        a, b = cluster.start("a", apiset="old"), cluster.start("b", apiset="new")
        c = cluster.start("c", apiset="new")
        fault(c, "401")  # c's API set is never learned: a "not served here" 404 is guarded
        port, admin = harness.free_port(), harness.free_port()
        yaml = render.render_bootstrap(
            node="a", listen_port=port, admin_port=admin, local=("127.0.0.1", a.port),
            peers=[("b", "127.0.0.1", b.port), ("c", "127.0.0.1", c.port)], wasm_path=str(harness.wasm_path()),
            plugin=SLOW)
        envoy = envoys.start(yaml, "capture-a", admin, component_log_level="wasm:info")
        envoy.wait_fresh(["a", "b"], 20)
        before = exposition(envoy)
        url = f"http://127.0.0.1:{port}"
        assert request(url + NEW_ONLY).status == 200  # rerouted to b
        guarded = request(url + NOWHERE)
        assert guarded.status == 503 and "kube-peer-proxy" in guarded.text, guarded  # guarded_not_found
        assert request(url + "/apis", headers={"Accept": V2}).status == 200  # merged
        b.stop()  # until the next round (5 s) a's filter still routes to b: the reroute cannot connect
        assert request(url + NEW_ONLY).status == 503
        # b marked down (each worker sees the mark), c unknown: peer_unavailable
        wait_until(lambda: request(url + NEW_ONLY).status == 503 and any(
            "type=peer_unavailable" in k for k in envoy.stats("peer_proxy_errors")), 4, 0.05,
            message="no peer_unavailable 503 while b is marked down")
        wait_until(lambda: envoy.stats("discovery_sync_errors").get(
            "wasmcustom.kube_peer_proxy_discovery_sync_errors_total;type=unreachable;server=b"), 12,
            message="no unreachable discovery error for b")
        after = exposition(envoy)
    finally:
        cluster.stop_all()
    node = KubeadmNode(tmp / "kubeadm", envoys)
    try:
        kubeadm = exposition(node.envoy)
    finally:
        node.close()
    return before + kubeadm, after + kubeadm


def all_expressions() -> list[tuple[str, str]]:
    return [(r.get("alert") or r.get("record"), r["expr"]) for r in P.rules()] + P.dashboard_queries()


def test_rules_and_dashboard_name_only_what_envoy_exports_and_promtool_passes(envoys, tmp_path):
    before, after = exercised_capture(envoys, tmp_path)
    (tmp_path / "stats-after.prom").write_text(after)
    series = P.parse_exposition(after)
    exprs = all_expressions()
    problems = P.missing_names(exprs, series, P.rules())
    assert problems == [], "the rules/dashboard name what Envoy does not export:\n" + "\n".join(problems)

    # Controls: the same check on the capture before the traffic, and on expressions with a metric, a
    # label and a label value renamed, must report each.
    early = P.missing_names(exprs, P.parse_exposition(before), P.rules())
    print("before the traffic:\n  " + "\n  ".join(early))
    for metric in ("kube_peer_proxy_rerouted_request_total", "kube_peer_proxy_peer_proxy_errors_total"):
        assert any(f"metric {metric} is not exported" in p for p in early), (metric, early)
    mutated = [("renamed metric", "rate(kube_peer_proxy_rerouted_requests_total[5m])"),
               ("renamed label", 'kube_peer_proxy_server_fresh{member="b"} == 0'),
               ("renamed value", 'kube_peer_proxy_peer_proxy_errors_total{type="peer_down"}'),
               ("renamed group label", "sum by (reason) (kube_peer_proxy_peer_proxy_errors_total)")]
    reported = P.missing_names(mutated, series, P.rules())
    print("mutated:\n  " + "\n  ".join(reported))
    for where, _ in mutated:
        assert any(p.startswith(where + ":") for p in reported), (where, reported)

    # promtool on the test generated from the capture; it is the committed file.
    generated = rules_test.generate(rules_test.Capture(after))
    if os.environ.get("KPP_UPDATE_MONITORING") == "1":
        COMMITTED.write_text(generated)
    assert rules_test.alert_names_tested(generated) == {r["alert"] for r in P.rules() if "alert" in r}
    work = tmp_path / "promtool"
    work.mkdir()
    shutil.copy(P.RULES, work / P.RULES.name)
    (work / "rules_test.yaml").write_text(generated)
    r = subprocess.run([P.binary("promtool"), "test", "rules", "rules_test.yaml"], cwd=work, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert COMMITTED.read_text() == generated, (
        f"{COMMITTED} is not what the live series generate; rerun with KPP_UPDATE_MONITORING=1 and review the diff")
    # Control: a rule with a longer `for:` fails the same test.
    text = (work / P.RULES.name).read_text()
    (work / P.RULES.name).write_text(text.replace("        expr: kube_peer_proxy_server_fresh == 0\n        for: 2m",
                                                  "        expr: kube_peer_proxy_server_fresh == 0\n        for: 4m"))
    r = subprocess.run([P.binary("promtool"), "test", "rules", "rules_test.yaml"], cwd=work, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "KubePeerProxyMemberNotFresh" in r.stdout + r.stderr, r.stdout + r.stderr
