"""deploy/monitoring/rules_test.yaml (the `promtool test rules` file) generated from a live Envoy's series.

Every input series is a series a real Envoy with the filter exported (its name and labels copied from a
/stats/prometheus capture; `pick` fails when it is not there), with made-up values over time, and the
expected alerts' labels and annotations follow from the rule file. The rules are tested as written
(production `for:` and windows), at a 30 s scrape interval.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kpp.testing import prometheus as P

INSTANCE = "node-a:9901"
STEP = 30  # seconds between samples
SAMPLES = 81  # 40 minutes


class Capture:
    def __init__(self, exposition: str):
        self.series = P.parse_exposition(exposition)

    def pick(self, name: str, **labels) -> dict:
        """The labels of the captured series `name` with these label values (its other labels too)."""
        for n, ls, _v in self.series:
            if n == name and all(ls.get(k) == v for k, v in labels.items()):
                ls = dict(ls)
                if "envoy_listener_address" in ls:  # <ip>_<port>: the test's port is random, a node's is 6443
                    ls["envoy_listener_address"] = ls["envoy_listener_address"].rsplit("_", 1)[0] + "_6443"
                return {"__name__": n, **ls, "instance": INSTANCE, "job": P.JOB}
        have = sorted({tuple(sorted(ls.items())) for n, ls, _ in self.series if n == name})
        raise AssertionError(f"the live Envoy exported no {name} with {labels} (it has: {have or 'no such metric'})")


def series_text(labels: dict) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items() if k != "__name__")
    return f"{labels['__name__']}{{{inner}}}"


def values(*segments: tuple[float, float, int]) -> str:
    """promtool's expanding notation: (start, increment, samples) per segment, padded to SAMPLES with the
    last value."""
    parts, n, last = [], 0, 0.0
    for start, inc, count in segments:
        parts.append(f"{start:g}+{inc:g}x{count - 1}" if inc else f"{start:g}x{count - 1}")
        n += count
        last = start + inc * (count - 1)
    if n < SAMPLES:
        parts.append(f"{last:g}x{SAMPLES - n - 1}")
    return " ".join(parts)


def humanize_duration(v: float) -> str:
    """Prometheus' humanizeDuration (template.go) for whole seconds."""
    sign = "-" if v < 0 else ""
    v = abs(v)
    if v < 1:
        return f"{sign}{v:.4g}s"
    s = int(v)
    days, hours, minutes, secs = s // 86400, s // 3600 % 24, s // 60 % 60, s % 60
    if days:
        return f"{sign}{days}d {hours}h {minutes}m {secs}s"
    if hours:
        return f"{sign}{hours}h {minutes}m {secs}s"
    if minutes:
        return f"{sign}{minutes}m {secs}s"
    return f"{sign}{v:.4g}s"


def expand(template: str, labels: dict, value: float | None) -> str:
    out = re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template)
    if value is not None:
        out = re.sub(r"\{\{\s*\$value\s*\|\s*humanizeDuration\s*\}\}", humanize_duration(value), out)
    if "{{" in out:
        raise ValueError(f"template not expanded: {out}")
    return out


def expected(alerts: dict[str, dict], name: str, labels: dict, value: float | None = None) -> dict:
    rule = alerts[name]
    ls = {k: v for k, v in labels.items() if k != "__name__"}
    ls.update(rule.get("labels") or {})
    ann = {k: expand(v, ls, value) for k, v in (rule.get("annotations") or {}).items()}
    return {"exp_labels": ls, "exp_annotations": ann}


def keep(labels: dict, *names: str) -> dict:
    return {k: labels[k] for k in names}


