"""Real version skew: kube-apiserver v1.35.4 (`old`, with one beta API on: OLD_RUNTIME_CONFIG) and v1.36.3
(`new`) on one etcd, an Envoy with the filter in front of each. The GVRs that differ are read from the two servers' own discovery
(`profile=nopeer`, straight from each apiserver), never hard-coded; the key assertions of
test_control_plane.py are repeated for every one of them. Run with `make e2e-k8s-skew`.

Evidence that a request was served by the other server: a unique `Audit-ID` sent by the client shows
up in that server's audit log and not in the local one's, and Envoy's access log records the peer
cluster and `x-kubernetes-peer-proxied: true` on the forwarded request (see test_control_plane.py).
"""

from __future__ import annotations

import json
import uuid

import pytest

from kpp.testing import harness
from kpp.testing.cluster import DEFAULT_VERSION, SKEW_OLD_VERSION
from k8senv import NOPEER, V2, discovery, dumped, from_access_log, http, start_env, stop_env

KUBECTL_ACCEPT = V2 + ",application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"


# With their defaults v1.36.3 serves everything v1.35.4 does (only_old would be empty, and the test for
# that direction would prove nothing): the old server also serves a beta API that v1.36.3, as started
# here, does not (MutatingAdmissionPolicy's v1beta1; v1 is GA in v1.36), as after an upgrade that drops
# a beta API the old version had on.
OLD_RUNTIME_CONFIG = "admissionregistration.k8s.io/v1beta1=true"


@pytest.fixture(scope="module")
def skew(request, tmp_path_factory):
    e = start_env(tmp_path_factory.mktemp("skew"), [("old", SKEW_OLD_VERSION, OLD_RUNTIME_CONFIG),
                                                    ("new", DEFAULT_VERSION, "")])
    try:
        with dumped(request, e):
            yield e
    finally:
        stop_env(e)


def scoped_resources(env, name: str) -> dict[tuple[str, str, str], dict]:
    """GVR -> discovery entry (scope, verbs) from one server's own aggregated discovery."""
    out = {}
    for root in ("/api", "/apis"):
        r = env.direct(name, root, headers={"Accept": NOPEER})
        assert r.status == 200, r
        for g in r.json()["items"]:
            for v in g["versions"]:
                for res in v.get("resources") or []:
                    out[(g["metadata"].get("name", ""), v["version"], res["resource"])] = res
    return out


def list_path(gvr, entry) -> str:
    g, v, r = gvr
    base = f"/apis/{g}/{v}" if g else f"/api/{v}"
    return f"{base}/namespaces/default/{r}" if entry.get("scope") == "Namespaced" else f"{base}/{r}"


@pytest.fixture(scope="module")
def diff(skew):
    old, new = scoped_resources(skew, "old"), scoped_resources(skew, "new")
    only_new = {k: new[k] for k in new.keys() - old.keys()}
    only_old = {k: old[k] for k in old.keys() - new.keys()}
    print(f"\nonly in {DEFAULT_VERSION}: {sorted(only_new)}\nonly in {SKEW_OLD_VERSION}: {sorted(only_old)}")
    assert only_new or only_old, "v1.35.4 and v1.36.3 serve the same GVRs: nothing to test"
    return {"old": old, "new": new, "only_new": only_new, "only_old": only_old}


def test_versions_are_what_they_claim(skew):
    for name, want in (("old", SKEW_OLD_VERSION), ("new", DEFAULT_VERSION)):
        r = skew.direct(name, "/version")
        assert r.json()["gitVersion"] == want, r


def _routes(skew, via: str, to: str, gvrs: dict):
    listable = {k: e for k, e in gvrs.items() if "list" in e.get("verbs", [])}
    for gvr, entry in sorted(listable.items()):
        path = list_path(gvr, entry)
        assert skew.direct(via, path).status == 404, f"{via} should not serve {gvr}"
        aid = str(uuid.uuid4())
        r = skew.via(via, path, token=skew.tokens["kpp-admin"], headers={"Audit-ID": aid})
        assert r.status == 200, (gvr, r)
        assert r.json()["kind"].endswith("List"), (gvr, r)
        ev = harness.wait_until(lambda: next((e for e in skew.server(to).audit_events()
                                              if e["auditID"] == aid), None), 10,
                                message=f"{gvr}: audit id not in {to}'s audit log")
        assert ev["user"]["username"] == "kpp-admin" and ev["responseStatus"]["code"] == 200
        assert not any(e["auditID"] == aid for e in skew.server(via).audit_events()), gvr
        acc = from_access_log(skew.fronts[via].envoy, lambda: next((e for e in skew.fronts[via].access_entries()
                                                                     if e["audit_id"] == aid), None))
        assert (acc["cluster"], acc["peer_proxied"]) == (f"peer-{to}", "true"), acc
    return listable


def test_gvrs_only_the_new_server_serves_are_served_through_the_old_servers_envoy(skew, diff):
    # The pinned pair (v1.35.4 -> v1.36.3) has GVRs on both sides; an empty diff means discovery
    # failed, not that there is nothing to prove, so it fails instead of skipping.
    assert diff["only_new"], "no GVR is new in v1.36.3: the skew test proves nothing"
    done = _routes(skew, "old", "new", diff["only_new"])
    assert done, f"no listable GVR among {sorted(diff['only_new'])}"


def test_gvrs_only_the_old_server_serves_are_served_through_the_new_servers_envoy(skew, diff):
    assert diff["only_old"], "v1.36.3 removed no GVR that v1.35.4 serves: the skew test proves nothing"
    _routes(skew, "new", "old", diff["only_old"])


def test_merged_discovery_and_nopeer_on_both_sides(skew, diff):
    old_own = set(diff["old"])
    new_own = set(diff["new"])
    for via, own in (("old", old_own), ("new", new_own)):
        merged = discovery(skew.fronts[via].url, skew.tokens["alice"], accept=KUBECTL_ACCEPT, ca=skew.cp.ca)
        assert merged == old_own | new_own, via
        assert discovery(skew.fronts[via].url, skew.tokens["alice"], accept=NOPEER, ca=skew.cp.ca) == own, via


def test_kubectl_and_watch_through_the_old_servers_envoy(skew, diff):
    listable = {k: e for k, e in diff["only_new"].items() if {"list", "watch"} <= set(e.get("verbs", []))}
    assert listable, "no watchable GVR is new in v1.36.3: the skew test proves nothing"
    kc = skew.kubeconfig("old", "kpp-admin")
    names = skew.kubectl(kc, "api-resources", "-o", "name").stdout.split()
    for (g, v, r), entry in sorted(listable.items()):
        qualified = f"{r}.{v}.{g}" if g else f"{r}.{v}"
        assert any(n == r or n.startswith(r + ".") for n in names), (r, names)
        out = skew.kubectl(kc, "get", qualified, "-A", "-o", "json")
        assert json.loads(out.stdout)["kind"] == "List", out
        # A watch through the reroute: with sendInitialEvents the server ends the initial list with a
        # BOOKMARK event, so an event arrives even though nothing changes.
        path = list_path((g, v, r), entry)
        q = "?watch=1&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=5"
        resp = http(skew.fronts["old"].url, path + q, token=skew.tokens["kpp-admin"], timeout=30, ca=skew.cp.ca)
        assert resp.status == 200, ((g, v, r), resp)
        events = [json.loads(line) for line in resp.body.splitlines() if line.strip()]
        assert any(e["type"] == "BOOKMARK" for e in events), events
