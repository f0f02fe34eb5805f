"""Lease mode: a client-sent address header (`x-kube-peer-proxy-peer-address`, what the `peers-by-address`
ORIGINAL_DST cluster reads) never picks an upstream.

Fake apiservers a (old API set), b (new) and c (new) on loopback; b's identity lease (in the fakes' shared
store, listed by the filter through a) advertises b's address; c has no lease, so it is never a member: a
request that reaches c was steered by the client. Real Envoy with the real .wasm in front of a, rendered by
kpp.render in lease mode. The attack: the client sends the address header naming c, alone and together
with the routing header naming the lease cluster, on a request a serves and on one only b serves.

* The shipped bootstrap (Envoy's `internal_only_headers` strip, and the filter's own strip) stops it.
* Each layer alone stops it: the filter without Envoy's strip, and Envoy's strip without the filter.
* The control, neither layer (no strip, no filter): the same request is served by c. So the header is
  what ORIGINAL_DST obeys, and the strips are what stop it.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import pytest

from kpp import render
from kpp.testing import harness
from kpp.testing.proc import served_by
from kpp.testing.fake_apiserver import Cluster
from kpp.testing.topology import COMMON, FAST, NEW_ONLY, request

LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases"


def lease(hostname: str, address: str) -> dict:
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    name = f"apiserver-{hostname}"
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-system",
                         "labels": {"apiserver.kubernetes.io/identity": "kube-apiserver",
                                    "kubernetes.io/hostname": hostname},
                         "annotations": {"kubernetes.io/peer-advertise-address": address}},
            "spec": {"holderIdentity": f"{name}_{uuid.uuid4()}", "leaseDurationSeconds": 3600, "renewTime": now}}


@pytest.fixture
def fakes():
    cluster = Cluster()
    insts = {"a": cluster.start("a", apiset="old"), "b": cluster.start("b", apiset="new"),
             "c": cluster.start("c", apiset="new")}
    for name in ("a", "b"):
        r = request(f"{insts['a'].url}{LEASES}", "POST", headers={"Content-Type": "application/json"},
                    body=json.dumps(lease(name, f"127.0.0.1:{insts[name].port}")).encode())
        assert r.status == 201, r
    yield insts
    cluster.stop_all()


def bootstrap(insts, *, envoy_strip: bool, with_filter: bool) -> tuple[str, int, int]:
    port, admin = harness.free_port(), harness.free_port()
    text = render.render_bootstrap(
        node="a", listen_port=port, admin_port=admin, local=("127.0.0.1", insts["a"].port), peers=[],
        wasm_path=str(harness.wasm_path()), plugin=dict(FAST), leases={"local_hostname": "a"},
        with_filter=with_filter)
    b = json.loads(text)
    route_config = b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"]
    assert route_config["internal_only_headers"] == [render.ROUTE_HEADER, render.ADDRESS_HEADER]
    assert any(c["name"] == render.LEASE_CLUSTER and c["type"] == "ORIGINAL_DST"
               for c in b["static_resources"]["clusters"])
    if not envoy_strip:
        del route_config["internal_only_headers"]
    return json.dumps(b), port, admin


def get(port: int, path: str, **headers):
    return request(f"http://127.0.0.1:{port}{path}", headers=headers)


def attacks(insts):
    """(name, path, headers): the address header naming c, with and without the routing header."""
    c = f"127.0.0.1:{insts['c'].port}"
    addr = {render.ADDRESS_HEADER: c}
    both = {render.ROUTE_HEADER: render.LEASE_CLUSTER, render.ADDRESS_HEADER: c}
    return [("address header, local resource", COMMON, addr),
            ("address header, resource only b serves", NEW_ONLY, addr),
            ("routing + address header, local resource", COMMON, both),
            ("routing + address header, resource only b serves", NEW_ONLY, both)]



def requests_seen(inst) -> list[dict]:
    return request(f"{inst.url}/__fake/requests").json()


def clear(insts):
    for inst in insts.values():
        request(f"{inst.url}/__fake/requests", "DELETE")


@pytest.mark.parametrize("envoy_strip,with_filter", [(True, True), (False, True), (True, False)],
                         ids=["shipped-bootstrap", "filter-strip-only", "envoy-strip-only"])
def test_client_sent_address_header_never_picks_the_upstream(envoys, fakes, envoy_strip, with_filter):
    yaml, port, admin = bootstrap(fakes, envoy_strip=envoy_strip, with_filter=with_filter)
    envoy = envoys.start(yaml, "a", admin)
    if with_filter:
        envoy.wait_snapshot(20)
        # Lease mode works: b is learned from its lease and a resource only b serves is routed there.
        harness.wait_until(lambda: served_by(get(port, NEW_ONLY)) == "b", 20,
                           message="b never learned from its lease")
    clear(fakes)
    for name, path, headers in attacks(fakes):
        r = get(port, path, **headers)
        if with_filter:
            want = "b" if path == NEW_ONLY else "a"
            assert (r.status, served_by(r)) == (200, want), (name, r)
        else:
            # Plain Envoy routes everything to a (a's own 404 for what only b serves).
            assert (r.status, served_by(r)) == ((200 if path == COMMON else 404), "a"), (name, r)
    assert requests_seen(fakes["c"]) == [], "c (no lease, never a member) was reached"
    # What reached the apiservers: a never sees either header; b sees only the filter's own values on the
    # requests it rerouted (Envoy forwards them upstream), never c's address.
    for name in ("a", "b"):
        for q in requests_seen(fakes[name]):
            h = {k.lower(): v for k, v in q["headers"].items()}
            if name == "a" or not with_filter:
                assert render.ROUTE_HEADER not in h and render.ADDRESS_HEADER not in h, (name, q)
            elif render.ADDRESS_HEADER in h:
                assert h[render.ADDRESS_HEADER] == f"127.0.0.1:{fakes['b'].port}", (name, q)
                assert h.get(render.ROUTE_HEADER) == render.LEASE_CLUSTER, (name, q)


def test_control_without_either_strip_the_address_header_picks_the_upstream(envoys, fakes):
    yaml, port, admin = bootstrap(fakes, envoy_strip=False, with_filter=False)
    envoys.start(yaml, "a", admin)
    clear(fakes)
    results = {name: get(port, path, **headers) for name, path, headers in attacks(fakes)}
    # Without the routing header the route is `local`: the address header alone does nothing there.
    for name in ("address header, local resource", "address header, resource only b serves"):
        assert served_by(results[name]) == "a", (name, results[name])
    # With it, the ORIGINAL_DST cluster sends the request wherever the client said: c.
    for name in ("routing + address header, local resource", "routing + address header, resource only b serves"):
        assert (results[name].status, served_by(results[name])) == (200, "c"), (name, results[name])
    assert len([q for q in requests_seen(fakes["c"]) if not q["path"].startswith("/__fake")]) == 2
