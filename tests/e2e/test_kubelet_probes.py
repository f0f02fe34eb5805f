"""The kubelet's probes of kube-apiserver that come through Envoy are counted (docs/deploy.md "Kubelet probes
through the proxy").

kubeadm's patches point kube-apiserver's probes at 127.0.0.1; a `kubeadm upgrade` without them moves them
back to <node-ip>:6443, Envoy's client listener. The kubelet's HTTP probes send `User-Agent:
kube-probe/<major>.<minor>`, and so does the static pod's own readiness probe on the same listener, which
adds the marker header kpp.render.PROBE_HEADER (deploy/static-pod.yaml). Envoy's virtual cluster
`kubelet_probe` counts the first kind only, in `envoy_vhost_vcluster_upstream_rq_total`, and the marker
never reaches an apiserver.

* A kubeadm-profile node (TLS, the topology of test_pki_reload, one node): kubeadm's probes (/livez,
  /readyz with a kube-probe User-Agent) are counted; the manifest's own readiness probe (its path and
  headers, as the kubelet sends them) and kubectl requests are not; the fake apiserver never sees the
  marker; kube-peer-proxy-status shows the count with a WARNING only once it is not zero.
* What is not counted: the probes Envoy or the filter answer themselves (the filter's /readyz 503 before
  the first snapshot, Envoy's health-check 503 while draining) and those that cannot reach the local
  apiserver; /livez is forwarded in the first two states and counted.
* The control: the same bootstrap without the marker's matcher and without the route config's
  request_headers_to_remove counts the own probe, and the fake apiserver sees the marker.
"""

from __future__ import annotations

import json

from kpp import render, status
from kpp.testing import harness, static_envoy
from kpp.testing import prometheus as P
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.topology import COMMON, request
from test_pki_reload import Node, Pki, fake_tls  # the kubeadm-profile node with a TLS fake apiserver

KUBELET = {"User-Agent": "kube-probe/1.36", "Accept": "*/*"}  # what the kubelet sends (pkg/probe/http)
KUBECTL = {"User-Agent": "kubectl/v1.36.3 (linux/amd64) kubernetes/abcdef0", "Accept": "application/json"}
SERIES = "envoy_vhost_vcluster_upstream_rq_total"
LABELS = {"envoy_virtual_host": "apiserver", "envoy_virtual_cluster": "kubelet_probe"}


def counted(envoy) -> float:
    """The kubelet_probe series of the client listener's virtual host, from /stats/prometheus."""
    (value,) = [v for n, ls, v in P.parse_exposition(envoy.prometheus()) if n == SERIES and ls == LABELS]
    return value


def status_lines(admin_url: str, prev: status.Scrape) -> tuple[status.Scrape, list[str]]:
    cur = status.scrape(admin_url)
    return cur, [ln for ln in status.render_node("a", prev, cur, 110) if "kubelet probes" in ln or "WARNING" in ln]


