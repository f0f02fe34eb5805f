"""Envoy-in-the-loop: real Envoy (through func-e), the real .wasm, fake apiservers that speak the
real wire formats. `a` serves the 1.33 API set, `b` and `c` the 1.37-dev set; requests go to a's
Envoy as they would during an upgrade in which `a` has not been upgraded yet."""

from __future__ import annotations

import json
import re
import time

import pytest

from kpp.testing import harness
from kpp.testing.proc import served_by
from kpp.testing.topology import COMMON, KUBECTL_ACCEPT, NEW_ONLY, NOPEER, NOWHERE, OLD_ONLY, Topology, V2, request




def test_new_only_resource_is_rerouted_to_a_new_server_with_the_proxied_header(topo):
    topo.start()
    seen = set()
    for _ in range(20):
        r = topo.get(NEW_ONLY)
        assert r.status == 200, r
        assert r.json()["kind"] == "ResourceClaimList"
        assert r.headers.get("x-fake-peer-proxied") == "true", "peer did not receive x-kubernetes-peer-proxied"
        seen.add(served_by(r))
    # Random choice among the fresh peers that serve it: both new servers get traffic.
    assert seen == {"b", "c"}
    assert not any(q["path"].startswith(NEW_ONLY) for q in topo.fake_requests(topo.a))


def test_locally_served_resource_stays_local_without_the_header(topo):
    topo.start()
    for path in (COMMON, OLD_ONLY, "/api/v1/namespaces/default/configmaps"):
        r = topo.get(path)
        assert (r.status, served_by(r)) == (200, "a"), (path, r)
        assert "x-fake-peer-proxied" not in r.headers
    assert topo.counter("kube_peer_proxy_rerouted_request_total") == 0


def test_create_through_reroute_is_visible_to_every_server(topo):
    topo.start()
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "claim-1"}, "spec": {}}
    r = topo.send("POST", NEW_ONLY, claim)
    assert r.status == 201 and served_by(r) in {"b", "c"}, r
    r = topo.get(NEW_ONLY + "/claim-1")
    assert r.status == 200 and r.json()["metadata"]["name"] == "claim-1"
    r = topo.send("DELETE", NEW_ONLY + "/claim-1")
    assert r.status == 200 and served_by(r) in {"b", "c"}, r
    assert topo.get(NEW_ONLY + "/claim-1").status == 404


def test_loop_prevention_serves_already_proxied_requests_locally(topo):
    topo.start()
    r = topo.get(NEW_ONLY, x_kubernetes_peer_proxied="true")
    # a does not serve resource.k8s.io/v1: its own (genuine) 404, not a second hop.
    assert (r.status, served_by(r)) == (404, "a"), r
    # Any other value is not the loop marker (upstream compares with "true").
    r = topo.get(NEW_ONLY, x_kubernetes_peer_proxied="yes")
    assert r.status == 200 and served_by(r) in {"b", "c"}, r


def test_resource_nobody_serves_is_a_genuine_404_from_the_local_server(topo):
    topo.start()
    r = topo.get(NOWHERE)
    assert (r.status, served_by(r)) == (404, "a"), r
    r = topo.get("/apis/apps/v1/namespaces/default/deployments/x/nosuchsub")
    assert (r.status, served_by(r)) == (404, "a"), r


def test_subresource_only_a_peer_serves_is_forwarded_even_though_the_parent_is_local(topo):
    topo.start()
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"}, "spec": {}}
    r = topo.send("POST", "/api/v1/namespaces/default/pods", pod)
    assert (r.status, served_by(r)) == (201, "a"), r
    r = topo.get("/api/v1/namespaces/default/pods/p1/resize")
    assert r.status == 200 and served_by(r) in {"b", "c"}, r
    r = topo.get("/api/v1/namespaces/default/pods/p1/status")
    assert (r.status, served_by(r)) == (200, "a"), r


