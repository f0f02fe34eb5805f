"""deploy/monitoring (Prometheus rules, Grafana dashboard) against what the product really exports.

* The names: every metric, label and label value the rules and the dashboard use is in a live Envoy's
  /stats/prometheus after traffic that reroutes, gets the filter's 503s of both kinds (peer_unavailable,
  guarded_not_found), a rerouted request that could not connect (code 503) and discovery errors
  (http_status, unreachable), plus a kubeadm-profile Envoy's certificate and SDS stats. A renamed metric,
  label or value fails the test (the control mutates the expressions and sees each one reported).
* promtool: deploy/monitoring/rules_test.yaml is generated from that capture (kpp.testing.rules_test),
  must equal the committed file, and `promtool test rules` passes it; with a rule's `for:` changed it fails,
  and so it does when the kubelet-probe alert also counts the static pod's own readiness probe.
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
from kpp.testing import harness, mutants, static_envoy
from kpp.testing import prometheus as P
from kpp.testing import rules_test
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.kubeadm_node import mint_cert
from kpp.testing.proc import request, server_tls, status, wait_until
from kpp.testing.topology import COMMON, FAST, NEW_ONLY, NOWHERE, V2

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
    # Control: the probe alert without its virtual cluster's selector counts the static pod's own
    # readiness probe (and every other client) too, and fails the same test.
    selector = '{envoy_virtual_cluster="kubelet_probe"}'
    assert text.count(selector) == 1
    (work / P.RULES.name).write_text(text.replace(selector, ""))
    r = subprocess.run([P.binary("promtool"), "test", "rules", "rules_test.yaml"], cwd=work, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "KubePeerProxyKubeletProbesThroughProxy" in r.stdout + r.stderr, r.stdout + r.stderr


# ---- a real Prometheus scraping the simulated upgrade ------------------------------------------------

SIM_DURATION = 30.0
SIM_SEED = 5
DOCS = harness.ROOT / "docs"


class ScrapedEnvoys:
    """The pytest Envoy registry, and every node Envoy it starts becomes a scrape target (front LB aside)."""

    def __init__(self, registry, prom: P.Prometheus):
        self.registry, self.prom, self.admin = registry, prom, {}

    def start(self, yaml, name, admin_port, **kwargs):
        envoy = self.registry.start(yaml, name, admin_port, **kwargs)
        if not name.endswith("front-lb"):
            node = name.rsplit("-", 1)[-1]
            self.admin[node] = admin_port
            self.prom.set_target(node, admin_port)
        else:  # the simulation starts its front LB after the nodes: hold it until Prometheus scrapes them
            for node in self.admin:
                self.prom.wait_scraped(node, 20)
        return envoy


@pytest.fixture
def prom(tmp_path):
    p = P.Prometheus(tmp_path / "prometheus", P.scaled_rules(SCALE)).start()
    yield p
    bad = p.rule_health()
    p.stop()
    assert not bad, f"rules that failed to evaluate: {bad}"



def status_text(admin: dict[str, int], interval: float = 1.0, width: int = 110) -> str:
    r = subprocess.run([shutil.which("kube-peer-proxy-status") or str(harness.ROOT / ".venv/bin/kube-peer-proxy-status"),
                        "--interval", str(interval), "--width", str(width),
                        *[f"{n}=127.0.0.1:{p}" for n, p in sorted(admin.items())]],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r.stdout


def nonempty_at(prom, expr: str, at: float) -> bool:
    return bool(prom.query(expr, at))


def nonempty_within(prom, expr: str, start: float, end: float) -> list[float]:
    """The moments (step 1 s) in [start, end] at which expr has a value."""
    return sorted({float(t) for s in prom.query_range(expr, start, end) for t, _v in s["values"]})


def test_dashboard_has_data_during_a_simulated_upgrade_and_no_alert_fires(envoys, prom, tmp_path):
    from kpp.testing.sim import upgrade_sim

    launcher = ScrapedEnvoys(envoys, prom)
    schedule = upgrade_sim.make_schedule(SIM_DURATION, SIM_SEED)
    started = threading.Event()
    t0_wall = []

    def log(line):
        print(line, flush=True)
        if "load started" in line:
            t0_wall.append(time.time())
            started.set()

    result = {}
    sim = threading.Thread(target=lambda: result.update(upgrade_sim.run_mode(
        "filter", SIM_DURATION, SIM_SEED, tmp_path / "sim", registry=launcher, log=log)), daemon=True)
    sim.start()
    assert started.wait(120), "the simulation did not start its load"
    # The status view while b is down (its stop is 0.3 s after its drain), rates over 1 s.
    b = schedule[1]
    time.sleep(max(0.0, t0_wall[0] + b.at + 0.3 + 0.2 - time.time()))
    status_during = status_text(launcher.admin)
    print("kube-peer-proxy-status while b is down:\n" + status_during)
    sim.join(SIM_DURATION + 180)
    assert not sim.is_alive() and result, "the simulation did not finish"
    s = result
    print(upgrade_sim.schedule_table(s))
    t0 = s["t0_wall"]
    ups = {u["server"]: {k: t0 + v for k, v in u.items() if isinstance(v, float) and k != "pause"} for u in s["upgrades"]}
    before = t0 + schedule[0].at - 0.5  # load running for a while, nothing upgraded yet
    after_a = ups["a"]["ready"] + 3.0  # a is new and serves no old-only resource: reroutes
    end = t0 + SIM_DURATION - 0.5

    # Every node's members were scraped: three nodes times three members.
    assert len(prom.query("kube_peer_proxy_server_fresh", before)) == 9
    queries = P.dashboard_queries(RATE)
    moments = {}
    for title, expr in queries:
        if "certificate" in title or "alerts" in title.lower():
            continue  # TLS only / alerts only: test_each_alert_... checks them when they have data
        if title.startswith("Filter 503s") or title.startswith("Discovery errors"):
            # nothing before the first upgrade; something while a server is down, for each one
            assert not prom.query(expr, before), (title, prom.query(expr, before))
            for n, u in ups.items():
                seen = nonempty_within(prom, expr, u["stop"], u["ready"] + 5)
                if title.startswith("Discovery errors"):
                    assert seen, f"{title}: no data while {n} was down ({expr})"
                moments.setdefault(title, []).extend(seen)
            assert moments.get(title), f"{title}: no data during any upgrade ({expr})"
        elif title.startswith("Rerouted"):
            assert prom.query(expr, after_a), f"{title}: no data after a was upgraded ({expr})"
            moments[title] = [after_a]
        else:
            assert prom.query(expr, before), f"{title}: no data during the load ({expr})"
            moments[title] = [before]
    print("dashboard queries with data:", {k: len(v) for k, v in moments.items()})
    # The snapshot generation moved on every node while the API sets changed.
    gens = {(r["metric"]["node"]): (float(r["value"][1])) for r in prom.query("kube_peer_proxy_snapshot_generation", before)}
    gens_end = {(r["metric"]["node"]): (float(r["value"][1])) for r in prom.query("kube_peer_proxy_snapshot_generation", end)}
    assert all(gens_end[n] > gens[n] for n in gens), (gens, gens_end)
    # An ordinary rolling upgrade (each server down 2-3 s, i.e. 2-3 min at the rules' scale) pages nobody.
    fired = prom.query_range('ALERTS{alertstate="firing"}', t0 - 5, end)
    pending = prom.query_range('ALERTS{alertstate="pending"}', t0 - 5, end)
    print("pending during the upgrade:", sorted({(x["metric"]["alertname"], x["metric"].get("node", "")) for x in pending}))
    assert not fired, [x["metric"] for x in fired]
    # The status view showed b not fresh, or its discovery errors, while it was down.
    assert "node a" in status_during and "node c" in status_during, status_during
    assert "b: NOT FRESH" in status_during or "b unreachable" in status_during, status_during
    plot(prom, ups, t0, end, tmp_path / "what-to-watch.png")
    if os.environ.get("KPP_UPDATE_DOCS") == "1":
        shutil.copy(tmp_path / "what-to-watch.png", DOCS / "what-to-watch.png")
        (DOCS / "what-to-watch-status.txt").write_text(status_during)


def plot(prom, ups: dict, t0: float, end: float, out: Path):
    """Four panels of the dashboard from this run's Prometheus data, the servers' downtimes shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("members fresh, per node", "sum by (node) (kube_peer_proxy_server_fresh)", "{node}"),
        ("rerouted requests/s by code", f"sum by (code) (rate(kube_peer_proxy_rerouted_request_total[{RATE}]))", "{code}"),
        ("filter 503s/s by reason", f"sum by (type) (rate(kube_peer_proxy_peer_proxy_errors_total[{RATE}]))", "{type}"),
        ("discovery errors/s by server", f"sum by (server, type) (rate(kube_peer_proxy_discovery_sync_errors_total[{RATE}]))",
         "{server} {type}"),
        ("seconds since a member's last success", "max by (server) (kube_peer_proxy_server_last_success_age_seconds)",
         "{server}"),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.1 * len(panels)), sharex=True, layout="constrained")
    for ax, (title, expr, legend) in zip(axes, panels):
        for s in sorted(prom.query_range(expr, t0 - 2, end, 0.5), key=lambda s: str(s["metric"])):
            xs = [float(t) - t0 for t, _ in s["values"]]
            ys = [float(v) for _, v in s["values"]]
            ax.plot(xs, ys, label=legend.format(**{k: s["metric"].get(k, "") for k in ("node", "code", "type", "server")}))
        for n, u in ups.items():
            ax.axvspan(u["stop"] - t0, u["ready"] - t0, color="0.85")
        ax.set_title(title, fontsize=9, loc="left")
        ax.legend(fontsize=7, loc="upper right", ncol=3)
        ax.tick_params(labelsize=7)
    for n, u in ups.items():
        axes[0].text((u["stop"] + u["ready"]) / 2 - t0, 0.5, f"{n} down", ha="center", fontsize=7)
    axes[-1].set_xlabel(f"seconds after the load started (shaded: a server stopped until in service again; "
                        f"Prometheus 1 s scrape, rate over {RATE})", fontsize=8)
    fig.savefig(out, dpi=90)
    plt.close(fig)


