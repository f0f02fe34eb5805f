"""Content negotiation for /apis and /api through the filter, for the Accept strings real clients send
(real clients' Accept strings): each gets what the apiserver would give — the peer-aggregated v2 document, or the local
server's own answer (v2beta1, legacy, nopeer, 406)."""

from __future__ import annotations

import pytest

from kpp.testing.topology import V2, Topology

V2B1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
PB_V2 = "application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

# (client, Accept, who answers, Content-Type / status expected). "legacy" is the merged APIGroupList
# for /apis; for /api the local APIVersions answers (the core group only ever has v1).
CASES = [
    ("kubectl 1.26-1.29", f"{V2B1},application/json", "legacy", "application/json"),
    ("kubectl 1.30-1.36", f"{V2},{V2B1},application/json", "merged", V2),
    ("kubectl 1.37", f"{V2},application/json", "merged", V2),
    ("client-go NoPeerDiscovery", f"{V2};profile=nopeer,{V2},{V2B1},application/json", "local", V2),
    ("client-go UseLegacyDiscovery", "application/json", "legacy", "application/json"),
    ("apiserver peer fetch", f"{V2};profile=nopeer,{V2},application/json", "local", V2),
    ("kube-aggregator", V2, "merged", V2),
    ("params reordered with spaces", "application/json; as=APIGroupDiscoveryList; v=v2; g=apidiscovery.k8s.io",
     "merged", V2),
    ("protobuf first, JSON v2 second", f"{PB_V2},{V2}", "merged", V2),
    ("protobuf nopeer", f"{PB_V2};profile=nopeer,application/json", "local", "application/json"),
    ("no Accept", None, "legacy", "application/json"),
    ("*/*", "*/*", "legacy", "application/json"),
    ("Table Accept of kubectl get (as=Table skipped)",
     "application/json;as=Table;v=v1;g=meta.k8s.io,application/json", "legacy", "application/json"),
    ("v2beta1 only (1.33+ servers removed it)", V2B1, "local", 406),
    ("nothing acceptable", "text/html", "local", 406),
]


@pytest.fixture(scope="module")
def topo(request):
    # One Envoy for the whole table: negotiation does not change state.
    from conftest import EnvoyRegistry
    tmp = request.config._tmp_path_factory.mktemp("negotiation")
    registry = EnvoyRegistry(tmp)
    t = Topology(registry).start()
    yield t
    registry.stop_all()
    t.close()


@pytest.mark.parametrize("endpoint", ["/apis", "/api"])
@pytest.mark.parametrize("client,accept,who,expect", CASES, ids=[c[0] for c in CASES])
def test_discovery_accept(topo, endpoint, client, accept, who, expect):
    headers = {"Accept": accept} if accept is not None else {}
    r = topo.get(endpoint, **headers)
    # What the local apiserver itself answers to the same Accept.
    from kpp.testing.topology import request
    direct = request(f"{topo.a.url}{endpoint}", headers=headers)
    if who == "legacy" and endpoint == "/apis":
        # The local server authorized and answered; the filter swapped in the merged document.
        assert r.status == 200 and r.headers.get("x-fake-apiserver") == "a", r
        assert r.body != direct.body
        assert r.headers["content-type"] == "application/json"
        doc = r.json()
        assert doc["kind"] == "APIGroupList"
        groups = {g["name"]: [v["version"] for v in g["versions"]] for g in doc["groups"]}
        local = {g["name"]: [v["version"] for v in g["versions"]] for g in direct.json()["groups"]}
        assert "lifecycle.k8s.io" in groups, "a group only the new servers serve"
        assert set(local) <= set(groups)
        assert {"v1", "v1alpha3"} <= set(groups["resource.k8s.io"])
    elif who == "merged":
        assert r.status == 200 and r.headers.get("x-fake-apiserver") == "a", r
        assert r.body != direct.body, "the merged document, not the local one"
        assert r.headers["content-type"] == expect
        assert r.json()["apiVersion"] == "apidiscovery.k8s.io/v2"
        if endpoint == "/apis":
            names = {g["metadata"]["name"] for g in r.json()["items"]}
            assert "lifecycle.k8s.io" in names, "a group only the new servers serve"
    else:  # local, or legacy /api
        assert r.headers.get("x-fake-apiserver") == "a", r
        assert (r.status, r.body) == (direct.status, direct.body)
        if isinstance(expect, int):
            assert r.status == expect
        else:
            assert r.status == 200 and r.headers["content-type"].startswith(expect)
