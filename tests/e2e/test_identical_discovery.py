"""Every node builds the same merged discovery: three Envoys, one in front of each fake apiserver
(a old, b and c new), each with the other two as peers. Behind a load balancer a client may reach
any of them; the merged documents and their ETags must be byte-identical so clients' discovery
caches do not churn (upstream orders servers by identity for the same reason)."""

from __future__ import annotations

import gzip
import json

from kpp import render
from kpp.testing import harness
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.fake_apiserver.discovery import FIXTURES
from kpp.testing.topology import FAST, V2, request

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


def start_nodes(envoys, servers: dict, snapshot_timeout: float) -> dict[str, int]:
    """One Envoy in front of each server, the other servers as its peers; their listen ports."""
    ports = {}
    for node, inst in servers.items():
        port, admin = harness.free_port(), harness.free_port()
        peers = [(n, "127.0.0.1", s.port) for n, s in servers.items() if n != node]
        yaml = render.render_bootstrap(node=node, listen_port=port, admin_port=admin,
                                       local=("127.0.0.1", inst.port), peers=peers,
                                       wasm_path=str(harness.wasm_path()), plugin=dict(FAST))
        envoys.start(yaml, node, admin).wait_snapshot(snapshot_timeout)
        ports[node] = port
    return ports


def test_merged_discovery_is_byte_identical_on_every_node(envoys):
    cluster = Cluster()
    try:
        servers = {"a": cluster.start("a", apiset="old"), "b": cluster.start("b", apiset="new"),
                   "c": cluster.start("c", apiset={"apis": c_apis(), "minor": "37", "name": "new-c"})}
        ports = start_nodes(envoys, servers, 20)
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


def fnv128_etag(body: bytes) -> str:
    """The filter's ETag of a merged document (128-bit FNV-1a, quoted upper-case hex)."""
    h = 0x6c62272e07bb014262b821756295c58d
    for b in body:
        h = ((h ^ b) * 0x0000000001000000000000000000013B) % (1 << 128)
    return f'"{h:032X}"'


def with_crds(base: str, prefix: str, groups: int, versions: int = 2, resources: int = 10) -> dict:
    """A fixture API set plus `groups` synthetic CRD groups (every resource with a status
    subresource, as CRDs usually have)."""
    from kpp.testing.fake_apiserver.discovery import resource_entry
    name = {"old": "aggregated_v2.k8s-1.33.json", "new": "aggregated_v2.k8s-1.37-dev-fork.json"}[base]
    doc = json.loads((FIXTURES / name).read_text())
    for g in range(groups):
        group = f"{prefix}{g:03d}.example.com"
        vs = []
        for v in range(versions):
            version = f"v{v + 1}"
            rs = []
            for r in range(resources):
                e = resource_entry(group, version, f"widget{r:02d}s", f"Widget{r:02d}")
                e["subresources"] = [{"subresource": "status", "verbs": ["get", "patch", "update"],
                                      "responseKind": {"group": group, "version": version, "kind": f"Widget{r:02d}"}}]
                rs.append(e)
            vs.append({"version": version, "resources": rs, "freshness": "Current"})
        doc["items"].append({"metadata": {"name": group}, "versions": vs})
    return doc


def crd_servers(cluster, groups: int, name: str) -> dict:
    """Three fake apiservers: `a` old (1.33) with `groups` CRD groups of its own, `b` and `c` new
    (1.37) with the same `groups` other CRD groups."""
    return {"a": cluster.start("a", apiset={"apis": with_crds("old", "a", groups), "minor": "33", "name": f"{name}-a"}),
            "b": cluster.start("b", apiset={"apis": with_crds("new", "b", groups), "minor": "37", "name": f"{name}-b"}),
            "c": cluster.start("c", apiset={"apis": with_crds("new", "b", groups), "minor": "37", "name": f"{name}-c"})}


def test_a_merged_document_over_the_whole_limit_is_streamed_in_pieces_byte_identical(envoys):
    """Above snapshot::WHOLE_LIMIT (64 KiB) the service publishes the merged /apis in 256 KiB pieces
    and each worker copies them into the response one by one instead of keeping the document: the
    answer must still be the whole document, the same bytes on every node, matching its ETag."""
    cluster = Cluster()
    try:
        servers = crd_servers(cluster, 150, "big")
        ports = start_nodes(envoys, servers, 30)
        got = {}
        for node, port in ports.items():
            for _ in range(3):  # both workers, and the same answer again
                r = request(f"http://127.0.0.1:{port}/apis", headers={"Accept": V2}, timeout=30)
                assert r.status == 200, (node, r.status)
                got.setdefault(node, set()).add((r.body, r.headers.get("etag")))
        assert all(len(v) == 1 for v in got.values()), {n: len(v) for n, v in got.items()}
        (body, etag), = got["a"]
        assert got["b"] == got["c"] == got["a"]
        assert len(body) > 1 << 20, len(body)
        print(f"merged /apis: {len(body):,} bytes in {-(-len(body) // (256 << 10))} pieces")
        assert etag == fnv128_etag(body), "the streamed body is not the published document"
        groups = {g["metadata"].get("name", "") for g in json.loads(body)["items"]}
        assert {"a000.example.com", "a149.example.com", "b000.example.com", "b149.example.com",
                "resource.k8s.io"} <= groups
        # A client that has it gets a 304 without a body.
        r = request(f"http://127.0.0.1:{ports['b']}/apis", headers={"Accept": V2, "If-None-Match": etag})
        assert r.status == 304 and r.body == b"", r.status
    finally:
        cluster.stop_all()


def test_a_gzipped_local_answer_becomes_the_merged_document_uncompressed(envoys):
    """kube-apiserver gzips a body over 128 KiB for a client that accepts it (client-go does), so a
    cluster with a few hundred CRDs gets its own /apis gzipped. The filter replaces that body with
    the merged document: the local server must be asked without Accept-Encoding, and the answer must
    carry no Content-Encoding, else the client gunzips plain JSON. Control: the same request
    straight to the fake apiserver is gzipped (the fake does what the apiserver does)."""
    cluster = Cluster()
    try:
        servers = crd_servers(cluster, 20, "gz")
        ports = start_nodes(envoys, servers, 30)
        headers = {"Accept": V2, "Accept-Encoding": "gzip"}
        straight = request(f"{servers['a'].url}/apis", headers=headers)
        assert straight.status == 200 and straight.headers.get("content-encoding") == "gzip", straight.headers
        own = gzip.decompress(straight.body)
        assert len(own) > 128 * 1024, len(own)
        for node, port in ports.items():
            r = request(f"http://127.0.0.1:{port}/apis", headers=headers, timeout=30)
            assert r.status == 200, (node, r)
            assert "content-encoding" not in r.headers, (node, r.headers)
            assert r.headers.get("etag") == fnv128_etag(r.body), node
            groups = {g["metadata"].get("name", "") for g in json.loads(r.body)["items"]}
            assert {"a000.example.com", "b019.example.com", "resource.k8s.io"} <= groups, node
        # The merged legacy list (small: never gzipped) is plain JSON too.
        r = request(f"http://127.0.0.1:{ports['a']}/apis", headers={"Accept": "application/json",
                                                                     "Accept-Encoding": "gzip"})
        assert r.status == 200 and "content-encoding" not in r.headers, r.headers
        json.loads(r.body)
    finally:
        cluster.stop_all()