# ---- each alert fires on its condition and clears ------------------------------------------------------

class Load(threading.Thread):
    """GETs of one URL in a loop until stopped (a client that keeps asking)."""

    def __init__(self, url: str, headers: dict | None = None, pace: float = 0.02):
        super().__init__(daemon=True)
        self.url, self.headers, self.pace, self.stop_ = url, headers, pace, threading.Event()
        self.codes: dict[int, int] = {}

    def run(self):
        while not self.stop_.is_set():
            c = status(self.url, self.headers)
            self.codes[c] = self.codes.get(c, 0) + 1
            time.sleep(self.pace)

    def stop(self):
        self.stop_.set()
        self.join(5)


def plain_envoy(envoys, prom, name, local, peers, plugin=FAST, wasm=None, mutant=None, **kw):
    port, admin = harness.free_port(), harness.free_port()
    yaml = render.render_bootstrap(node="a", listen_port=port, admin_port=admin, local=("127.0.0.1", local.port),
                                   peers=[(p.name, "127.0.0.1", p.port) for p in peers],
                                   wasm_path=str(wasm or harness.wasm_path()), plugin=plugin, **kw)
    if mutant:
        yaml = mutants.mutate(yaml, mutant)
    envoy = envoys.start(yaml, name, admin, component_log_level="wasm:info")
    prom.set_target(name, admin)
    return envoy, f"http://127.0.0.1:{port}"