def test_kubeadm_probes_through_envoy_are_counted_and_the_proxys_own_probe_is_not(tmp_path, envoys):
    assert (status.PROBES_VCLUSTER, static_envoy.probe_headers("readinessProbe")) == (
        render.KUBELET_PROBE_VCLUSTER, {render.PROBE_HEADER: "readiness"})
    pki, fakes = Pki(tmp_path / "pki"), Cluster()
    fake = fakes.start("a", apiset="old", tls=fake_tls(pki))
    node = Node("a", "127.0.0.26", pki, fake, envoys, tmp_path, harness.free_port(), harness.free_port(),
                with_reload=False)
    try:
        node.start([])
        node.envoy.wait_snapshot(30)
        # The series exists from the start, at 0: Prometheus sees the first probe as an increase.
        assert counted(node.envoy) == 0
        first, lines = status_lines(node.envoy.admin_url, None)
        assert lines == ["  kubelet probes proxied  0 total"], lines

        # The static pod's own readiness probe, exactly as the manifest has the kubelet send it, and kubectl.
        listener, scheme, path = static_envoy.probes()["readinessProbe"]
        assert (listener, scheme) == ("client", "HTTPS")
        own = {**KUBELET, **static_envoy.probe_headers("readinessProbe")}
        for _ in range(3):
            assert node.get(path, headers=own)[0] == 200
            for p in ("/livez", "/readyz", COMMON):
                assert node.get(p, headers=KUBECTL)[0] == 200
        assert counted(node.envoy) == 0

        # kubeadm's probes of kube-apiserver, moved to <node-ip>:6443: liveness and startup /livez, readiness /readyz.
        for _ in range(2):
            for p in ("/livez", "/readyz"):
                st, headers, _ = node.get(p, headers=KUBELET)
                assert (st, headers.get("x-fake-apiserver")) == (200, "a"), (p, st, headers)
        assert counted(node.envoy) == 4

        # The marker reached no apiserver; the own probe itself did (its User-Agent, without the marker).
        seen = fake.requests()
        assert not [q for q in seen if render.PROBE_HEADER in q["headers"]], seen
        own_seen = [q for q in seen if q["path"] == path and q["headers"].get("user-agent") == KUBELET["User-Agent"]]
        assert len(own_seen) == 3 + 2, own_seen

        _, lines = status_lines(node.envoy.admin_url, first)
        print("\n".join(lines))
        assert lines[0].startswith("  kubelet probes proxied  4 total, ") and "WARNING" in lines[0], lines
        assert all(len(ln) <= 110 for ln in lines)
    finally:
        node.stop()
        fakes.stop_all()


def test_probes_answered_by_envoy_or_the_filter_or_not_forwarded_are_not_counted(topo):
    # The peers' discovery hangs: no snapshot for 10 s, and the filter answers /readyz 503 itself.
    for inst in (topo.b, topo.c):
        assert request(f"{inst.url}/__fake/fault", "POST", body=b'{"discovery":"timeout"}').status == 200
    topo.start(plugin={"fetch_timeout": "10s", "refresh_interval": "1s"}, wait_snapshot=False)

    def probe(path: str) -> tuple[int, float]:
        st = request(topo.url(path), headers=KUBELET).status
        return st, counted(topo.envoy)

    assert probe("/readyz") == (503, 0)
    assert probe("/livez") == (200, 1)
    assert topo.envoy.snapshot_generation() == 0, "the window without a snapshot ended during the test"
    # Draining: Envoy's health_check filter answers /readyz; /livez still reaches the apiserver.
    assert request(topo.envoy.admin_url + "/healthcheck/fail", "POST").status == 200
    assert probe("/readyz") == (503, 1)
    assert probe("/livez") == (200, 2)
    assert request(topo.envoy.admin_url + "/healthcheck/ok", "POST").status == 200
    # The local apiserver down: Envoy cannot connect, and the probe is not counted either.
    topo.a.stop()
    assert probe("/livez") == (503, 2)


def test_control_without_the_marker_matcher_and_the_strip_the_own_probe_counts_and_reaches_the_apiserver(topo):
    yaml, port, admin = topo.bootstrap()
    b = json.loads(yaml)
    rc = b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
    assert rc.pop("request_headers_to_remove") == [render.PROBE_HEADER]
    (vc,) = rc["virtual_hosts"][0]["virtual_clusters"]
    vc["headers"] = [h for h in vc["headers"] if h["name"] != render.PROBE_HEADER]
    envoy = topo.envoys.start(json.dumps(b), "control", admin)
    envoy.wait_snapshot(20)
    own = {**KUBELET, **static_envoy.probe_headers("readinessProbe")}
    assert request(f"http://127.0.0.1:{port}/readyz", headers=own).status == 200
    assert counted(envoy) == 1
    assert [q for q in topo.a.requests() if q["headers"].get(render.PROBE_HEADER) == "readiness"]