def test_before_the_first_snapshot_local_requests_succeed_and_peer_only_ones_get_503_never_404(topo):
    """Local first: no blanket 503 while nothing is known. The local server answers what it serves from the
    first request; its "not served here" 404 for a resource only the (not yet learned) peers serve becomes a
    503 Status with Retry-After, never reaching the client as a 404."""
    # The peers' discovery hangs: no round can finish (and no snapshot exist) before the 10 s fetch timeout.
    for inst in (topo.b, topo.c):
        assert request(f"{inst.url}/__fake/fault", "POST", body=b'{"discovery":"timeout"}').status == 200
    topo.start(plugin={"fetch_timeout": "10s", "refresh_interval": "1s", "retry_after_seconds": 3},
               wait_snapshot=False)
    assert topo.envoy.snapshot_generation() == 0
    guarded = "kube_peer_proxy_peer_proxy_errors_total;type=guarded_not_found"
    before = topo.counter(guarded)
    rounds = 0
    for _ in range(5):
        for path in (COMMON, OLD_ONLY, "/api/v1/namespaces/default/configmaps", COMMON + "/missing"):
            r = topo.get(path)
            # Stays local, unchanged (a's own 404 for a missing object of a type it serves included).
            assert served_by(r) == "a" and r.status == (404 if path.endswith("/missing") else 200), (path, r)
        for path in (NEW_ONLY, NEW_ONLY + "/claim-x", "/apis/lifecycle.k8s.io/v1alpha1"):
            r = topo.get(path)
            assert r.status == 503, (path, r)
            assert r.headers.get("retry-after") == "3"
            assert r.headers.get("x-kube-peer-proxy-reply") == "true"
            status = r.json()
            assert (status["kind"], status["reason"], status["code"]) == ("Status", "ServiceUnavailable", 503)
            assert status["details"]["retryAfterSeconds"] == 3
            rounds += 1
        time.sleep(0.2)
    assert topo.envoy.snapshot_generation() == 0, "the window without a snapshot ended during the test"
    assert topo.counter(guarded) - before == rounds
    # Merged discovery is not answered from an empty snapshot: the local server's own document passes.
    r = topo.get("/apis", accept=V2)
    assert (r.status, served_by(r)) == (200, "a")
    assert r.body == request(f"{topo.a.url}/apis", headers={"Accept": V2}).body
    # A load balancer keeps the node out until it can route (src/request/readiness.rs); liveness is the apiserver's.
    for path in ("/healthz", "/readyz"):
        r = topo.get(path)
        assert (r.status, r.headers.get("x-kube-peer-proxy-reply"), served_by(r)) == (503, "true", ""), (path, r)
    assert (topo.get("/livez").status, served_by(topo.get("/livez"))) == (200, "a")
    for inst in (topo.b, topo.c):
        request(f"{inst.url}/__fake/fault", "POST", body=b'{"discovery":"ok"}')
    harness.wait_until(lambda: topo.get(NEW_ONLY).status == 200, 25, message="never routed after recovery")


def test_client_supplied_routing_header_cannot_pick_a_cluster(topo):
    topo.start()
    for value in ("peer-b", "peer-c", "local", "no-such-cluster"):
        r = topo.get(COMMON, x_kube_peer_proxy_cluster=value)
        assert (r.status, served_by(r)) == (200, "a"), (value, r)
    for q in topo.fake_requests(topo.a):
        assert "x-kube-peer-proxy-cluster" not in q["headers"]
    # A rerouted request carries the filter's own choice, never the client's.
    r = topo.get(NEW_ONLY, x_kube_peer_proxy_cluster="local")
    assert r.status == 200 and served_by(r) in {"b", "c"}


def gvrs(doc) -> set[tuple[str, str, str]]:
    return {(g["metadata"].get("name", ""), v["version"], r["resource"])
            for g in doc["items"] for v in g["versions"] for r in v.get("resources", [])
            if v.get("freshness") != "Stale"}


def test_merged_apis_is_the_union_and_nopeer_gets_the_local_view(topo):
    topo.start()
    local = request(f"{topo.a.url}/apis", headers={"Accept": V2}).json()
    new = request(f"{topo.b.url}/apis", headers={"Accept": V2}).json()
    r = topo.get("/apis", accept=KUBECTL_ACCEPT)
    # The local server answers (so it authenticates and authorizes the request); the filter replaces
    # its document with the merged one.
    assert r.status == 200 and served_by(r) == "a", r
    assert r.headers["content-type"] == V2
    assert r.headers["vary"] == "Accept" and r.headers["cache-control"] == "public"
    merged = r.json()
    assert (merged["kind"], merged["apiVersion"]) == ("APIGroupDiscoveryList", "apidiscovery.k8s.io/v2")
    assert gvrs(merged) == gvrs(local) | gvrs(new)
    assert ("resource.k8s.io", "v1", "resourceclaims") in gvrs(merged)
    assert ("resource.k8s.io", "v1alpha3", "resourceclaims") in gvrs(merged)

    r = topo.get("/apis", accept=NOPEER + "," + V2)
    assert (r.status, served_by(r)) == (200, "a")
    assert gvrs(r.json()) == gvrs(local)
    # Legacy discovery clients get the union too, as an APIGroupList.
    r = topo.get("/apis", accept="application/json")
    assert (r.status, served_by(r), r.json()["kind"]) == (200, "a", "APIGroupList")
    legacy = {(g["name"], v["version"]) for g in r.json()["groups"] for v in g["versions"]}
    assert legacy == {(g, v) for g, v, _ in gvrs(merged)}