class Phase:
    """One condition on one Envoy: fire, then clear; the measured seconds, from the moment the condition
    began and ended."""

    def __init__(self, prom, results: dict, node: str):
        self.prom, self.results, self.node = prom, results, node

    def fires(self, alert: str, since: float, timeout: float = 40, **labels) -> float:
        dt = P.wait_alert(self.prom, alert, True, timeout, since, instance=self.prom.instance(self.node), **labels)
        self.results.setdefault((alert, self.node), {})["fire"] = round(dt, 1)
        return dt

    def clears(self, alert: str, since: float, timeout: float = 40, **labels) -> float:
        dt = P.wait_alert(self.prom, alert, False, timeout, since, instance=self.prom.instance(self.node), **labels)
        self.results.setdefault((alert, self.node), {})["clear"] = round(dt, 1)
        return dt


def members_phase(envoys, prom, results, cluster):
    """Envoy A in front of a, with peers b and c: b refuses discovery (401), then b and c go away."""
    a, b, c = (cluster.instances[n] for n in "abc")
    envoy, url = plain_envoy(envoys, prom, "members", a, [b, c])
    envoy.wait_fresh(["a", "b", "c"], 20)
    prom.wait_scraped("members", 20)
    ph = Phase(prom, results, "members")
    t = time.monotonic()
    fault(b, "401")
    ph.fires("KubePeerProxyDiscoveryRefused", t, server="b")
    ph.fires("KubePeerProxyMemberNotFresh", t, server="b")  # after staleness_limit (5 s) + for
    t = time.monotonic()
    fault(b, "ok")
    ph.clears("KubePeerProxyMemberNotFresh", t, server="b")
    ph.clears("KubePeerProxyDiscoveryRefused", t, server="b")
    # b and c gone: what only they serve gets the filter's 503 (peer_unavailable) while a client asks.
    load = Load(url + NEW_ONLY)
    load.start()
    t = time.monotonic()
    b.stop()
    c.stop()
    try:
        ph.fires("KubePeerProxyDiscoveryErrors", t, server="c", type="unreachable")
        ph.fires("KubePeerProxySustained503s", t, type="peer_unavailable")
        t = time.monotonic()
        cluster.start("b", b.port, apiset="new")
        cluster.start("c", c.port, apiset="new")
        ph.clears("KubePeerProxySustained503s", t, type="peer_unavailable")
        ph.clears("KubePeerProxyDiscoveryErrors", t, server="c", type="unreachable")
    finally:
        load.stop()
    print("members phase, client answers:", load.codes)


