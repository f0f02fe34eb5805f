"""Every node builds the same merged discovery: three Envoys, one in front of each fake apiserver
(a old, b and c new), each with the other two as peers. Behind a load balancer a client may reach
any of them; the merged documents and their ETags must be byte-identical so clients' discovery
caches do not churn (upstream orders servers by identity for the same reason)."""

from __future__ import annotations

import json

from kpp import harness, render
from kpp.fake_apiserver import Cluster
from kpp.fake_apiserver.discovery import FIXTURES
from kpp.topology import FAST, V2, request

DOCS = {"/apis (v2)": ("/apis", V2), "/api (v2)": ("/api", V2), "/apis (legacy)": ("/apis", "application/json")}


def c_apis() -> dict:
    """The new set, but c disagrees with a and b about one resource's short names and categories:
    which server's metadata wins must not depend on which node merges."""
    doc = json.loads((FIXTURES / "aggregated_v2.k8s-1.37-dev-fork.json").read_text())
    apps = next(g for g in doc["items"] if g["metadata"]["name"] == "apps")
    v1 = next(v for v in apps["versions"] if v["version"] == "v1")
    deployments = next(r for r in v1["resources"] if r["resource"] == "deployments")
    deployments["shortNames"] = ["dpl"]
    deployments["categories"] = ["c-only"]
    return doc


def test_merged_discovery_is_byte_identical_on_every_node(envoys):
    cluster = Cluster()
    try:
        servers = {"a": cluster.start("a", apiset="old"), "b": cluster.start("b", apiset="new"),
                   "c": cluster.start("c", apiset={"apis": c_apis(), "minor": "37", "name": "new-c"})}
        ports = {}
        for node, inst in servers.items():
            port, admin = harness.free_port(), harness.free_port()
            peers = [(n, "127.0.0.1", s.port) for n, s in servers.items() if n != node]
            yaml = render.render_bootstrap(node=node, listen_port=port, admin_port=admin,
                                           local=("127.0.0.1", inst.port), peers=peers,
                                           wasm_path=str(harness.wasm_path()), plugin=dict(FAST))
            envoys.start(yaml, node, admin).wait_snapshot(20)
            ports[node] = port
        bodies = {}
        for label, (path, accept) in DOCS.items():
            for node, port in ports.items():
                r = request(f"http://127.0.0.1:{port}{path}", headers={"Accept": accept})
                assert r.status == 200, (node, label, r)
                bodies.setdefault(label, {})[node] = (r.body, r.headers.get("etag"))
        for label, by_node in bodies.items():
            first = by_node["a"]
            for node, got in by_node.items():
                assert got == first, f"{label}: node {node} differs from node a (ETag {got[1]} vs {first[1]})"
            assert first[1], f"{label}: no ETag"
        # Not trivially equal: the merged /apis holds what only the old server (a) and only the new
        # servers (b, c) serve, and differs from each server's own document.
        merged = bodies["/apis (v2)"]["a"][0]
        assert b'"v1alpha3"' in merged and b'"resourceclaims"' in merged
        own = {n: request(f"{s.url}/apis", headers={"Accept": V2}).body for n, s in servers.items()}
        assert all(merged != o for o in own.values())
        # The first server by name (a) wins the conflict, whichever node merged.
        assert b'"dpl"' not in merged and b'"c-only"' not in merged
    finally:
        cluster.stop_all()
