"""Lease mode: every node names every server alike, itself included.

In lease mode a node names each peer by its identity lease's `kubernetes.io/hostname` label
(src/discovery/sync/membership.rs), so the other nodes name this server by its hostname. The local name
must be that hostname too: merged discovery takes servers in name order (the first wins a conflict, the
local server not privileged), and metrics and kube-peer-proxy-status label servers by name. kpp.render
names the local server by `--lease-local-hostname` in lease mode (`--node` then names only Envoy's
node), and the filter refuses a `local_name` that differs from `lease_discovery.local_hostname`
(tests/config.rs).

Fake apiservers a (old API set) and b (new, disagreeing with a about deployments' short names and
categories, as in test_identical_discovery) share a store holding their identity leases (hostnames
host-a, host-b). Envoy A in front of a and Envoy B in front of b, rendered with `--node node-a` /
`node-b`, names unlike the hostnames. Both name the servers {host-a, host-b} and serve byte-identical
merged discovery. The control names the local server `--node` (lease mode by address, where the filter
cannot know its hostname): A sees {node-a, host-b}, B sees {host-a, node-b}, and the merged documents
differ (a wins on B, b wins on A).
"""

from __future__ import annotations

import json

from kpp import render
from kpp.testing import harness
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.topology import FAST, V2, request
from test_identical_discovery import c_apis  # the new set, disagreeing with a about deployments
from test_lease_address_header import LEASES, lease

FRESH = "wasmcustom.kube_peer_proxy_server_fresh;server="


def cluster_with_leases():
    cluster = Cluster()
    insts = {"a": cluster.start("a", apiset="old"),
             "b": cluster.start("b", apiset={"apis": c_apis(), "minor": "37", "name": "new-b"})}
    for name, inst in insts.items():
        r = request(f"{insts['a'].url}{LEASES}", "POST", headers={"Content-Type": "application/json"},
                    body=json.dumps(lease(f"host-{name}", f"127.0.0.1:{inst.port}")).encode())
        assert r.status == 201, r
    return cluster, insts


def start(envoys, name, inst, leases):
    port, admin = harness.free_port(), harness.free_port()
    yaml = render.render_bootstrap(node=f"node-{name}", listen_port=port, admin_port=admin,
                                   local=("127.0.0.1", inst.port), peers=[], wasm_path=str(harness.wasm_path()),
                                   plugin=dict(FAST), leases=leases)
    return envoys.start(yaml, f"node-{name}", admin), port


def servers(envoy) -> set[str]:
    return {k.removeprefix(FRESH) for k in envoy.stats("kube_peer_proxy_server_fresh") if k.startswith(FRESH)}


def merged_apis(port) -> tuple[bytes, str]:
    r = request(f"http://127.0.0.1:{port}/apis", headers={"Accept": V2})
    assert r.status == 200, r
    return r.body, r.headers.get("etag")


def run(envoys, leases_of) -> dict[str, tuple]:
    """Both nodes started with leases_of(name, inst); once each has both members fresh: name → (its
    server names, merged /apis and ETag)."""
    cluster, insts = cluster_with_leases()
    try:
        nodes = {n: start(envoys, n, inst, leases_of(n, inst)) for n, inst in insts.items()}
        out = {}
        for n, (envoy, port) in nodes.items():
            # Two members fresh, whatever they are called: the peer is learned and fetched.
            harness.wait_until(lambda e=envoy: len(servers(e)) == 2 and all(
                v == 1 for v in e.stats("kube_peer_proxy_server_fresh").values()), 30,
                message=f"node-{n}: not two fresh members: {envoy.stats('kube_peer_proxy_server_fresh')}")
            out[n] = (servers(envoy), *merged_apis(port))
        return out
    finally:
        cluster.stop_all()


def test_lease_mode_nodes_name_every_server_alike(envoys):
    got = run(envoys, lambda n, _inst: {"local_hostname": f"host-{n}"})
    print({n: sorted(s) for n, (s, _, etag) in got.items()}, {n: etag for n, (_, _, etag) in got.items()})
    assert got["a"][0] == got["b"][0] == {"host-a", "host-b"}
    assert got["a"][1:] == got["b"][1:], "the nodes merged different /apis"
    assert b'"dpl"' not in got["a"][1], "host-a, first by name, wins the conflict on both nodes"


def test_control_the_local_name_from_node_makes_the_nodes_disagree(envoys):
    # Lease mode by address: the filter cannot know its hostname, so the local server keeps --node's name.
    got = run(envoys, lambda _n, inst: {"local_address": f"127.0.0.1:{inst.port}"})
    print({n: sorted(s) for n, (s, _, etag) in got.items()}, {n: etag for n, (_, _, etag) in got.items()})
    assert got["a"][0] == {"node-a", "host-b"} and got["b"][0] == {"host-a", "node-b"}
    assert got["a"][1] != got["b"][1], "the control changed: the merged /apis no longer depends on the names"
    # On A, host-b sorts before node-a and b wins; on B, host-a sorts before node-b and a wins.
    assert b'"dpl"' in got["a"][1] and b'"dpl"' not in got["b"][1]
