"""Membership separate from freshness, local first, and the 404 guard, Envoy in the loop (real Envoy, the real
.wasm, fake apiservers). `a` (old, 1.33 API set) is the local server; `b` and `c` are its peers.

The rules under test (src/request/routing.rs `decide_with`, src/request/guard.rs):
* every configured server is always a member; what it was last seen to serve counts however old, but it is
  routed to only while its data is fresh and it is reachable;
* requests go to the local server first, from Envoy's first second: no blanket 503 before the first snapshot;
* the local (or a peer's) "this type is not served here" 404 becomes a 503 `Status` with `Retry-After` whenever
  it might be false: a peer is known to serve the resource, or some member's API set was never learned. A 404
  for a missing object, and a 404 for a resource nobody serves once every member is known, pass unchanged;
* only unreachable or stale members serve it → 503, however long that lasts.

Each test checks a situation the old rules got wrong; where it is cheap, a control run through plain Envoy
(`with_filter=False`) shows the false 404 the filter prevents.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from kpp.testing import harness
from kpp.testing.proc import served_by
from kpp.testing.fake_apiserver import with_resource
from kpp.testing.topology import COMMON, NEW_ONLY, NOWHERE, Topology, V2, request

# A new-only resource in a group/version the old server serves: its 404 there is go-restful's JSON Status.
NEW_ONLY_IN_OLD_GV = "/apis/storage.k8s.io/v1/volumeattributesclasses"
NEW_ONLY_GV = "/apis/lifecycle.k8s.io/v1alpha1"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
NOWHERE_CORE = "/api/v1/namespaces/default/nosuchthings"
NOWHERE_IN_SERVED_GV = "/apis/apps/v1/namespaces/default/nosuchthings"
# Only b serves it (see b_with_gadgets).
GADGETS = "/apis/bonly.example.com/v1/namespaces/default/gadgets"

GUARDED = "kube_peer_proxy_peer_proxy_errors_total;type=guarded_not_found"
UNAVAILABLE = "kube_peer_proxy_peer_proxy_errors_total;type=peer_unavailable"
SYNC_ERRORS = "kube_peer_proxy_discovery_sync_errors_total"



def set_fault(inst, mode: str, **extra) -> None:
    r = request(f"{inst.url}/__fake/fault", "POST", body=json.dumps({"discovery": mode, **extra}).encode())
    assert r.status == 200, r


def direct(inst, path: str, accept: str | None = None):
    """What the fake apiserver itself answers (no Envoy)."""
    return request(f"{inst.url}{path}", headers={"Accept": accept} if accept else {})


def assert_filter_503(r, kind: str, retry_after: str = "1") -> None:
    """The filter's own 503: a Kubernetes `Status` with `Retry-After`, of kind "guarded" (a 404 that might be
    false) or "unavailable" (only unreachable or stale members serve it)."""
    assert r.status == 503, r
    assert r.headers.get("retry-after") == retry_after, r.headers
    assert r.headers.get("x-kube-peer-proxy-reply") == "true", r.headers
    status = r.json()
    assert (status["kind"], status["reason"], status["code"]) == ("Status", "ServiceUnavailable", 503), status
    marker = {"guarded": "another apiserver may serve it", "unavailable": "are unreachable"}[kind]
    assert marker in status["message"], status["message"]


def assert_passed_unchanged(r, inst, path: str) -> None:
    """The apiserver's own answer reached the client unchanged (status, body, content type)."""
    want = direct(inst, path)
    assert (r.status, served_by(r), r.body) == (want.status, inst.name, want.body), (r, want)
    assert r.headers.get("content-type") == want.headers.get("content-type")
    assert "x-kube-peer-proxy-reply" not in r.headers


def sync_error_count(topo: Topology, server: str, kind: str) -> int:
    return topo.counter(f"{SYNC_ERRORS};type={kind};server={server}")


def stop_and_wait_unreachable(topo: Topology, name: str) -> None:
    """Stops a running member; returns once a discovery round found it unreachable and the snapshot saying so is
    published (the generation is read before the stop: that snapshot may come within milliseconds)."""
    generation = topo.envoy.snapshot_generation()
    getattr(topo, name).stop()
    harness.wait_until(lambda: sync_error_count(topo, name, "unreachable") > 0, 10,
                       message=f"no round noticed that {name} is down")
    topo.envoy.wait_snapshot(10, at_least=generation + 1)


