"""A legacy-discovery-only peer whose APIGroupList omits a group version it serves, as kube-apiserver's
does during an upgrade: the aggregator lists the group versions of the APIService objects in the shared
etcd, and the newer server's autoregister controller deletes the APIService of a group version only the
older server serves (seen on real v1.29.6 with AggregatedDiscoveryEndpoint=false beside v1.30.14,
tests/versions). The filter also reads such a peer's OpenAPI v3 index (`/openapi/v3`, from the server's own
handlers) and walks every group version in either list, so the type is routed to the peer. The control: the
same peer without an index gets the guard's 503 (never a false 404), and nothing is routed.

Fakes: a (old API set, aggregated discovery), b (new API set, legacy discovery only, resource.k8s.io/v1
left out of its APIGroupList); real Envoy with the real .wasm in front of a, b its only peer.
"""

from __future__ import annotations

import pytest

from kpp import render
from kpp.testing import harness
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.proc import request, served_by
from kpp.testing.topology import FAST, NEW_ONLY

HIDDEN = ("resource.k8s.io", "v1")


@pytest.fixture
def fakes():
    cluster = Cluster()
    a = cluster.start("a", apiset="old")
    b = cluster.start("b", apiset="new", aggregated=False)
    b.unlisted_group_versions = {HIDDEN}
    yield cluster, a, b
    cluster.stop_all()


def start(envoys, a, b):
    port, admin = harness.free_port(), harness.free_port()
    yaml = render.render_bootstrap(node="a", listen_port=port, admin_port=admin, local=("127.0.0.1", a.port),
                                   peers=[("b", "127.0.0.1", b.port)], wasm_path=str(harness.wasm_path()),
                                   plugin=dict(FAST))
    envoy = envoys.start(yaml, "a", admin)
    envoy.wait_fresh(["a", "b"], timeout=20)
    return envoy, port


def test_the_fake_lists_the_group_version_in_its_index_only(fakes):
    _, _, b = fakes
    groups = request(f"{b.url}/apis", headers={"Accept": "application/json"}).json()["groups"]
    assert "resource.k8s.io/v1" not in {v["groupVersion"] for g in groups for v in g["versions"]}
    assert "apis/resource.k8s.io/v1" in request(f"{b.url}/openapi/v3").json()["paths"]
    assert request(f"{b.url}/apis/resource.k8s.io/v1").status == 200


def test_a_group_version_only_the_openapi_index_lists_is_routed_to_the_legacy_peer(envoys, fakes):
    _, a, b = fakes
    envoy, port = start(envoys, a, b)
    r = request(f"http://127.0.0.1:{port}{NEW_ONLY}")
    assert r.status == 200 and served_by(r) == "b", r
    index_asks = [q for q in request(f"{b.url}/__fake/requests").json() if q["path"].startswith("/openapi/v3")]
    assert index_asks and all(q["headers"].get("x-kubernetes-peer-proxied") == "true" for q in index_asks)


def test_control_without_the_index_the_type_is_a_503_never_a_404(envoys, fakes):
    _, a, b = fakes
    b.openapi_index = False
    envoy, port = start(envoys, a, b)
    r = request(f"http://127.0.0.1:{port}{NEW_ONLY}")
    assert r.status == 503 and r.headers.get("x-kube-peer-proxy-reply") == "true", r
    assert not [q for q in request(f"{b.url}/__fake/requests").json() if q["path"].startswith(NEW_ONLY)]