def generate(capture: Capture, rules_file: str = "kube-peer-proxy.rules.yaml") -> str:
    alerts = {r["alert"]: r for r in P.rules() if "alert" in r}
    pick, E = capture.pick, (lambda *a, **k: expected(alerts, *a, **k))
    inputs, cases = [], []

    def feed(labels, vals):
        inputs.append({"series": series_text(labels), "values": vals})
        return labels

    def case(minutes, name, exp):
        cases.append({"eval_time": f"{round(minutes * 60)}s", "alertname": name, "exp_alerts": exp})

    # A member down from 2m to 7m: pending for its first 2m, firing after, gone once it answers again.
    b = feed(pick("kube_peer_proxy_server_fresh", server="b"), values((1, 0, 4), (0, 0, 10), (1, 0, 67)))
    feed(pick("kube_peer_proxy_server_fresh", server="a"), values((1, 0, SAMPLES)))
    case(3, "KubePeerProxyMemberNotFresh", [])
    case(4.5, "KubePeerProxyMemberNotFresh", [E("KubePeerProxyMemberNotFresh", b)])
    case(8, "KubePeerProxyMemberNotFresh", [])

    # Discovery refused (401) by c from 2m to 12m: firing after 5m of it, gone 5m after it stopped.
    c401 = feed(pick("kube_peer_proxy_discovery_sync_errors_total", type="http_status", server="c"),
                values((0, 0, 4), (0, 2, 20)))
    refused = keep(c401, "instance", "server", "type")
    case(5, "KubePeerProxyDiscoveryRefused", [])
    case(9, "KubePeerProxyDiscoveryRefused", [E("KubePeerProxyDiscoveryRefused", refused)])
    case(20, "KubePeerProxyDiscoveryRefused", [])

    # b unreachable from 2m to 22m: a 5m outage does not page, 10m does.
    bun = feed(pick("kube_peer_proxy_discovery_sync_errors_total", type="unreachable", server="b"),
               values((0, 0, 4), (0, 2, 40)))
    case(8, "KubePeerProxyDiscoveryErrors", [])
    case(14, "KubePeerProxyDiscoveryErrors",
         [E("KubePeerProxyDiscoveryErrors", keep(bun, "instance", "server", "type"))])
    case(30, "KubePeerProxyDiscoveryErrors", [])

    # The filter's 503s of both kinds from 2m to 22m.
    pu = feed(pick("kube_peer_proxy_peer_proxy_errors_total", type="peer_unavailable"), values((0, 0, 4), (0, 3, 40)))
    gn = feed(pick("kube_peer_proxy_peer_proxy_errors_total", type="guarded_not_found"),
              values((0, 0, 4), (0, 1, 40)))
    case(8, "KubePeerProxySustained503s", [])
    case(14, "KubePeerProxySustained503s", [E("KubePeerProxySustained503s", keep(pu, "instance", "type")),
                                            E("KubePeerProxySustained503s", keep(gn, "instance", "type"))])
    case(30, "KubePeerProxySustained503s", [])

    # Reroutes: 10 answered 200 per sample throughout, 2 answered 503 per sample from 2m to 12m (17%).
    ok = pick("kube_peer_proxy_rerouted_request_total", code="200")
    feed(ok, values((0, 10, SAMPLES)))
    bad = dict(pick("kube_peer_proxy_rerouted_request_total", code="503"))
    bad.update({k: ok[k] for k in ("group", "version", "resource")})  # same resource, another code
    feed(bad, values((0, 0, 4), (0, 2, 20)))
    case(5, "KubePeerProxyRerouteFailures", [])
    case(9, "KubePeerProxyRerouteFailures", [E("KubePeerProxyRerouteFailures", keep(ok, "instance"))])
    case(20, "KubePeerProxyRerouteFailures", [])

    # One filter VM reload at 2m: firing at once, for the 5m window.
    vm = feed(pick("envoy_wasm_kube_peer_proxy_vm_reload_success"), values((0, 0, 4), (1, 0, 77)))
    for other in ("envoy_wasm_kube_peer_proxy_discovery_vm_reload_success",
                  "envoy_wasm_kube_peer_proxy_vm_reload_failure"):
        feed(pick(other), values((0, 0, SAMPLES)))
    case(1, "KubePeerProxyWasmVMReloaded", [])
    case(3, "KubePeerProxyWasmVMReloaded", [E("KubePeerProxyWasmVMReloaded", {"instance": vm["instance"],
                                                                               "plugin": "filter"})])
    case(10, "KubePeerProxyWasmVMReloaded", [])

    # Rounds stop completing at 2m: the age grows by 30 s per sample, > 120 s from 4m, firing 5m later.
    age = feed(pick("kube_peer_proxy_snapshot_age_seconds"), values((0, 0, 4), (0, 30, 77)))
    case(8, "KubePeerProxyDiscoveryStalled", [])
    case(11, "KubePeerProxyDiscoveryStalled", [E("KubePeerProxyDiscoveryStalled", age)])

    # Certificates: serving expires 20 days after the epoch (promtool's time() starts at 0),
    # front-proxy-client 5 days after it, the cluster CA in 3650 days.
    listener = "envoy_listener_ssl_certificate_expiration_unix_time_seconds"
    cluster = "envoy_cluster_ssl_certificate_expiration_unix_time_seconds"
    serving = feed(pick(listener, envoy_tls_certificate="serving"), values((20 * 86400, 0, SAMPLES)))
    fpc = feed(pick(cluster, envoy_tls_certificate="front-proxy-client"), values((5 * 86400, 0, SAMPLES)))
    feed(pick(cluster, envoy_tls_certificate="cluster-ca"), values((3650 * 86400, 0, SAMPLES)))
    at = 11 * 60
    case(5, "KubePeerProxyCertificateExpiring", [])
    case(11, "KubePeerProxyCertificateExpiring", [
        E("KubePeerProxyCertificateExpiring", keep(serving, "instance", "envoy_tls_certificate"), 20 * 86400 - at),
        E("KubePeerProxyCertificateExpiring", keep(fpc, "instance", "envoy_tls_certificate"), 5 * 86400 - at)])
    case(11, "KubePeerProxyCertificateExpiresSoon", [
        E("KubePeerProxyCertificateExpiresSoon", keep(fpc, "instance", "envoy_tls_certificate"), 5 * 86400 - at)])

    # A refused renewal at 2m: firing for the 10m window.
    krf = feed(pick("envoy_sds_key_rotation_failed", envoy_xds_resource_name="serving"),
               values((0, 0, 4), (1, 0, 77)))
    case(3, "KubePeerProxyKeyRotationFailed", [E("KubePeerProxyKeyRotationFailed", krf)])
    case(15, "KubePeerProxyKeyRotationFailed", [])

    # The kubelet probes kube-apiserver through Envoy from 2m to 12m (33 a sample: kubeadm's readiness
    # probe every 1 s, liveness every 10 s); the other virtual cluster (the static pod's own readiness
    # probe, every other client) grows throughout and fires nothing.
    vc = "envoy_vhost_vcluster_upstream_rq_total"
    probes = feed(pick(vc, envoy_virtual_cluster="kubelet_probe"), values((0, 0, 4), (0, 33, 20)))
    feed(pick(vc, envoy_virtual_cluster="other"), values((0, 15, SAMPLES)))
    case(1.5, "KubePeerProxyKubeletProbesThroughProxy", [])
    case(5, "KubePeerProxyKubeletProbesThroughProxy", [])
    case(9, "KubePeerProxyKubeletProbesThroughProxy",
         [E("KubePeerProxyKubeletProbesThroughProxy", keep(probes, "instance"))])
    case(20, "KubePeerProxyKubeletProbesThroughProxy", [])

    doc = {"rule_files": [rules_file], "evaluation_interval": f"{STEP}s",
           "tests": [{"name": "kube-peer-proxy alerts on series a live Envoy exported", "interval": f"{STEP}s",
                      "input_series": inputs, "alert_rule_test": cases}]}
    head = ("# Generated by tests/e2e/test_monitoring.py from a live Envoy's /stats/prometheus (the series'\n"
            "# names and labels; values made up). Regenerate: KPP_UPDATE_MONITORING=1 .venv/bin/python -m pytest\n"
            "# tests/e2e/test_monitoring.py -k promtool. Run: promtool test rules deploy/monitoring/rules_test.yaml\n")
    return head + yaml.safe_dump(doc, sort_keys=False, width=1000, allow_unicode=True)


def alert_names_tested(text: str) -> set[str]:
    return {c["alertname"] for t in yaml.safe_load(text)["tests"] for c in t["alert_rule_test"]}


def write(path: Path, text: str):
    path.write_text(text)