def plain_envoy(topo: Topology):
    """The control: the same bootstrap without the filter (plain Envoy in front of a). Returns a GET function."""
    yaml, port, admin = topo.bootstrap(with_filter=False)
    topo.envoys.start(yaml, "plain", admin)
    return lambda path: request(f"http://127.0.0.1:{port}{path}")


def b_with_gadgets(topo: Topology) -> None:
    """b also serves (and lists) bonly.example.com/v1 gadgets, which nobody else serves."""
    topo.b = topo.cluster.restart("b", apiset=with_resource("new", "bonly.example.com", "v1", "gadgets", "Gadget"))


def restart_stopped(topo: Topology, name: str, apiset: str = "new"):
    inst = topo.cluster.start(name, getattr(topo, name).port, apiset=apiset)
    setattr(topo, name, inst)
    return inst


# --- 1. peers down when Envoy starts ------------------------------------------------------------------------------

def test_peers_down_at_envoy_start_new_only_is_503_never_404_and_local_is_200_at_once(topo):
    topo.b.stop()
    topo.c.stop()
    topo.start(wait_snapshot=False)
    # The very first request, no waiting for a snapshot: the local server answers what it serves.
    r = topo.get(COMMON)
    assert (r.status, served_by(r)) == (200, "a"), r
    before = topo.counter(GUARDED)
    generations = set()
    sent = 0
    t_end = time.monotonic() + 3.0  # six discovery rounds (refresh 500 ms), before and after the first snapshot
    while time.monotonic() < t_end:
        generations.add(topo.envoy.snapshot_generation())
        for path in (NEW_ONLY, NEW_ONLY + "/claim-1", NEW_ONLY_IN_OLD_GV, NEW_ONLY_GV):
            # a's "not served here" 404 (text/plain, or go-restful's Status asked about via discovery) might
            # be false while b and c were never learned.
            assert_filter_503(topo.get(path), "guarded")
            sent += 1
        for path in (COMMON, CONFIGMAPS, "/apis/resource.k8s.io/v1alpha3/namespaces/default/resourceclaims"):
            r = topo.get(path)
            assert (r.status, served_by(r)) == (200, "a"), (path, r)
        time.sleep(0.1)
    assert max(generations) >= 1, "the test never saw a snapshot"
    assert topo.counter(GUARDED) - before == sent

    # Control: without the filter, a's answer is a false 404 (b and c serve these).
    plain = plain_envoy(topo)
    for path in (NEW_ONLY, NEW_ONLY_IN_OLD_GV):
        r = plain(path)
        assert (r.status, served_by(r)) == (404, "a"), r

    # b and c start: the new-only resource routes to them.
    restart_stopped(topo, "b")
    restart_stopped(topo, "c")
    harness.wait_until(lambda: topo.get(NEW_ONLY).status == 200, 10, message="never routed once b and c started")
    assert {served_by(topo.get(NEW_ONLY)) for _ in range(20)} == {"b", "c"}
    r = topo.get(NEW_ONLY_IN_OLD_GV)
    assert r.status == 200 and served_by(r) in {"b", "c"}, r