def test_the_local_servers_refusal_of_a_discovery_request_stands(topo):
    """Merged discovery is only ever a replacement for the local server's 200: whatever else it
    answers (401/403 for a client it does not accept, 500 here) reaches the client unchanged."""
    topo.start(plugin={"staleness_limit": "30s"})
    assert request(f"{topo.a.url}/__fake/fault", "POST", body=b'{"discovery":"500"}').status == 200
    r = topo.get("/apis", accept=V2)
    assert (r.status, served_by(r)) == (500, "a"), r
    assert r.json()["kind"] == "Status"
    request(f"{topo.a.url}/__fake/fault", "POST", body=b'{"discovery":"ok"}')
    r = topo.get("/apis", accept=V2)
    assert r.status == 200 and "lifecycle.k8s.io" in {g["metadata"]["name"] for g in r.json()["items"]}


def test_merged_api_core_group_includes_a_peer_only_subresource(topo):
    topo.start()
    r = topo.get("/api", accept=V2)
    assert r.status == 200 and r.headers["content-type"] == V2
    core = r.json()["items"]
    assert len(core) == 1 and core[0]["metadata"] == {}
    pods = next(res for res in core[0]["versions"][0]["resources"] if res["resource"] == "pods")
    assert "resize" in {s["subresource"] for s in pods["subresources"]}
    local_core = request(f"{topo.a.url}/api", headers={"Accept": V2}).json()["items"][0]
    local_pods = next(res for res in local_core["versions"][0]["resources"] if res["resource"] == "pods")
    assert "resize" not in {s["subresource"] for s in local_pods.get("subresources", [])}


def test_etag_and_304_on_merged_discovery(topo):
    topo.start()
    first = topo.get("/apis", accept=V2)
    etag = first.headers["etag"]
    assert re.fullmatch(r'"[0-9A-F]{32}"', etag)
    again = topo.get("/apis", accept=V2)
    assert again.headers["etag"] == etag and again.body == first.body
    r = topo.get("/apis", accept=V2, if_none_match=etag)
    assert r.status == 304 and r.body == b""
    assert topo.get("/apis", accept=V2, if_none_match='"stale"').status == 200
    assert topo.counter("kube_peer_proxy_merged_discovery_responses_total;doc=apis;code=304") == 1


def test_group_version_discovery_only_a_peer_serves_is_forwarded(topo):
    topo.start()
    r = topo.get("/apis/resource.k8s.io/v1")
    assert r.status == 200 and served_by(r) in {"b", "c"}, r
    assert r.json()["kind"] == "APIResourceList"
    r = topo.get("/apis/resource.k8s.io/v1alpha3")
    assert (r.status, served_by(r)) == (200, "a"), r
    r = topo.get("/apis/lifecycle.k8s.io")
    assert r.status == 200 and served_by(r) in {"b", "c"}, r


def test_metrics_move_and_are_labelled_in_prometheus(topo):
    topo.start()
    before = topo.counter("kube_peer_proxy_rerouted_request_total")
    for _ in range(3):
        assert topo.get(NEW_ONLY).status == 200
    assert topo.get(NEW_ONLY + "/missing").status == 404
    assert topo.counter("kube_peer_proxy_rerouted_request_total") == before + 4
    prom = topo.envoy.prometheus()
    assert re.search(r'^kube_peer_proxy_rerouted_request_total\{(?=.*code="200")(?=.*group="resource.k8s.io")'
                     r'(?=.*version="v1")(?=.*resource="resourceclaims").*\} 3$', prom, re.M), prom
    assert re.search(r'^kube_peer_proxy_rerouted_request_total\{(?=.*code="404").*\} 1$', prom, re.M)
    assert re.search(r"^kube_peer_proxy_snapshot_generation\{\} [1-9]", prom, re.M)
    for server in "abc":
        assert re.search(rf'^kube_peer_proxy_server_fresh\{{server="{server}"\}} 1$', prom, re.M), prom


def test_unreachable_peer_counts_a_sync_error_and_is_not_routed_to_while_another_serves(topo):
    topo.start(plugin={"staleness_limit": "2s"})
    topo.b.stop()
    harness.wait_until(lambda: topo.counter("kube_peer_proxy_discovery_sync_errors_total;type=unreachable;server=b") > 0,
                       10, message="no sync error counted for the stopped peer")
    # b stays a member (it still counts as serving the new resources) but is not routed to: only c answers,
    # right after the failed round and still past the staleness limit.
    assert {served_by(topo.get(NEW_ONLY)) for _ in range(10)} == {"c"}
    time.sleep(3)
    assert {served_by(topo.get(NEW_ONLY)) for _ in range(10)} == {"c"}


