"""The 404 marker (plugin field `not_found_marker`, envoy/README.md): Envoy adds
`x-kube-peer-proxy-not-found` to 404 answers only, and the filter's 404 guard tests for it instead of
reading `:status`. The guard's work is visible at the apiserver: for a 404 of a named object it asks
the answering server's discovery for the group/version (`GET /api/v1` here) before the 404 may stand.

The attacks: an upstream that sends the marker on answers that are not 404s must not set the guard
off, and the client never sees the marker. Each has a control: the same bootstrap without the one
part that refuses the attack shows it succeed."""

from __future__ import annotations

import json
import time

from kpp import render
from kpp.testing.topology import Topology

MARKER = render.NOT_FOUND_MARKER
NS = "/api/v1/namespaces/default/configmaps"
QUESTION = "/api/v1"  # the guard's discovery question for a core resource


def start(topo: Topology, drop: str | None = None) -> Topology:
    """The rendered bootstrap, or with one part of the marker's plumbing dropped (a control):
    "route" (the upstream copy is not removed) or "unmark" (the client's copy is not removed)."""
    yaml, topo.port, admin = topo.bootstrap()
    b = json.loads(yaml)
    hcm = b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["route_config"]["response_headers_to_remove"] == [MARKER]
    names = [f["name"] for f in hcm["http_filters"]]
    assert names.index("kube-peer-proxy-unmark-404") < names.index("envoy.filters.http.wasm") \
        < names.index("kube-peer-proxy-mark-404") < names.index("envoy.filters.http.router")
    if drop == "route":
        del hcm["route_config"]["response_headers_to_remove"]
    elif drop == "unmark":
        hcm["http_filters"] = [f for f in hcm["http_filters"] if f["name"] != "kube-peer-proxy-unmark-404"]
    topo.envoy = topo.envoys.start(json.dumps(b), "a", admin, concurrency=2)
    topo.envoy.wait_snapshot(20)
    return topo


def questions(topo: Topology) -> int:
    return sum(1 for r in topo.a.requests() if r["method"] == "GET" and r["path"] == QUESTION)


def guarded_get(topo: Topology, path: str):
    """The answer to `path`, and how many guard questions reached `a` for it (the guard answers
    before the response is released, so they are in the log when the answer arrives)."""
    before = questions(topo)
    r = topo.get(path)
    return r, questions(topo) - before


def create(topo: Topology, name: str):
    r = topo.send("POST", NS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
    assert r.status == 201, r.body


def test_rendered_bootstrap_sets_the_marker_for_the_filter():
    b = json.loads(render.render_bootstrap(node="a", listen_port=1, admin_port=2, local=("127.0.0.1", 3),
                                           peers=[], wasm_path="x.wasm"))
    wasm = next(f for f in b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
                ["typed_config"]["http_filters"] if f["name"] == "envoy.filters.http.wasm")
    assert json.loads(wasm["typed_config"]["config"]["configuration"]["value"])["not_found_marker"] == MARKER
    plain = render.render_bootstrap(node="a", listen_port=1, admin_port=2, local=("127.0.0.1", 3), peers=[],
                                    wasm_path="x.wasm", with_filter=False)
    assert MARKER not in plain  # plain Envoy (the control of other tests) is untouched


def test_a_real_404_is_marked_guarded_and_the_client_never_sees_the_marker(topo):
    start(topo)
    r, asked = guarded_get(topo, f"{NS}/missing")
    assert r.status == 404 and json.loads(r.body)["reason"] == "NotFound", r.body
    assert asked == 1, "the guard did not ask about a 404 of a named object"
    assert MARKER not in r.headers
    create(topo, "present")
    r, asked = guarded_get(topo, f"{NS}/present")
    assert r.status == 200 and asked == 0 and MARKER not in r.headers


def test_control_without_the_unmark_filter_the_client_sees_the_marker(topo):
    start(topo, drop="unmark")
    r, asked = guarded_get(topo, f"{NS}/missing")
    assert r.status == 404 and asked == 1
    assert r.headers.get(MARKER) == "1"


def test_an_upstream_marker_on_a_200_and_a_201_does_not_set_the_guard_off(topo):
    start(topo)
    create(topo, "spoofed")
    topo.a.extra_response_headers[MARKER] = "1"
    for _ in range(20):  # both workers, any connection
        r, asked = guarded_get(topo, f"{NS}/spoofed")
        assert r.status == 200, r.body
        assert asked == 0, "a marker sent by the upstream on a 200 made the guard act"
        assert MARKER not in r.headers
    before = questions(topo)
    r = topo.send("POST", NS, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "spoofed-2"}})
    assert r.status == 201 and questions(topo) == before and MARKER not in r.headers
    # a real 404 is still guarded with the upstream sending the marker on everything
    r, asked = guarded_get(topo, f"{NS}/missing")
    assert r.status == 404 and asked == 1 and MARKER not in r.headers


def test_control_without_the_route_strip_an_upstream_marker_sets_the_guard_off(topo):
    start(topo, drop="route")
    create(topo, "spoofed")
    topo.a.extra_response_headers[MARKER] = "1"
    deadline = time.monotonic() + 10
    asked = 0
    while not asked and time.monotonic() < deadline:
        r, asked = guarded_get(topo, f"{NS}/spoofed")
        assert r.status == 200, r.body  # the guard asked, the object is listed: the "404" stands, i.e. the 200
    assert asked == 1, "without the route's strip the upstream's marker should reach the filter"