@pytest.mark.parametrize("how", ["peers_down_at_start", "peer_api_never_learned"])
def test_subresource_only_unlearned_peers_serve_is_503_never_404(topo, how):
    """pods/resize: only the new servers serve it; the parent (pods) is local. While the members that serve it
    were never learned (stopped at start, or their /api never answered), a's 404 for the subresource might be
    false, so it must be a 503 too."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"}, "spec": {}}
    assert request(f"{topo.a.url}/api/v1/namespaces/default/pods", "POST", {"Content-Type": "application/json"},
                   json.dumps(pod).encode()).status == 201
    if how == "peers_down_at_start":
        topo.b.stop()
        topo.c.stop()
    else:
        for inst in (topo.b, topo.c):
            set_fault(inst, "500", paths=["/api"])
    topo.start()
    resize = "/api/v1/namespaces/default/pods/p1/resize"
    assert direct(topo.a, resize).status == 404
    r = topo.get("/api/v1/namespaces/default/pods/p1/status")
    assert (r.status, served_by(r)) == (200, "a"), r
    assert_filter_503(topo.get(resize), "guarded")


# --- 2. a peer down for 3× the staleness limit ----------------------------------------------------------------------

def test_peer_down_past_3x_staleness_its_resources_stay_503_and_others_route_elsewhere(topo):
    staleness = 2.0
    b_with_gadgets(topo)
    topo.start(plugin={"staleness_limit": "2s", "refresh_interval": "500ms"})
    r = topo.get(GADGETS)
    assert (r.status, served_by(r)) == (200, "b"), r
    assert topo.counter("kube_peer_proxy_server_fresh;server=b") == 1
    t_stop = time.monotonic()
    stop_and_wait_unreachable(topo, "b")
    unavailable_before = topo.counter(UNAVAILABLE)
    sent = 0
    while time.monotonic() < t_stop + 3 * staleness + 0.5:
        # Only b served gadgets: b is a member still known to serve them, so never a 404.
        assert_filter_503(topo.get(GADGETS), "unavailable")
        sent += 1
        # What others serve goes to them: c for the new-only resources, a for its own.
        r = topo.get(NEW_ONLY)
        assert (r.status, served_by(r)) == (200, "c"), r
        r = topo.get(COMMON)
        assert (r.status, served_by(r)) == (200, "a"), r
        time.sleep(0.1)
    assert topo.counter(UNAVAILABLE) - unavailable_before == sent
    # b's data is past the staleness limit now (not only unreachable), and still no 404.
    assert topo.counter("kube_peer_proxy_server_fresh;server=b") == 0
    assert_filter_503(topo.get(GADGETS), "unavailable")
    # The merged discovery document keeps the down member's last-known resources.
    groups = {g["metadata"]["name"] for g in topo.get("/apis", accept=V2).json()["items"]}
    assert "bonly.example.com" in groups

    # Control: without the filter, a says gadgets do not exist.
    r = plain_envoy(topo)(GADGETS)
    assert (r.status, served_by(r)) == (404, "a"), r

    # b returns: routed again.
    topo.b = topo.cluster.start("b", topo.b.port,
                                apiset=with_resource("new", "bonly.example.com", "v1", "gadgets", "Gadget"))
    harness.wait_until(lambda: topo.get(GADGETS).status == 200, 10, message="b not routed again after it returned")


# --- 3. every discovery fetch gets 401 -------------------------------------------------------------------------------

@pytest.mark.parametrize("when", ["from_the_start", "after_a_good_start"])
def test_discovery_401_everywhere_local_requests_still_succeed(topo, when):
    staleness = 2.0
    servers = (topo.a, topo.b, topo.c)
    if when == "from_the_start":
        for inst in servers:
            set_fault(inst, "401")
        topo.start(plugin={"staleness_limit": "2s"})  # the first round ends with every fetch refused
    else:
        topo.start(plugin={"staleness_limit": "2s"})
        r = topo.get(NEW_ONLY)
        assert r.status == 200 and served_by(r) in {"b", "c"}, r
        for inst in servers:
            set_fault(inst, "401")
    assert direct(topo.a, "/apis", V2).status == 401
    t_fault = time.monotonic()
    new_only = []
    n = 0
    while time.monotonic() < t_fault + 3 * staleness + 0.5:
        n += 1
        for path in (COMMON, CONFIGMAPS, "/api/v1/namespaces/default/pods"):
            r = topo.get(path)
            assert (r.status, served_by(r)) == (200, "a"), (path, r)
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{n}"}, "data": {"n": str(n)}}
        r = topo.send("POST", CONFIGMAPS, cm)
        assert (r.status, served_by(r)) == (201, "a"), r
        r = topo.get(f"{CONFIGMAPS}/cm-{n}")
        assert (r.status, served_by(r), r.json()["data"]) == (200, "a", {"n": str(n)}), r
        if when == "after_a_good_start":
            # An object's 404 still passes although the guard's discovery question gets 401 too:
            # a was last seen to serve configmaps (Get-then-Create controllers must not stall).
            r = topo.get(f"{CONFIGMAPS}/missing-{n}")
            assert (r.status, served_by(r)) == (404, "a"), r
            assert r.json()["details"]["name"] == f"missing-{n}", r
        new_only.append(topo.get(NEW_ONLY))
        time.sleep(0.1)
    for server in "abc":
        assert sync_error_count(topo, server, "http_status") >= 2, server
    # A resource only the peers serve is never a 404: routed while their data is fresh, 503 after.
    assert not [r for r in new_only if r.status == 404], new_only
    assert all(r.status == 200 or r.status == 503 for r in new_only), new_only
    if when == "from_the_start":
        for r in new_only:
            assert_filter_503(r, "guarded")
    else:
        assert new_only[0].status == 200 and new_only[-1].status == 503, new_only
        assert_filter_503(new_only[-1], "unavailable")
    for inst in servers:
        set_fault(inst, "ok")
    harness.wait_until(lambda: topo.get(NEW_ONLY).status == 200, 10, message="never routed after the 401s ended")


# --- 4. a CRD on the local server while a peer is unreachable ---------------------------------------------------

WIDGET_TYPE = {"group": "example.com", "version": "v1", "resource": "widgets", "kind": "Widget", "namespaced": True}
WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"


@pytest.mark.parametrize("c_down", ["before_envoy_starts", "after_the_first_snapshot"])
def test_crd_created_on_the_local_server_while_a_peer_is_down_is_served_at_once(topo, c_down):
    if c_down == "before_envoy_starts":
        topo.c.stop()
        topo.start()
    else:
        topo.start()
        stop_and_wait_unreachable(topo, "c")
    # The CRD is established on a: served at once, in no discovery document yet.
    assert request(f"{topo.a.url}/__fake/serve", "POST", body=json.dumps(WIDGET_TYPE).encode()).status == 200
    assert direct(topo.a, "/apis/example.com/v1").status == 404
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w1"}, "spec": {"size": 3}}
    r = topo.send("POST", WIDGETS, widget)
    assert (r.status, served_by(r)) == (201, "a"), r
    r = topo.get(WIDGETS + "/w1")
    assert (r.status, served_by(r), r.json()["spec"]) == (200, "a", {"size": 3}), r
    r = topo.get(WIDGETS)
    assert (r.status, served_by(r)) == (200, "a") and [i["metadata"]["name"] for i in r.json()["items"]] == ["w1"]
    missing = topo.get(WIDGETS + "/nope")
    if c_down == "before_envoy_starts":
        # c was never learned and a's discovery does not list widgets yet: the 404 might be false.
        assert_filter_503(missing, "guarded")
    else:
        # Every member's API set is known and nobody lists widgets: a's answer stands, unchanged.
        assert_passed_unchanged(missing, topo.a, WIDGETS + "/nope")


# --- 5. a resource nobody serves ------------------------------------------------------------------------------------

@pytest.mark.parametrize("membership", ["all_known", "member_down_now", "member_never_learned"])
def test_resource_nobody_serves(topo, membership):
    if membership == "member_never_learned":
        topo.c.stop()
    topo.start(plugin={"staleness_limit": "2s"})
    if membership == "member_down_now":
        stop_and_wait_unreachable(topo, "c")
        # And past the staleness limit: c is down and stale, but its API set is known.
        harness.wait_until(lambda: topo.counter("kube_peer_proxy_server_fresh;server=c") == 0, 10,
                           message="c not stale within 10 s of its stop (staleness limit 2 s)")
    before = topo.counter(GUARDED)
    paths = (NOWHERE, NOWHERE_CORE, NOWHERE_IN_SERVED_GV, "/apis/nothing.example.com/v1")
    for path in paths:
        r = topo.get(path)
        if membership == "member_never_learned":
            assert_filter_503(r, "guarded")
        else:
            # The fake's genuine 404 (text/plain, or go-restful's Status), passed through unchanged.
            assert_passed_unchanged(r, topo.a, path)
    guarded = topo.counter(GUARDED) - before
    assert guarded == (len(paths) if membership == "member_never_learned" else 0)
    if membership == "member_never_learned":
        restart_stopped(topo, "c")
        harness.wait_until(lambda: topo.get(NOWHERE).status == 404, 10, message="still guarded after c was learned")
        for path in paths:
            assert_passed_unchanged(topo.get(path), topo.a, path)


# --- 6. a known member down -----------------------------------------------------------------------------------------

def listable(inst) -> dict[tuple[str, str, str], str]:
    """(group, version, resource) → collection path of every resource `inst` lists with the list verb."""
    out = {}
    for endpoint in ("/api", "/apis"):
        for g in direct(inst, endpoint, V2).json()["items"]:
            group = g["metadata"].get("name", "")
            for v in g["versions"]:
                for res in v.get("resources", []):
                    if "list" not in res["verbs"]:
                        continue
                    prefix = f"/apis/{group}/{v['version']}" if group else f"/api/{v['version']}"
                    ns = "/namespaces/default" if res["scope"] == "Namespaced" else ""
                    out[(group, v["version"], res["resource"])] = f"{prefix}{ns}/{res['resource']}"
    return out


def test_known_member_down_503_for_exactly_what_only_it_served_200_for_the_rest(topo):
    b_with_gadgets(topo)
    topo.c = topo.cluster.restart("c", apiset=with_resource("old", "conly.example.com", "v1", "gizmos", "Gizmo"))
    topo.start()
    by_server = {inst.name: listable(inst) for inst in (topo.a, topo.b, topo.c)}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1"}, "spec": {}}
    assert topo.send("POST", "/api/v1/namespaces/default/pods", pod).status == 201
    stop_and_wait_unreachable(topo, "b")
    everything = {k: p for served in by_server.values() for k, p in served.items()}
    only_b = {k for k in by_server["b"] if k not in by_server["a"] and k not in by_server["c"]}
    assert ("bonly.example.com", "v1", "gadgets") in only_b and ("resource.k8s.io", "v1", "resourceclaims") in only_b
    assert ("conly.example.com", "v1", "gizmos") not in only_b
    wrong = []
    for key, path in sorted(everything.items()):
        r = topo.get(path)
        if key in only_b:
            ok = r.status == 503 and r.headers.get("x-kube-peer-proxy-reply") == "true" \
                and b"are unreachable" in r.body
        else:
            ok = r.status == 200 and served_by(r) == ("a" if key in by_server["a"] else "c")
        if not ok:
            wrong.append((key, r))
    assert not wrong, wrong[:10]
    assert len(only_b) > 10 and len(everything) - len(only_b) > 50
    # Subresources too: only b served pods/resize, a serves pods/status.
    assert_filter_503(topo.get("/api/v1/namespaces/default/pods/p1/resize"), "unavailable")
    r = topo.get("/api/v1/namespaces/default/pods/p1/status")
    assert (r.status, served_by(r)) == (200, "a"), r


# --- 7. /api failing on one peer while its /apis still routes ------------------------------------------------------

def test_peer_api_failing_guards_only_the_core_group(topo):
    topo.c = topo.cluster.restart("c", apiset="old")  # b alone serves the new resources
    set_fault(topo.b, "500", paths=["/api"])
    topo.start()
    assert sync_error_count(topo, "b", "http_status") >= 1
    # b's /apis is known: a non-core resource only b serves routes to it.
    for path in (NEW_ONLY, NEW_ONLY_IN_OLD_GV):
        r = topo.get(path)
        assert (r.status, served_by(r)) == (200, "b"), (path, r)
    # b's /api is not: a core-group resource nobody is known to serve might be b's.
    before = topo.counter(GUARDED)
    assert_filter_503(topo.get(NOWHERE_CORE), "guarded")
    assert topo.counter(GUARDED) - before == 1
    # Non-core resources nobody serves: every member's /apis is known, so a's genuine 404.
    for path in (NOWHERE, NOWHERE_IN_SERVED_GV):
        assert_passed_unchanged(topo.get(path), topo.a, path)
    assert topo.counter(GUARDED) - before == 1
    # Once b's /api answers, the core group is known too and the 404 is genuine.
    set_fault(topo.b, "ok")
    harness.wait_until(lambda: topo.get(NOWHERE_CORE).status == 404, 10, message="b's /api never learned")
    assert_passed_unchanged(topo.get(NOWHERE_CORE), topo.a, NOWHERE_CORE)


# --- 8. the 404 guard itself ---------------------------------------------------------------------------------------

def questions(inst) -> list[str]:
    """The group/version discovery requests the filter's guard sent to `inst` (the sync only fetches /api and
    /apis from aggregated servers; rerouted requests carry the proxied header too, but are resource paths)."""
    return [q["path"] for q in request(f"{inst.url}/__fake/requests").json()
            if q["headers"].get("x-kubernetes-peer-proxied") == "true"
            and re.fullmatch(r"/api/[^/]+|/apis/[^/]+/[^/]+", q["path"])]


def test_404_guard_object_missing_passes_unchanged_type_missing_is_503_while_a_member_is_unknown(topo):
    topo.c.stop()  # never learned
    topo.start()
    before = topo.counter(GUARDED)
    # A missing object of a resource a serves (so do the peers): a's Status 404 with details.name, unchanged,
    # after the filter asked a's discovery whether it lists deployments.
    path = COMMON + "/missing"
    r = topo.get(path)
    assert r.json()["details"]["name"] == "missing"
    assert_passed_unchanged(r, topo.a, path)
    assert questions(topo.a) == ["/apis/apps/v1"]
    # The same through a reroute: b's 404 for a missing claim, asked of b's discovery.
    path = NEW_ONLY + "/missing"
    r = topo.get(path)
    assert r.json()["details"]["name"] == "missing"
    assert_passed_unchanged(r, topo.b, path)
    assert questions(topo.b) == ["/apis/resource.k8s.io/v1"]
    assert topo.counter(GUARDED) == before
    # An unknown resource of a group/version a serves: go-restful's Status 404 (no details.name) looks like the
    # one above from the headers; a's discovery does not list it, and c (unknown) might serve it.
    assert direct(topo.a, NOWHERE_IN_SERVED_GV).json()["details"] == {}
    assert_filter_503(topo.get(NOWHERE_IN_SERVED_GV), "guarded")
    assert questions(topo.a) == ["/apis/apps/v1", "/apis/apps/v1"]
    assert topo.counter(GUARDED) == before + 1


def test_404_guard_on_a_rerouted_request(topo):
    """b stops serving what the table says it serves (restarted as old; the next round is 10 s away): its "not
    served here" 404 is guarded just like the local server's."""
    topo.c = topo.cluster.restart("c", apiset="old")
    topo.start(plugin={"refresh_interval": "10s", "staleness_limit": "30s"})
    for path in (NEW_ONLY, NEW_ONLY_IN_OLD_GV):
        r = topo.get(path)
        assert (r.status, served_by(r)) == (200, "b"), r
    topo.b = topo.cluster.restart("b", apiset="old")
    before = topo.counter(GUARDED)
    t0 = time.monotonic()
    # text/plain 404 (b no longer serves resource.k8s.io/v1 at all), and go-restful's Status 404 (b serves
    # storage.k8s.io/v1 but not volumeattributesclasses: asked of b's discovery).
    assert_filter_503(topo.get(NEW_ONLY), "guarded")
    assert_filter_503(topo.get(NEW_ONLY_IN_OLD_GV), "guarded")
    assert time.monotonic() - t0 < 5, "the table changed under the test"
    assert questions(topo.b) == ["/apis/storage.k8s.io/v1"]
    assert topo.counter(GUARDED) - before == 2