@pytest.mark.parametrize("bad,field", [
    ('{"local_cluster":"local","peers":[{"name":"b"}]}', "peers[0].cluster"),
    ('{"local_cluster":"local","refresh_interval":5}', "refresh_interval"),
    ('{"local_cluster":"local","bogus":1}', "bogus"),
    ('{"local_cluster":"local","peers":[{"name":"b","cluster":"peer-b"},{"name":"b","cluster":"peer-c"}]}',
     "peers[1].name"),
    ('{"local_cluster":"local","refresh_interval":"0s"}', "refresh_interval"),
])
def test_invalid_plugin_config_is_rejected_at_load_with_the_field_named(topo, tmp_path, bad, field):
    yaml, _, admin = topo.bootstrap(filter_plugin=bad)
    env = harness.Envoy(yaml, "bad", admin, workdir=tmp_path / "bad")
    topo.envoys.started.append(env)
    with pytest.raises(RuntimeError):
        env.start(timeout=20)
    log = env.log_text()
    assert "invalid plugin configuration: " + field in log, log[-3000:]
    # The same bootstrap with a valid configuration passes validation, so only the filter config broke it.
    good, _, _ = topo.bootstrap()
    assert harness.validate_config(good, tmp_path / "v").returncode == 0


def test_committed_envoy_configs_validate():
    import subprocess

    from kpp import render
    for path in sorted((harness.ROOT / "envoy" / "demo").glob("*.yaml")):
        # Run from the repo root: the demo bootstraps name the .wasm relative to it.
        r = subprocess.run([str(harness.envoy_binary()), "--mode", "validate", "-c", str(path)],
                           cwd=harness.ROOT, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (path, r.stdout[-2000:], r.stderr[-2000:])
    assert render.demo_bootstraps() == {p.stem: p.read_text() for p in (harness.ROOT / "envoy" / "demo").glob("*.yaml")}, \
        "envoy/demo is out of date: run `make envoy-configs`"


def test_killed_peers_give_503_status_with_retry_after_never_404_and_route_again_on_return(topo, envoys):
    topo.start(plugin={"staleness_limit": "30s"})
    topo.b.stop()
    topo.c.stop()
    # Until the next discovery round notices, the first request may hit a dead peer: Envoy's own
    # reply is rewritten to a Status; after that the filter answers itself.
    for _ in range(10):
        r = topo.get(NEW_ONLY)
        assert r.status == 503, r
        assert r.headers.get("retry-after") == "1", r.headers
        assert r.json()["kind"] == "Status" and r.json()["code"] == 503
    assert topo.counter("kube_peer_proxy_peer_proxy_errors_total;type=peer_unavailable") > 0
    # A resource the local server serves is unaffected.
    assert topo.get(COMMON).status == 200
    topo.cluster.restart("b")
    harness.wait_until(lambda: topo.get(NEW_ONLY).status == 200, 5, message="did not route again after b returned")
    assert {served_by(topo.get(NEW_ONLY)) for _ in range(5)} == {"b"}


def test_when_one_of_two_serving_peers_dies_traffic_moves_to_the_other(topo):
    topo.start(plugin={"refresh_interval": "5s", "staleness_limit": "30s"})
    assert topo.get(NEW_ONLY).status == 200
    topo.b.stop()
    # Discovery has not noticed yet (5 s rounds): the first request that picks b fails and marks
    # it down in shared data; every later one, on either worker, goes to c.
    statuses = [(topo.get(NEW_ONLY).status) for _ in range(30)]
    assert statuses.count(503) <= 1, statuses
    first = statuses.index(503) if 503 in statuses else 0
    assert statuses[first + 1:] == [200] * (len(statuses) - first - 1), statuses


@pytest.mark.parametrize("path", [
    "/apis/apps/v1/namespaces/default/deployments//x",
    "/apis/apps/v1/namespaces/default/deployments/a%2Fb",
    "/apis/apps/v1/namespaces/default/./deployments",
    "/api/v1/namespaces/default/configmaps/%7Euser",
])
def test_envoy_passes_the_path_unchanged_so_filter_and_apiserver_agree(topo, path):
    """normalize_path/merge_slashes off and escaped slashes kept: the apiserver sees the raw path."""
    topo.start()
    topo.get(path)
    seen = [q["path"] for q in topo.fake_requests(topo.a)]
    assert path in seen, seen