def reroute_phase(envoys, prom, results, cluster):
    """A filter whose reroutes cannot connect (kpp.testing.mutants dead-peer) while a client asks for
    what only a peer serves; then the client stops."""
    a, b, c = (cluster.instances[n] for n in "abc")
    envoy, url = plain_envoy(envoys, prom, "reroute", a, [b, c], mutant="dead-peer")
    envoy.wait_fresh(["a", "b", "c"], 20)
    prom.wait_scraped("reroute", 20)
    ph = Phase(prom, results, "reroute")
    load = Load(url + NEW_ONLY, pace=0.05)
    t = time.monotonic()
    load.start()
    try:
        ph.fires("KubePeerProxyRerouteFailures", t)
    finally:
        load.stop()
    ph.clears("KubePeerProxyRerouteFailures", time.monotonic())
    print("reroute phase, client answers:", load.codes)


def vm_phase(envoys, prom, results, cluster, crash_wasm):
    """A filter VM that traps (tests/e2e/crash_filter, the same plugin names) on a request header."""
    envoy, url = plain_envoy(envoys, prom, "vm", cluster.instances["a"], [], wasm=crash_wasm,
                             failure_policy="FAIL_RELOAD")
    prom.wait_scraped("vm", 20)
    ph = Phase(prom, results, "vm")
    t = time.monotonic()
    for _ in range(3):
        assert request(url + "/version", headers={"x-crash-vm": "1"}).status == 503
        time.sleep(1.2)  # past the reload backoff: the next request gets a fresh VM
        request(url + "/version")
    ph.fires("KubePeerProxyWasmVMReloaded", t, plugin="filter")
    ph.clears("KubePeerProxyWasmVMReloaded", time.monotonic())


def probe_phase(envoys, prom, results, cluster):
    """First, for longer than the rule's window and `for:`, only the static pod's own readiness probe (its
    manifest's path and headers) and a kubectl client: nothing pending. Then the kubelet probes /livez
    without the marker, as it probes kube-apiserver when kubeadm moved the probes to Envoy."""
    envoy, url = plain_envoy(envoys, prom, "probes", cluster.instances["a"], [])
    prom.wait_scraped("probes", 20)
    ph = Phase(prom, results, "probes")
    own = {"User-Agent": "kube-probe/1.36", **static_envoy.probe_headers("readinessProbe")}
    quiet = [Load(url + static_envoy.probes()["readinessProbe"][2], own, pace=0.1),
             Load(url + COMMON, {"User-Agent": "kubectl/v1.36.3 (linux/amd64) kubernetes/abcdef0"}, pace=0.1)]
    alert = f'ALERTS{{alertname="KubePeerProxyKubeletProbesThroughProxy", instance="{prom.instance("probes")}"}}'
    start = time.time()
    for q in quiet:
        q.start()
    try:
        time.sleep(12)  # the window (5 s) + `for` (5 s) at SCALE, and two evaluations
        assert all(q.codes.get(200) for q in quiet), [q.codes for q in quiet]
        assert not prom.query_range(alert, start, time.time()), prom.query_range(alert, start, time.time())
        kubelet = Load(url + "/livez", {"User-Agent": "kube-probe/1.36"}, pace=0.1)
        t = time.monotonic()
        kubelet.start()
        try:
            ph.fires("KubePeerProxyKubeletProbesThroughProxy", t)
        finally:
            kubelet.stop()
        ph.clears("KubePeerProxyKubeletProbesThroughProxy", time.monotonic())
    finally:
        for q in quiet:
            q.stop()