# --- 9. the verified 404: a member back as another version between rounds ------------------------------------------

def test_verified_404_a_member_back_as_another_version_before_the_next_round_makes_it_503(topo):
    """Every member known, nobody known to serve the resource: the local 404 stands only if no other member
    serves it now (each is asked while the 404 waits). c comes back as a new version between two discovery
    rounds and serves it: a's 404 becomes a 503 until the next round routes it to c."""
    topo.b = topo.cluster.restart("b", apiset="old")
    topo.c = topo.cluster.restart("c", apiset="old")
    topo.start(plugin={"refresh_interval": "5s", "staleness_limit": "30s"})
    t_start = time.monotonic()
    # Nobody serves it: a's genuine 404, after b and c said so.
    assert_passed_unchanged(topo.get(NEW_ONLY), topo.a, NEW_ONLY)
    assert "/apis/resource.k8s.io/v1" in questions(topo.c)
    topo.c = topo.cluster.restart("c", apiset="new")
    before = topo.counter(GUARDED)
    assert_filter_503(topo.get(NEW_ONLY), "guarded")
    assert_filter_503(topo.get(NEW_ONLY_IN_OLD_GV), "guarded")  # a's Status 404: a and c were asked
    assert questions(topo.c) == ["/apis/resource.k8s.io/v1", "/apis/storage.k8s.io/v1"]
    assert_passed_unchanged(topo.get(NOWHERE), topo.a, NOWHERE)  # still nobody's
    assert topo.counter(GUARDED) - before == 2
    assert time.monotonic() - t_start < 4, "a discovery round ran during the test"
    harness.wait_until(lambda: served_by(topo.get(NEW_ONLY)) == "c", 10, message="c's new API set never routed")
