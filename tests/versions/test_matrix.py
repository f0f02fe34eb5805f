"""Every upgrade step of kpp.testing.versions.STEPS on real binaries: the old and the new
kube-apiserver on one etcd, each behind Envoy with the filter, peers learned from the
`default/kubernetes` EndpointSlice (no address is configured anywhere). The same checks in both
directions (a request landing on the old server and on the new one). What differs between the two
servers is computed from their own legacy discovery (every version serves it, whatever its aggregated
format), never written by hand.

Evidence that a request was served by the other server: a unique `Audit-ID` sent by the client is in
that server's audit log and not in the local one's, and Envoy's access log shows the peer cluster and
`x-kubernetes-peer-proxied: true` on the forwarded request.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from kpp.testing import harness, versions
from kpp.testing.versions import NEW_IP, OLD_IP, PORT

pytestmark = pytest.mark.timeout(600)  # the first test of a step also starts its control plane

V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
V2BETA1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
# What kubectl v1.36 sends for /api and /apis.
KUBECTL_ACCEPT = f"{V2},{V2BETA1},application/json"
OTHER = {"old": "new", "new": "old"}
ACCESS_LOG_WAIT = 30.0


@pytest.fixture(scope="module")
def diff(request, env, step):
    candidates = versions.candidate_group_versions(env)
    own = {name: versions.served(env, name, candidates) for name in ("old", "new")}
    only = {"old": {k: own["old"][k] for k in own["old"].keys() - own["new"].keys()},
            "new": {k: own["new"][k] for k in own["new"].keys() - own["old"].keys()}}
    print(f"\n{step.id}: only {step.old.version}: {sorted(only['old'])}\n"
          f"{step.id}: only {step.new.version}: {sorted(only['new'])}")
    # For the run's table in docs/versions.md (tests/versions/conftest.py).
    request.config.__dict__.setdefault("_kpp_diffs", {})[step.id] = {
        side: sorted("/".join(x for x in gvr if x) for gvr in only[side]) for side in ("old", "new")}
    return {"own": own, "only": only}


def listable(resources: dict) -> list:
    return [r for _, r in sorted(resources.items()) if "list" in r.verbs]


def audit_event(server, aid: str, timeout: float = 10.0):
    return harness.wait_until(lambda: next((e for e in server.audit_events() if e["auditID"] == aid), None),
                              timeout, message=f"audit id {aid} not in {server.name}'s audit log")


def access_entry(front, aid: str):
    front.envoy.flush_logs()
    return harness.wait_until(lambda: next((e for e in front.access_entries() if e["audit_id"] == aid), None),
                              ACCESS_LOG_WAIT, 0.2, message=f"audit id {aid} not in the access log")


def test_versions_are_what_the_step_says(env, step):
    assert versions.version_of(env, "old") == step.old.version
    assert versions.version_of(env, "new") == step.new.version


def test_each_server_serves_the_discovery_formats_the_table_says(env, step):
    """The difference each step is about, observed: which aggregated discovery versions each server
    answers (straight to it, one media type per request); the filter has to read all of them."""
    for name, side in (("old", step.old), ("new", step.new)):
        for version, want in versions.aggregated_formats(side).items():
            media = f"application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList"
            r = env.direct(name, "/apis", headers={"Accept": media})
            got = r.status == 200 and f"v={version}" in r.headers.get("content-type", "")
            assert got == want, (name, side.version, version, r.status, r.headers.get("content-type"))
            if not want:
                assert r.status == 406, (name, version, r)


def test_membership_comes_from_the_endpointslice(env, step):
    """Both addresses are in the slice the apiservers write; each Envoy learned the other from it."""
    assert env.slice_addresses() == {OLD_IP, NEW_IP}
    for via in ("old", "new"):
        # Members are named by IP, this node too: both Envoys name the same two servers.
        env.fronts[via].envoy.wait_fresh([OLD_IP, NEW_IP], timeout=30)


def test_each_server_serves_something_the_other_does_not(diff, step):
    # An empty side proves nothing for that direction: the step's runtime-config must give it one.
    assert diff["only"]["new"], f"{step.new.version} serves nothing {step.old.version} does not"
    assert diff["only"]["old"], f"{step.old.version} serves nothing {step.new.version} does not"


@pytest.mark.parametrize("via", ["old", "new"])
def test_what_only_the_other_serves_is_answered_by_it(env, step, diff, via):
    """Routed to the server that serves it, and answered as that server answers it directly; with the
    built-in proxy on as well, still served once, by that server, never proxied a second time."""
    to = OTHER[via]
    todo = listable(diff["only"][to])
    assert todo, f"no listable resource only {to} serves"
    for res in todo:
        path = res.collection()
        if step.mvp:
            # The control that the built-in proxy is really on: straight to `via`, it forwards the request.
            aid = f"kpp-builtin-{uuid.uuid4()}"
            r = env.direct(via, path, headers={"Audit-ID": aid})
            assert r.status == 200, (f"{via}'s built-in proxy did not forward {res.gvr}", r)
            assert audit_event(env.server(to), aid)["responseStatus"]["code"] == 200
        else:
            assert env.direct(via, path).status == 404, f"{via} itself should not serve {res.gvr}"
        direct = env.direct(to, path)
        aid = f"kpp-matrix-{uuid.uuid4()}"
        r = env.via(via, path, headers={"Audit-ID": aid})
        assert (r.status, r.json().get("kind")) == (direct.status, direct.json().get("kind")), (res.gvr, r, direct)
        assert sorted(i["metadata"]["name"] for i in r.json().get("items") or []) == \
            sorted(i["metadata"]["name"] for i in direct.json().get("items") or []), res.gvr
        ev = audit_event(env.server(to), aid)
        assert ev["user"]["username"] == "kpp-admin" and ev["responseStatus"]["code"] == 200, ev
        # served once, by `to` only: no second hop (through `via`'s built-in proxy or back)
        assert sum(e["auditID"] == aid for e in env.server(to).audit_events()) == 1, res.gvr
        assert not any(e["auditID"] == aid for e in env.server(via).audit_events()), res.gvr
        acc = access_entry(env.fronts[via], aid)
        assert acc["peer_proxied"] == "true" and acc["upstream_host"] == f"{env.server(to).address}:{PORT}", acc


def _merged(env, via: str, root: str, accept: str):
    r = env.via(via, root, headers={"Accept": accept})
    assert r.status == 200, (via, root, r)
    return r


def _gvrs(doc: dict) -> set:
    return {(g["metadata"].get("name", ""), v["version"], r["resource"])
            for g in doc.get("items", []) for v in g.get("versions", []) for r in v.get("resources") or []
            if v.get("freshness") != "Stale"}


def test_merged_discovery_is_identical_on_both_nodes_and_lists_the_union(env, diff):
    union = {k for side in ("old", "new") for k in diff["own"][side]}
    for root in ("/api", "/apis"):
        answers = {via: _merged(env, via, root, KUBECTL_ACCEPT) for via in ("old", "new")}
        # The same document from either node (the nodes agree on member names and order).
        assert answers["old"].body == answers["new"].body, root
        assert answers["old"].headers.get("etag") == answers["new"].headers.get("etag"), root
    listed = set()
    for root in ("/api", "/apis"):
        listed |= _gvrs(_merged(env, "old", root, KUBECTL_ACCEPT).json())
    assert listed == union, (sorted(union - listed)[:10], sorted(listed - union)[:10])


def test_legacy_group_list_through_each_node_lists_every_group(env, diff):
    groups = {g for side in ("old", "new") for (g, _, _) in diff["own"][side] if g}
    for via in ("old", "new"):
        r = env.via(via, "/apis", headers={"Accept": "application/json"})
        assert r.status == 200 and r.json()["kind"] == "APIGroupList", r
        assert {g["name"] for g in r.json()["groups"]} >= groups, via


@pytest.mark.parametrize("via", ["old", "new"])
def test_per_group_version_discovery_of_what_only_the_other_serves(env, diff, via):
    """`/apis/<g>/<v>` of every group version holding a resource only the other server serves: a group version
    `via` does not serve at all is forwarded (the other's document); one it serves too is answered by `via`
    itself, as kube-apiserver would (per-group-version discovery is never merged)."""
    to = OTHER[via]
    gvs = sorted({(r.group, r.version) for r in diff["only"][to].values()})
    assert gvs, f"nothing only {to} serves"
    for g, v in gvs:
        local = any((o.group, o.version) == (g, v) for o in diff["own"][via].values())
        path = f"/apis/{g}/{v}" if g else f"/api/{v}"
        direct = env.direct(via if local else to, path, headers={"Accept": "application/json"})
        r = env.via(via, path, headers={"Accept": "application/json"})
        assert r.status == 200 and direct.status == 200, (path, r)
        names = lambda d: sorted(x["name"] for x in d.json()["resources"])
        assert names(r) == names(direct), (path, "local" if local else "forwarded")


@pytest.mark.parametrize("via", ["old", "new"])
def test_the_404_guard_lets_only_genuine_404s_through(env, diff, via):
    # An object that does not exist, of a type both serve: the apiserver's NotFound.
    r = env.via(via, "/api/v1/namespaces/default/configmaps/kpp-does-not-exist")
    assert r.status == 404 and r.json()["reason"] == "NotFound", r
    # An object that does not exist, of a type only the other serves: the other's NotFound, not a 503.
    res = listable(diff["only"][OTHER[via]])[0]
    r = env.via(via, res.collection() + "/kpp-does-not-exist")
    direct = env.direct(OTHER[via], res.collection() + "/kpp-does-not-exist")
    assert r.status == direct.status == 404, (res.gvr, r, direct)
    assert "x-kube-peer-proxy-reply" not in r.headers, r
    # Types nobody serves, a whole group and a resource of a served group/version: the genuine 404.
    for path in ("/apis/nobody.kpp.example/v1/things", "/apis/apps/v1/namespaces/default/kppnothings"):
        r = env.via(via, path)
        assert r.status == 404 and "x-kube-peer-proxy-reply" not in r.headers, (path, r)


@pytest.mark.parametrize("via", ["old", "new"])
def test_kubectl_sees_and_gets_what_only_the_other_serves(env, diff, via):
    kc = env.kubeconfig(via)
    names = env.kubectl(kc, "api-resources", "-o", "name").stdout.split()
    for res in listable(diff["only"][OTHER[via]]):
        qualified = f"{res.name}.{res.version}.{res.group}" if res.group else f"{res.name}.{res.version}"
        assert any(n == res.name or n.startswith(res.name + ".") for n in names), (res.gvr, names)
        out = env.kubectl(kc, "get", qualified, *(["-A"] if res.namespaced else []), "-o", "json")
        assert json.loads(out.stdout)["kind"] == "List", out


def test_a_mixed_version_load_has_no_false_404_and_loses_no_write(env, diff):
    """Writes through one node read back through the other, lists and gets of the types only the other
    server serves, and a watch of one of them, through both nodes at once for a few seconds."""
    only = {via: listable(diff["only"][OTHER[via]]) for via in ("old", "new")}
    errors, written, seen, counts = [], [], {}, {"requests": 0}
    lock = threading.Lock()
    stop_at = time.monotonic() + 8.0

    def record(what, r, ok=(200, 201)):
        with lock:
            counts["requests"] += 1
            if r.status not in ok:
                errors.append((what, r.status, r.body[:200]))

    def writer(via):
        i = 0
        while time.monotonic() < stop_at:
            name = f"kpp-load-{via}-{i}"
            i += 1
            r = env.via(via, "/api/v1/namespaces/default/configmaps", method="POST",
                        body={"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                              "data": {"from": via}})
            record(("create", name), r)
            if r.status == 201:
                with lock:
                    written.append(name)
                record(("get", name), env.via(OTHER[via], f"/api/v1/namespaces/default/configmaps/{name}"))

    def reader(via):
        while time.monotonic() < stop_at:
            for res in only[via]:
                record(("list", via, res.gvr), env.via(via, res.collection()))

    def watcher(via):
        res = only[via][0]
        r = env.via(via, res.collection() + "?watch=1&timeoutSeconds=3", timeout=30)
        record(("watch", via, res.gvr), r)
        seen[via] = r.status

    threads = [threading.Thread(target=f, args=(v,)) for v in ("old", "new") for f in (writer, reader, watcher)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a load thread did not finish"
    assert not errors, errors[:10]
    assert written, "no write succeeded"
    # Every acknowledged write is there, read through each node, then deleted through the other.
    for via in ("old", "new"):
        r = env.via(via, "/api/v1/namespaces/default/configmaps?labelSelector=")
        have = {i["metadata"]["name"] for i in r.json()["items"]}
        assert set(written) <= have, sorted(set(written) - have)[:10]
    for name in written:
        origin = "old" if "-old-" in name else "new"
        r = env.via(OTHER[origin], f"/api/v1/namespaces/default/configmaps/{name}", method="DELETE")
        assert r.status == 200, (name, r)
    print(f"load: {counts['requests']} requests, {len(written)} writes read back, 0 errors; watches {seen}")


# ---- Membership without a configured address: a node joins, leaves and is replaced ----------------

# Off by default in every version of the matrix, on in the joining servers only: what only they serve.
JOINER_RUNTIME_CONFIG = "internal.apiserver.k8s.io/v1alpha1=true"
JOINER_PATH = "/apis/internal.apiserver.k8s.io/v1alpha1/storageversions"


def _wait_code(env, via: str, path: str, want: int, timeout: float, allowed=(404, 503)) -> tuple[float, list]:
    t0, seen = time.monotonic(), []

    def ok():
        r = env.via(via, path)
        seen.append(r.status)
        assert r.status in (want, *allowed), (via, r, seen[-10:])
        return r.status == want
    harness.wait_until(ok, timeout, 0.25, message=f"{via}: {path} did not answer {want} in {timeout}s: {seen[-20:]}")
    return time.monotonic() - t0, seen


def _wait_slice(env, want: set, timeout: float = 60.0) -> float:
    t0 = time.monotonic()
    harness.wait_until(lambda: env.slice_addresses() == want, timeout, 0.2,
                       message=f"the kubernetes EndpointSlice never listed exactly {sorted(want)}")
    return time.monotonic() - t0


def _served_by(env, via: str, ip: str, joiner, n: int = 5):
    """n requests for what only the joiners serve, through `via`: each answered by the server at ip."""
    for _ in range(n):
        aid = f"kpp-join-{uuid.uuid4()}"
        r = env.via(via, JOINER_PATH, headers={"Audit-ID": aid})
        assert r.status == 200, (via, r)
        audit_event(joiner, aid)
        assert access_entry(env.fronts[via], aid)["upstream_host"] == f"{ip}:{PORT}"


@pytest.mark.membership_steps_only
def test_a_node_joins_is_replaced_and_leaves_without_editing_any_file(env, step):
    """cp-3 (the new version, at a new address) joins: both Envoys learn it from the slice and route what
    only it serves to it. cp-4 (another address) joins and cp-3 stops gracefully, as a node replacement
    does: both Envoys drop cp-3 and route to cp-4 only. cp-4 stops: both drop it and the 404 is genuine
    again. No bootstrap or file is touched."""
    from kpp.testing import netns
    base = {versions.OLD_IP, versions.NEW_IP}
    ip3, ip4 = netns.NODE_ADDRESSES[2], netns.NODE_ADDRESSES[3]
    for via in ("old", "new"):
        r = env.via(via, JOINER_PATH)
        assert r.status == 404 and "x-kube-peer-proxy-reply" not in r.headers, (via, r)
    timings = {}

    def join(name, ip):
        s = env.cp.add_server(name, step.new.version, JOINER_RUNTIME_CONFIG,
                              **versions.server_options(step.new, ip, step.mvp))
        return s

    def leave(name):
        env.cp.servers[name].stop()
        del env.cp.servers[name]

    try:
        cp3 = join("cp-3", ip3)
        timings["cp-3 in the slice after ready"] = round(_wait_slice(env, base | {ip3}), 1)
        for via in ("old", "new"):
            timings[f"cp-3 learned by {via}"] = round(_wait_code(env, via, JOINER_PATH, 200, 30)[0], 1)
            _served_by(env, via, ip3, cp3)
        cp4 = join("cp-4", ip4)
        _wait_slice(env, base | {ip3, ip4})
        for via in ("old", "new"):
            env.fronts[via].envoy.wait_fresh([ip4], timeout=30)
        leave("cp-3")  # graceful: the apiserver removes its own address from the slice (RemoveEndpoints)
        timings["cp-3 out of the slice after stop"] = round(_wait_slice(env, base | {ip4}), 1)
        for via in ("old", "new"):
            # Dropped within a round: from now on every request goes to cp-4, none to cp-3's address.
            t0 = time.monotonic()
            harness.wait_until(lambda: f"wasmcustom.kube_peer_proxy_server_fresh;server={ip3}" not in
                               env.fronts[via].envoy.stats("kube_peer_proxy_server_fresh")
                               or env.fronts[via].envoy.stats("kube_peer_proxy_server_fresh")
                               .get(f"wasmcustom.kube_peer_proxy_server_fresh;server={ip3}") == 0, 30,
                               message=f"{via} still counts cp-3 fresh")
            timings[f"cp-3 dropped by {via}"] = round(time.monotonic() - t0, 1)
            _served_by(env, via, ip4, cp4, n=10)
        leave("cp-4")
        timings["cp-4 out of the slice after stop"] = round(_wait_slice(env, base), 1)
        for via in ("old", "new"):
            timings[f"cp-4 dropped by {via}"] = round(_wait_code(env, via, JOINER_PATH, 404, 30, allowed=(503,))[0], 1)
            r = env.via(via, JOINER_PATH)
            assert r.status == 404 and "x-kube-peer-proxy-reply" not in r.headers, r
    finally:
        for name in ("cp-3", "cp-4"):
            if name in env.cp.servers:
                leave(name)
    print(f"\n{step.id} membership: {timings}")