def cert_phase(envoys, prom, results, tmp: Path, dashboard_checks: dict):
    """A kubeadm node whose serving and front-proxy-client certificates expire in 2 days; a renewal
    with a key that does not match; then a good renewal for a year."""
    node = KubeadmNode(tmp / "kubeadm", envoys, days=2)
    try:
        prom.set_target("cert", node.admin)
        prom.wait_scraped("cert", 20)
        ph = Phase(prom, results, "cert")
        t = time.monotonic()
        ph.fires("KubePeerProxyCertificateExpiring", t, envoy_tls_certificate="serving")
        ph.fires("KubePeerProxyCertificateExpiresSoon", t, envoy_tls_certificate="serving")
        expr = dict(P.dashboard_queries(RATE))["Days until certificate expiry (kubeadm profile)"]
        days = {r["metric"]["envoy_tls_certificate"]: float(r["value"][1]) for r in prom.query(expr)
                if r["metric"]["instance"] == prom.instance("cert")}
        dashboard_checks["Days until certificate expiry (kubeadm profile)"] = days
        assert 1 < days["serving"] < 2 and days["cluster-ca"] > 3000, days
        t = time.monotonic()
        wrong = node.leaf("apiserver", 365)
        node.install((wrong[0], node.leaf("apiserver", 365)[1]), "apiserver")  # a key of another certificate
        ph.fires("KubePeerProxyKeyRotationFailed", t, envoy_xds_resource_name="serving")
        t = time.monotonic()
        node.install(node.leaf("apiserver", 365), "apiserver")
        node.install(node.leaf("front-proxy-client", 365), "front-proxy-client")
        ph.clears("KubePeerProxyCertificateExpiresSoon", t)
        ph.clears("KubePeerProxyCertificateExpiring", t)
        ph.clears("KubePeerProxyKeyRotationFailed", t)  # 10 s (10 min / SCALE) after the refusal
    finally:
        node.close()


@pytest.fixture(scope="module")
def crash_wasm():
    target = harness.ROOT / "target" / "crash-filter"
    r = subprocess.run(["cargo", "build", "--offline", "--release", "--target", "wasm32-wasip1", "--manifest-path",
                        str(harness.ROOT / "tests" / "e2e" / "crash_filter" / "Cargo.toml"), "--target-dir", str(target)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return target / "wasm32-wasip1" / "release" / "crash_filter.wasm"


def test_each_alert_fires_on_its_condition_and_clears(envoys, prom, tmp_path, crash_wasm):
    results: dict = {}
    dashboard_checks: dict = {}
    cluster = Cluster()
    errors = []
    try:
        for n, apiset in (("a", "old"), ("b", "new"), ("c", "new")):
            cluster.start(n, apiset=apiset)
        # the reroute mutant needs peers that stay up: its own b and c
        other = Cluster()
        for n, apiset in (("a", "old"), ("b", "new"), ("c", "new")):
            other.start(n, apiset=apiset)

        def run(fn, *args):
            try:
                fn(envoys, prom, results, *args)
            except BaseException as e:  # noqa: BLE001 - reported below with the others
                errors.append(f"{fn.__name__}: {e!r}")
        phases = [threading.Thread(target=run, args=a) for a in (
            (members_phase, cluster), (reroute_phase, other), (vm_phase, cluster, crash_wasm),
            (probe_phase, cluster), (cert_phase, tmp_path, dashboard_checks))]
        for th in phases:
            th.start()
        # While they run: the dashboard's alert panel has data once something fires.
        alerts_expr = dict(P.dashboard_queries(RATE))["Firing kube-peer-proxy alerts"]
        wait_until(lambda: prom.query(alerts_expr), 60, 0.5, message="the alerts panel never had data")
        dashboard_checks["Firing kube-peer-proxy alerts"] = [r["metric"]["alertname"] for r in prom.query(alerts_expr)]
        for th in phases:
            th.join(180)
        other.stop_all()
    finally:
        cluster.stop_all()
    print("seconds from the condition to firing / from its end to clearing:")
    for (alert, node), r in sorted(results.items()):
        print(f"  {alert:38} {node:8} fire {r.get('fire', '-'):>5}  clear {r.get('clear', '-'):>5}")
    print("dashboard panels with data:", dashboard_checks)
    assert not errors, "\n".join(errors)
    tested = {a for a, _ in results}
    expected = {r["alert"] for r in P.rules() if "alert" in r} - {"KubePeerProxyDiscoveryStalled"}
    assert tested == expected, expected - tested
    assert all("fire" in r and "clear" in r for r in results.values()), results
