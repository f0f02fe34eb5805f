"""Tests of the fake apiserver over real HTTP (stdlib client, no Envoy)."""

import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from kpp.testing.fake_apiserver import FAULT_MODES, Cluster
from kpp.testing.fake_apiserver.discovery import AGGREGATED_V2, AGGREGATED_V2BETA1, FIXTURES
from kpp.testing.fake_apiserver.store import Expired, Store
from kpp.testing.proc import read_line, wait_until

V2 = AGGREGATED_V2
V2BETA1 = AGGREGATED_V2BETA1
NOPEER = V2 + ";profile=nopeer"
# Accept strings real clients send (kpp/testing/topology.py) → the answer a 1.33+ server gives (v2beta1 removed).
ACCEPT_CASES = {
    "client-go 1.26-1.29": (f"{V2BETA1},application/json", "legacy"),
    "client-go 1.30-1.36": (f"{V2},{V2BETA1},application/json", "v2"),
    "client-go 1.37": (f"{V2},application/json", "v2"),
    "client-go NoPeerDiscovery": (f"{NOPEER},{V2},application/json", "v2"),
    "UseLegacyDiscovery": ("application/json", "legacy"),
    "apiserver peer fetch": (f"{NOPEER},{V2},application/json", "v2"),
    "aggregator / golden": (V2, "v2"),
    "params reordered, spaces": (" application/json ; as=APIGroupDiscoveryList ; v=v2 ;g=apidiscovery.k8s.io", "v2"),
    "protobuf first": ("application/vnd.kubernetes.protobuf;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
                       "application/json", "legacy"),
    "q-values": (f"{V2};q=0.9, application/json;q=0.5", "v2"),
    "wildcard": ("*/*", "legacy"),
    "application/*": ("application/*", "legacy"),
    "no Accept": (None, "legacy"),
}


class Response:
    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)


def call(instance, method, path, body=None, headers=None, timeout=5.0) -> Response:
    conn = http.client.HTTPConnection("127.0.0.1", instance.port, timeout=timeout)
    try:
        payload = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        conn.request(method, path, body=payload, headers=headers or {})
        resp = conn.getresponse()
        return Response(resp.status, resp.headers, resp.read())
    finally:
        conn.close()


def get(instance, path, accept=None, **headers) -> Response:
    if accept is not None:
        headers["Accept"] = accept
    return call(instance, "GET", path, headers=headers)


def open_watch(instance, path):
    """Start a watch; returns (connection, response) with events readable line by line."""
    conn = http.client.HTTPConnection("127.0.0.1", instance.port, timeout=5)
    conn.request("GET", path)
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "application/json"
    assert resp.headers["Transfer-Encoding"] == "chunked"
    return conn, resp


def next_event(resp):
    line = resp.readline()
    assert line.endswith(b"\n"), line
    event = json.loads(line)
    return event["type"], event["object"]


def configmap(name, **labels):
    return {"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}


@pytest.fixture
def cluster():
    cluster = Cluster()
    yield cluster
    cluster.stop_all()


@pytest.fixture
def old(cluster):
    return cluster.start("old-a", apiset="old")


@pytest.fixture
def new(cluster):
    return cluster.start("new-b", apiset="new")


def fixture(name):
    return json.loads((FIXTURES / name).read_text())


# --- discovery negotiation --------------------------------------------------------------------------------------

@pytest.mark.parametrize("endpoint", ["/api", "/apis"])
@pytest.mark.parametrize("case", ACCEPT_CASES)
def test_discovery_negotiation(old, endpoint, case):
    accept, expected = ACCEPT_CASES[case]
    resp = get(old, endpoint, accept)
    assert resp.status == 200
    assert resp.headers["x-fake-apiserver"] == "old-a"
    doc = resp.json()
    if expected == "v2":
        assert resp.headers["Content-Type"] == V2
        assert doc["kind"] == "APIGroupDiscoveryList" and doc["apiVersion"] == "apidiscovery.k8s.io/v2"
    else:
        assert resp.headers["Content-Type"] == "application/json"
        assert "ETag" not in resp.headers
        assert doc["kind"] == ("APIVersions" if endpoint == "/api" else "APIGroupList")


def test_aggregated_documents_are_the_fixtures(old, new):
    assert get(old, "/apis", V2).json()["items"] == fixture("aggregated_v2.k8s-1.33.json")["items"]
    assert get(new, "/apis", V2).json()["items"] == fixture("aggregated_v2.k8s-1.37-dev-fork.json")["items"]
    for instance in (old, new):
        items = get(instance, "/api", V2).json()["items"]
        assert len(items) == 1 and items[0]["metadata"] == {}
        assert [v["version"] for v in items[0]["versions"]] == ["v1"]


def test_core_discovery_pods_resize_only_on_new(old, new):
    def pod_subresources(instance):
        resources = get(instance, "/api", V2).json()["items"][0]["versions"][0]["resources"]
        pods = next(r for r in resources if r["resource"] == "pods")
        assert pods["scope"] == "Namespaced" and pods["shortNames"] == ["po"] and pods["categories"] == ["all"]
        return {s["subresource"]: s for s in pods["subresources"]}

    assert "resize" not in pod_subresources(old)
    subs = pod_subresources(new)
    assert subs["resize"] == {"subresource": "resize", "responseKind": {"group": "", "version": "", "kind": "Pod"},
                              "verbs": ["get", "patch", "update"]}
    assert subs["eviction"]["responseKind"] == {"group": "policy", "version": "v1", "kind": "Eviction"}
    assert set(subs) - {"resize"} == set(pod_subresources(old))


def test_legacy_only_instance_ignores_aggregated_accept(cluster):
    legacy = cluster.start("legacy", apiset="old", aggregated=False)
    for endpoint, kind in (("/api", "APIVersions"), ("/apis", "APIGroupList")):
        resp = get(legacy, endpoint, f"{V2},application/json")
        assert resp.headers["Content-Type"] == "application/json" and resp.json()["kind"] == kind
    resp = get(legacy, "/apis", V2)
    assert resp.status == 406
    assert resp.json()["message"] == "only the following media types are accepted: application/json"


def test_v2beta1_only_when_enabled(cluster, old):
    beta = cluster.start("beta", apiset="old", accept_v2beta1=True)
    resp = get(beta, "/apis", ACCEPT_CASES["client-go 1.26-1.29"][0])
    assert resp.headers["Content-Type"] == V2BETA1
    assert resp.json()["apiVersion"] == "apidiscovery.k8s.io/v2beta1"
    assert resp.json()["items"] == get(old, "/apis", V2).json()["items"]
    assert get(beta, "/apis", ACCEPT_CASES["client-go 1.30-1.36"][0]).headers["Content-Type"] == V2
    assert get(old, "/apis", V2BETA1).status == 406


def test_not_acceptable(old):
    for accept in ("application/vnd.kubernetes.protobuf", V2BETA1, "application/yaml",
                   "application/json;as=Table;v=v1;g=meta.k8s.io"):
        resp = get(old, "/apis", accept)
        assert resp.status == 406
        assert resp.headers["Content-Type"] == "application/json"
        assert resp.json() == {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "only the following media types are accepted: application/json, " + V2,
            "reason": "NotAcceptable", "code": 406}


def test_etag_and_not_modified(old, new):
    resp = get(old, "/apis", V2)
    tag = resp.headers["ETag"]
    assert tag == '"%s"' % hashlib.sha512(resp.body).hexdigest().upper() and len(tag) == 130
    assert resp.headers["Vary"] == "Accept" and resp.headers["Cache-Control"] == "public"
    assert get(old, "/apis", V2).headers["ETag"] == tag
    assert get(new, "/apis", V2).headers["ETag"] != tag
    assert get(old, "/api", V2).headers["ETag"] != tag

    cached = get(old, "/apis", V2, **{"If-None-Match": tag})
    assert cached.status == 304 and cached.body == b""
    assert cached.headers["ETag"] == tag and "Content-Length" not in cached.headers
    assert get(old, "/apis", V2, **{"If-None-Match": "W/" + tag}).status == 200  # exact match only
    assert get(old, "/apis", "application/json", **{"If-None-Match": tag}).status == 200  # legacy has no ETag


# --- legacy discovery shapes -----------------------------------------------------------------------------------

def test_legacy_api_and_apis(old, new):
    versions = get(old, "/api").json()
    assert versions == {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{old.port}"}]}
    groups = get(new, "/apis", "application/json").json()
    assert groups["kind"] == "APIGroupList" and groups["apiVersion"] == "v1"
    by_name = {g["name"]: g for g in groups["groups"]}
    assert len(by_name) == 24
    assert by_name["autoscaling"]["versions"] == [{"groupVersion": "autoscaling/v2", "version": "v2"},
                                                  {"groupVersion": "autoscaling/v1", "version": "v1"}]
    assert by_name["resource.k8s.io"]["preferredVersion"] == {"groupVersion": "resource.k8s.io/v1", "version": "v1"}
    assert get(old, "/apis/apps").json() == fixture("legacy_apis__apps.json")


def test_stale_versions_are_not_served(cluster):
    apis = {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": [
        {"metadata": {"name": "metrics.k8s.io"}, "versions": [{"version": "v1beta1", "freshness": "Stale"}]},
        {"metadata": {"name": "example.com"}, "versions": [
            {"version": "v2", "freshness": "Stale"},
            {"version": "v1", "freshness": "Current", "resources": [
                {"resource": "widgets", "responseKind": {"group": "", "version": "", "kind": "Widget"},
                 "scope": "Cluster", "singularResource": "widget", "verbs": ["get", "list", "create"]}]}]}]}
    custom = cluster.start("custom", apiset={"apis": apis, "minor": "31"})
    assert get(custom, "/apis", "application/json").json()["groups"] == [
        {"name": "example.com", "versions": [{"groupVersion": "example.com/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "example.com/v1", "version": "v1"}}]
    assert get(custom, "/apis", V2).json() == apis
    assert get(custom, "/apis/example.com/v2/widgets").status == 404
    assert get(custom, "/apis/example.com/v1/widgets").status == 200
    assert get(custom, "/apis/metrics.k8s.io").status == 404
    assert get(custom, "/version").json()["gitVersion"] == "v1.31.0-fake+custom"
    assert get(custom, "/api", V2).json()["items"][0]["metadata"] == {}  # the default core group
    assert "pods" in [r["name"] for r in get(custom, "/api/v1").json()["resources"]]


def _without_hashes(resource_list):
    return [{k: v for k, v in r.items() if k != "storageVersionHash"} for r in resource_list["resources"]]


def test_resource_lists_round_trip_the_legacy_fixtures(old, new):
    core = get(old, "/api/v1").json()
    legacy = fixture("legacy_api__v1.k8s-pre-1.33.json")
    assert core["kind"] == "APIResourceList" and core["groupVersion"] == "v1" and "apiVersion" not in core
    assert _without_hashes(core) == _without_hashes(legacy)
    new_names = [r["name"] for r in get(new, "/api/v1/").json()["resources"]]
    assert new_names == [r["name"] for r in core["resources"][:new_names.index("pods/resize")]] + ["pods/resize"] + [
        r["name"] for r in core["resources"][new_names.index("pods/resize"):]]

    apps = get(old, "/apis/apps/v1").json()
    assert apps["apiVersion"] == "v1" and apps["groupVersion"] == "apps/v1"
    assert _without_hashes(apps) == _without_hashes(fixture("legacy_apis__apps__v1.json"))
    scale = next(r for r in apps["resources"] if r["name"] == "deployments/scale")
    assert scale == {"name": "deployments/scale", "singularName": "", "namespaced": True, "group": "autoscaling",
                     "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"]}


# --- not served vs unknown --------------------------------------------------------------------------------------

NOT_SERVED = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
              "message": "the server could not find the requested resource", "reason": "NotFound", "details": {},
              "code": 404}


def assert_plain_404(resp):
    assert resp.status == 404
    assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert resp.body == b"404 page not found\n"


@pytest.mark.parametrize("path", [
    "/apis/resource.k8s.io/v1/resourceclaims",  # GV only in 1.37
    "/apis/resource.k8s.io/v1",
    "/apis/lifecycle.k8s.io",
    "/apis/nope.example.com/v1/things",
    "/api/v2/pods",
    "/openapi/v2",
    "/openapi/v3/apis/apps/v1",  # the index itself is served (test_openapi_v3_index_lists_every_group_version)
    "/metrics",
    "/",
])
def test_unknown_group_version_or_path_is_plain_404(old, path):
    assert_plain_404(get(old, path))


def test_served_vs_not_served(old, new):
    path = "/apis/resource.k8s.io/v1/namespaces/ns1/resourceclaims"
    assert_plain_404(get(old, path))
    assert get(new, path).json()["kind"] == "ResourceClaimList"
    assert get(old, "/apis/networking.k8s.io/v1beta1/ipaddresses").status == 200
    assert_plain_404(get(new, "/apis/networking.k8s.io/v1beta1/ipaddresses"))
    # served group/version, unknown resource or subresource → Status
    for path in ("/apis/apps/v1/namespaces/ns1/gadgets", "/api/v1/namespaces/ns1/pods/p1/resize",
                 "/apis/storage.k8s.io/v1/csinodes/n1/status"):
        resp = get(old, path)
        assert resp.status == 404 and resp.headers["Content-Type"] == "application/json"
        assert resp.json() == NOT_SERVED
    call(new, "POST", "/api/v1/namespaces/ns1/pods", configmap("p1"))
    assert get(new, "/api/v1/namespaces/ns1/pods/p1/resize").json()["metadata"]["name"] == "p1"
    assert get(new, "/apis/storage.k8s.io/v1/csinodes/n1/status").json()["reason"] == "NotFound"


def test_health_and_version(old, new):
    for path in ("/healthz", "/livez", "/readyz"):
        resp = get(old, path)
        assert resp.status == 200 and resp.body == b"ok"
    assert get(old, "/version").json()["gitVersion"] == "v1.33.0-fake+old-a"
    assert get(new, "/version").json()["minor"] == "37"


# --- objects ----------------------------------------------------------------------------------------------------

def test_create_get_list_update_patch_delete(old):
    base = "/api/v1/namespaces/ns1/configmaps"
    created = call(old, "POST", base, configmap("cm1", app="x"))
    assert created.status == 201 and created.headers["Content-Type"] == "application/json"
    obj = created.json()
    assert obj["apiVersion"] == "v1" and obj["kind"] == "ConfigMap"
    meta = obj["metadata"]
    assert meta["namespace"] == "ns1" and len(meta["uid"]) == 36 and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0

    dup = call(old, "POST", base, configmap("cm1"))
    assert dup.status == 409
    assert dup.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": 'configmaps "cm1" already exists', "reason": "AlreadyExists",
                          "details": {"name": "cm1", "kind": "configmaps"}, "code": 409}
    generated = call(old, "POST", base, {"metadata": {"generateName": "gen-"}}).json()["metadata"]["name"]
    assert generated.startswith("gen-") and len(generated) == 9
    assert call(old, "POST", base, {"metadata": {}}).status == 422
    call(old, "POST", "/api/v1/namespaces/ns2/configmaps", configmap("cm2", app="y"))

    assert get(old, f"{base}/cm1").json() == obj
    listed = get(old, base).json()
    assert listed["kind"] == "ConfigMapList" and listed["apiVersion"] == "v1"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["cm1", generated]
    everywhere = get(old, "/api/v1/configmaps").json()["items"]
    assert [(i["metadata"]["namespace"], i["metadata"]["name"]) for i in everywhere] == [
        ("ns1", "cm1"), ("ns1", generated), ("ns2", "cm2")]
    assert [i["metadata"]["name"] for i in get(old, "/api/v1/configmaps?labelSelector=app%3Dy").json()["items"]] == [
        "cm2"]
    assert [i["metadata"]["name"] for i in get(old, "/api/v1/configmaps?labelSelector=app!%3Dy").json()["items"]] == [
        "cm1", generated]
    assert [i["metadata"]["name"] for i in get(old, f"{base}?fieldSelector=metadata.name%3Dcm1").json()["items"]] == [
        "cm1"]
    assert get(old, f"{base}?labelSelector=app+in+(x,y)").status == 400

    updated = call(old, "PUT", f"{base}/cm1", {**obj, "data": {"k": "v2"}})
    assert updated.status == 200 and updated.json()["data"] == {"k": "v2"}
    assert int(updated.json()["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    assert updated.json()["metadata"]["uid"] == meta["uid"]
    stale = call(old, "PUT", f"{base}/cm1", {**obj, "data": {"k": "v3"}})
    assert stale.status == 409 and stale.json()["reason"] == "Conflict"
    assert call(old, "PUT", f"{base}/missing", configmap("missing")).status == 404

    for content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
        patched = call(old, "PATCH", f"{base}/cm1", {"data": {"k": None, content_type: "y"}},
                       {"Content-Type": content_type})
        assert patched.status == 200 and "k" not in patched.json()["data"]
    assert call(old, "PATCH", f"{base}/cm1", [], {"Content-Type": "application/json-patch+json"}).status == 415

    deleted = call(old, "DELETE", f"{base}/cm1")
    assert deleted.status == 200 and deleted.json()["metadata"]["name"] == "cm1"
    missing = get(old, f"{base}/cm1")
    assert missing.status == 404
    assert missing.json() == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": 'configmaps "cm1" not found', "reason": "NotFound",
                              "details": {"name": "cm1", "kind": "configmaps"}, "code": 404}
    assert call(old, "DELETE", f"{base}/cm1").status == 404

    collection = call(old, "DELETE", base)
    assert collection.status == 200 and collection.json()["status"] == "Success"
    assert [i["metadata"]["name"] for i in get(old, "/api/v1/configmaps").json()["items"]] == ["cm2"]


def test_group_resources_and_subresources(old):
    base = "/apis/apps/v1/namespaces/ns1/deployments"
    call(old, "POST", base, {"metadata": {"name": "d1"}, "spec": {"replicas": 1}})
    missing = get(old, f"{base}/nope")
    assert missing.json()["message"] == 'deployments.apps "nope" not found'
    assert missing.json()["details"] == {"name": "nope", "group": "apps", "kind": "deployments"}
    assert call(old, "POST", base, {"metadata": {"name": "d1"}}).json()["message"] == (
        'deployments.apps "d1" already exists')
    status = call(old, "PATCH", f"{base}/d1/status", {"status": {"readyReplicas": 1}},
                  {"Content-Type": "application/merge-patch+json"}).json()
    assert status["status"] == {"readyReplicas": 1} and status["spec"] == {"replicas": 1}
    assert get(old, f"{base}/d1/status").json()["status"] == {"readyReplicas": 1}
    assert get(old, f"{base}/d1/scale").json()["metadata"]["name"] == "d1"

    call(old, "POST", "/api/v1/namespaces/ns1/pods", {"metadata": {"name": "p1"}})
    log = get(old, "/api/v1/namespaces/ns1/pods/p1/log")
    assert log.status == 200 and log.body == b"fake log from old-a\n"
    assert log.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert get(old, "/api/v1/namespaces/ns1/pods/p2/log").json()["reason"] == "NotFound"

    call(old, "POST", "/api/v1/namespaces", {"metadata": {"name": "ns1"}})
    ns = get(old, "/api/v1/namespaces/ns1").json()
    assert ns["kind"] == "Namespace" and "namespace" not in ns["metadata"]
    assert call(old, "DELETE", "/api/v1/componentstatuses/x").status == 405  # verbs come from discovery
    assert_plain_404(get(old, "/api/v1/pods/p1"))  # namespaced item without namespace: no such route
    assert_plain_404(get(old, "/api/v1/namespaces/ns1/nodes"))


def test_path_grammar_corners(old):
    resp = get(old, "/api/v1/watch")
    assert resp.status == 500 and b"unable to determine kind and namespace from url" in resp.body
    assert get(old, "/api/v1/namespaces/ns1/pods?watch=0").json()["kind"] == "PodList"
    assert get(old, "/api/v1/namespaces/ns1/pods?watch=False").json()["kind"] == "PodList"
    for path in ("/api/v1/namespaces/ns1/pods?watch=&timeoutSeconds=0",
                 "/api/v1/watch/namespaces/ns1/pods?timeoutSeconds=0"):
        resp = get(old, path)
        assert resp.status == 200 and resp.headers["Transfer-Encoding"] == "chunked" and resp.body == b""


def test_shared_store_across_instances_and_versions(old, new):
    created = call(new, "POST", "/apis/apps/v1/namespaces/ns1/deployments", {"metadata": {"name": "d1"}})
    assert created.status == 201
    seen = get(old, "/apis/apps/v1/namespaces/ns1/deployments/d1").json()
    assert seen["metadata"]["uid"] == created.json()["metadata"]["uid"]

    hpa = {"metadata": {"name": "h1"}, "spec": {"maxReplicas": 3}}
    assert call(new, "POST", "/apis/autoscaling/v2/namespaces/ns1/horizontalpodautoscalers", hpa).status == 201
    via_v1 = get(old, "/apis/autoscaling/v1/namespaces/ns1/horizontalpodautoscalers").json()
    assert via_v1["apiVersion"] == "autoscaling/v1"
    assert [(i["apiVersion"], i["metadata"]["name"]) for i in via_v1["items"]] == [("autoscaling/v1", "h1")]
    assert call(old, "DELETE", "/apis/autoscaling/v1/namespaces/ns1/horizontalpodautoscalers/h1").status == 200
    assert get(new, "/apis/autoscaling/v2/namespaces/ns1/horizontalpodautoscalers/h1").status == 404


# --- watch ------------------------------------------------------------------------------------------------------

def test_watch_events_from_any_instance(old, new):
    base = "/api/v1/namespaces/ns1/configmaps"
    call(old, "POST", base, configmap("before"))
    call(old, "POST", "/api/v1/namespaces/other/configmaps", configmap("elsewhere"))
    conn, resp = open_watch(old, f"{base}?watch=true&allowWatchBookmarks=true")
    try:
        assert next_event(resp)[0] == "ADDED"
        created = call(new, "POST", base, configmap("cm1")).json()  # through the other instance
        kind, obj = next_event(resp)
        assert (kind, obj) == ("ADDED", created)
        call(old, "PATCH", f"{base}/cm1", {"data": {"k": "v2"}}, {"Content-Type": "application/merge-patch+json"})
        kind, obj = next_event(resp)
        assert kind == "MODIFIED" and obj["data"] == {"k": "v2"}
        call(new, "DELETE", f"{base}/cm1")
        kind, obj = next_event(resp)
        assert kind == "DELETED" and obj["metadata"]["name"] == "cm1"
        assert int(obj["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    finally:
        conn.close()

    # replay from a resourceVersion through the legacy /watch/ prefix on the other instance
    conn, resp = open_watch(new, f"/api/v1/watch/namespaces/ns1/configmaps?resourceVersion="
                                 f"{created['metadata']['resourceVersion']}&timeoutSeconds=1")
    try:
        assert [next_event(resp)[0] for _ in range(2)] == ["MODIFIED", "DELETED"]
        assert resp.read() == b""  # timeoutSeconds ends the stream with the zero chunk
    finally:
        conn.close()


def test_watch_versions_names_and_selectors(old, new):
    conn, resp = open_watch(old, "/apis/autoscaling/v1/watch/namespaces/ns1/horizontalpodautoscalers/h1")
    label_conn, label_resp = open_watch(new, "/api/v1/configmaps?watch=1&labelSelector=app%3Dx")
    try:
        call(new, "POST", "/apis/autoscaling/v2/namespaces/ns1/horizontalpodautoscalers", {"metadata": {"name": "h0"}})
        call(new, "POST", "/apis/autoscaling/v2/namespaces/ns1/horizontalpodautoscalers", {"metadata": {"name": "h1"}})
        kind, obj = next_event(resp)
        assert kind == "ADDED" and obj["metadata"]["name"] == "h1" and obj["apiVersion"] == "autoscaling/v1"

        call(old, "POST", "/api/v1/namespaces/ns1/configmaps", configmap("cm1"))
        merge = {"Content-Type": "application/merge-patch+json"}
        for value in ("x", "y"):
            call(old, "PATCH", "/api/v1/namespaces/ns1/configmaps/cm1", {"metadata": {"labels": {"app": value}}},
                 merge)
        assert [next_event(label_resp)[0] for _ in range(2)] == ["ADDED", "DELETED"]
    finally:
        conn.close()
        label_conn.close()


def test_watch_timeout_ends_stream(old):
    start = time.monotonic()
    conn, resp = open_watch(old, "/api/v1/namespaces/ns1/pods?watch=true&timeoutSeconds=1")
    try:
        assert resp.read() == b""
        assert 0.9 < time.monotonic() - start < 3
    finally:
        conn.close()


def test_store_expires_old_resource_versions():
    store = Store(max_events=2)
    for name in "abc":
        store.create(("", "configmaps", "ns", name), {"metadata": {"name": name}})
    assert [e.key[3] for e in store.events_after(1)] == ["b", "c"]
    with pytest.raises(Expired):
        store.events_after(0)


def test_watch_from_compacted_resource_version_gets_410():
    cluster = Cluster(max_events=2)
    try:
        a = cluster.start("a")
        for name in "abcd":  # the log keeps rv 3 and 4: events after rv 1 are partly gone
            call(a, "POST", "/api/v1/namespaces/ns1/configmaps", configmap(name))
        conn, resp = open_watch(a, "/api/v1/namespaces/ns1/configmaps?watch=true&resourceVersion=1")
        kind, status = next_event(resp)
        assert kind == "ERROR"
        assert status == {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                          "message": "too old resource version: 1 (2)", "reason": "Expired", "code": 410}
        assert resp.read() == b""
        conn.close()
    finally:
        cluster.stop_all()


# --- observability ----------------------------------------------------------------------------------------------

def test_request_log_and_peer_proxied_echo(old):
    assert "x-fake-peer-proxied" not in get(old, "/version").headers
    resp = get(old, "/api/v1/namespaces/ns1/pods?limit=5", **{"x-kubernetes-peer-proxied": "true", "X-Extra": "1"})
    assert resp.headers["x-fake-peer-proxied"] == "true"
    assert get(old, "/nope", **{"x-kubernetes-peer-proxied": "true"}).headers["x-fake-peer-proxied"] == "true"
    log = get(old, "/__fake/requests").json()
    assert [(e["method"], e["path"]) for e in log] == [
        ("GET", "/version"), ("GET", "/api/v1/namespaces/ns1/pods?limit=5"), ("GET", "/nope")]
    assert log[1]["headers"]["x-kubernetes-peer-proxied"] == "true" and log[1]["headers"]["x-extra"] == "1"
    assert call(old, "DELETE", "/__fake/requests").status == 200
    assert get(old, "/__fake/requests").json() == []


# --- discovery faults -------------------------------------------------------------------------------------------

def set_fault(instance, mode):
    resp = call(instance, "POST", "/__fake/fault", {"discovery": mode})
    assert resp.status == 200 and resp.json() == {"discovery": mode}


def test_fault_control(old):
    assert get(old, "/__fake/fault").json() == {"discovery": "ok"}
    assert call(old, "POST", "/__fake/fault", {"discovery": "flaky"}).status == 400
    for mode in FAULT_MODES:
        set_fault(old, mode)
        assert get(old, "/__fake/fault").json() == {"discovery": mode}


def test_fault_500(old):
    set_fault(old, "500")
    for path in ("/api", "/apis", "/api/v1", "/apis/apps/v1"):
        resp = get(old, path, V2)
        assert resp.status == 500 and resp.json()["reason"] == "InternalError"
    assert get(old, "/version").status == 200
    assert get(old, "/api/v1/namespaces/ns1/pods").status == 200


def test_fault_malformed(old):
    set_fault(old, "malformed")
    resp = get(old, "/apis", V2)
    assert resp.status == 200 and resp.headers["Content-Type"] == V2
    with pytest.raises(ValueError):
        resp.json()


def test_fault_truncated(old):
    set_fault(old, "truncated")
    conn = http.client.HTTPConnection("127.0.0.1", old.port, timeout=5)
    conn.request("GET", "/apis", headers={"Accept": V2})
    resp = conn.getresponse()
    assert resp.status == 200
    with pytest.raises(http.client.IncompleteRead):
        resp.read()
    conn.close()


def test_fault_timeout_does_not_block_other_requests(old):
    set_fault(old, "timeout")
    with pytest.raises(socket.timeout):
        call(old, "GET", "/apis", headers={"Accept": V2}, timeout=0.3)
    start = time.monotonic()
    assert get(old, "/version").status == 200
    set_fault(old, "ok")
    assert get(old, "/apis", V2).status == 200
    assert time.monotonic() - start < 1


def test_fault_oversized(old):
    set_fault(old, "oversized")
    resp = get(old, "/apis", V2)
    assert resp.status == 200 and resp.headers["Content-Type"] == V2
    assert len(resp.body) >= 60 * 1024 * 1024
    assert int(resp.headers["Content-Length"]) == len(resp.body)
    assert resp.headers["ETag"] == '"%s"' % hashlib.sha512(resp.body).hexdigest().upper()
    assert resp.json()["items"] == fixture("aggregated_v2.k8s-1.33.json")["items"]


def test_fault_future(old):
    set_fault(old, "future")
    future = "application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList"
    for path, name in (("/apis", "aggregated_v2.k8s-1.33.json"), ("/api", None)):
        for accept in (V2, "application/json"):
            resp = get(old, path, accept)
            assert resp.status == 200 and resp.headers["Content-Type"] == future, (path, accept)
            doc = resp.json()
            assert doc["kind"] == "APIGroupDiscoveryList" and doc["apiVersion"] == "apidiscovery.k8s.io/v3"
            assert resp.headers["ETag"] == '"%s"' % hashlib.sha512(resp.body).hexdigest().upper()
            if name:
                assert doc["items"] == fixture(name)["items"]
    # Legacy group-version documents are unchanged.
    resp = get(old, "/apis/apps/v1")
    assert resp.status == 200 and resp.json()["kind"] == "APIResourceList"


# --- lifecycle --------------------------------------------------------------------------------------------------

def test_stop_and_restart_on_same_port(cluster):
    a = cluster.start("a", apiset="old")
    port = a.port
    call(a, "POST", "/api/v1/namespaces/ns1/configmaps", configmap("survivor"))
    conn, resp = open_watch(a, "/api/v1/configmaps?watch=true")
    keep_alive = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    keep_alive.request("GET", "/version")
    keep_alive.getresponse().read()
    try:
        assert next_event(resp)[0] == "ADDED"
        start = time.monotonic()
        b = cluster.restart("a", apiset="new")
        assert resp.read() == b""  # the open watch ended
        assert time.monotonic() - start < 2
        assert b.port == port and cluster.instances["a"] is b
        assert get(b, "/version").json()["minor"] == "37"
        assert get(b, "/api/v1/namespaces/ns1/configmaps/survivor").status == 200  # the store outlives instances
        with pytest.raises((ConnectionError, http.client.HTTPException)):  # old keep-alive connection was closed
            keep_alive.request("GET", "/version")
            keep_alive.getresponse().read()
    finally:
        conn.close()
        keep_alive.close()

    b.stop()
    with pytest.raises(ConnectionRefusedError):
        call(b, "GET", "/version")
    cluster.start("dup")
    with pytest.raises(ValueError):
        cluster.start("dup")


@pytest.mark.parametrize("grace", [2.0, 0.0], ids=["graceful", "crash"])
def test_a_graceful_stop_finishes_the_answer_in_progress_and_a_crash_cuts_it(cluster, grace):
    """stop(grace=...) stops as kube-apiserver does on SIGTERM (Go's http.Server.Shutdown): the answer being
    written is finished, with `Connection: close`. The control, stop() (a crash), cuts the same answer. Idle
    keep-alive connections are closed either way."""
    a = cluster.start("a", apiset="old")
    a.discovery_delay_ms = 500  # a discovery answer held back: still in progress when the stop begins
    idle = http.client.HTTPConnection("127.0.0.1", a.port, timeout=5)
    idle.request("GET", "/version")
    idle.getresponse().read()
    busy = http.client.HTTPConnection("127.0.0.1", a.port, timeout=5)
    stopper = threading.Thread(target=a.stop, kwargs={"grace": grace}, daemon=True)
    try:
        busy.request("GET", "/apis", headers={"Accept": V2})
        wait_until(lambda: any(q["path"] == "/apis" for q in a.requests()), 5, 0.01, "the request never arrived")
        stopper.start()
        if grace:
            resp = busy.getresponse()
            body = resp.read()
            assert resp.status == 200 and int(resp.headers["Content-Length"]) == len(body) > 0
            assert resp.headers["Connection"] == "close"
        else:
            with pytest.raises((ConnectionError, http.client.HTTPException)):
                busy.getresponse().read()
        stopper.join(10)
        assert not stopper.is_alive(), "stop() did not return"
        with pytest.raises((ConnectionError, http.client.HTTPException)):
            idle.request("GET", "/version")
            idle.getresponse().read()
    finally:
        stopper.join(10)
        busy.close()
        idle.close()
    with pytest.raises(ConnectionRefusedError):
        call(a, "GET", "/version")


def test_cli_runs_until_sigterm(tmp_path):
    # From any directory: the venv has python/ on its path (scripts/setup.sh).
    proc = subprocess.Popen([sys.executable, "-m", "kpp.testing.fake_apiserver", "--instance", "a:0:old",
                             "--instance", "b:0:new:legacy-only"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        lines = [read_line(proc.stdout, 30, "the fake apiserver's CLI").strip() for _ in range(2)]
        assert lines[0].startswith("fake-apiserver a (old) listening on http://127.0.0.1:")
        assert lines[1].startswith("fake-apiserver b (new) listening on http://127.0.0.1:")
        port = int(lines[1].rsplit(":", 1)[1])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/apis", headers={"Accept": V2})
        assert conn.getresponse().headers["Content-Type"] == "application/json"  # legacy-only
        conn.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0


# --- additions for the upgrade/fault/stream e2e tests ---------------------------------------------------------

def test_discovery_delay(old):
    resp = call(old, "POST", "/__fake/fault", {"discovery": "ok", "delay_ms": 400})
    assert resp.status == 200 and resp.json() == {"discovery": "ok", "delay_ms": 400}
    start = time.monotonic()
    assert get(old, "/apis", V2).status == 200
    assert time.monotonic() - start >= 0.4
    start = time.monotonic()
    assert get(old, "/api/v1/namespaces/ns1/pods").status == 200  # resources are not delayed
    assert time.monotonic() - start < 0.3
    assert call(old, "POST", "/__fake/fault", {"discovery": "ok", "delay_ms": -1}).status == 400
    set_fault(old, "ok")  # a POST without delay_ms clears the delay
    assert get(old, "/__fake/fault").json() == {"discovery": "ok"}


def test_with_subresource_adds_a_synthetic_subresource_to_a_copy(cluster):
    from kpp.testing.fake_apiserver.discovery import builtin_apiset, with_subresource

    derived = with_subresource("new", "lifecycle.k8s.io", "v1alpha1", "evictionrequests", "exec", ["create", "get"])
    b = cluster.start("b", apiset=derived)
    resources = {r["resource"]: r for g in get(b, "/apis", V2).json()["items"] if g["metadata"]["name"] == "lifecycle.k8s.io"
                 for v in g["versions"] for r in v["resources"]}
    assert [s["subresource"] for s in resources["evictionrequests"]["subresources"]] == ["exec", "status"]
    assert "exec" not in {s["subresource"] for s in builtin_apiset("new").resource(
        "lifecycle.k8s.io", "v1alpha1", "evictionrequests")["subresources"]}
    with pytest.raises(ValueError):
        with_subresource("old", "lifecycle.k8s.io", "v1alpha1", "evictionrequests", "exec", ["get"])


def test_websocket_echo_on_exec_style_subresources(old):
    from kpp.testing.fake_apiserver.websocket import BINARY, CLOSE, TEXT, WebSocket

    call(old, "POST", "/api/v1/namespaces/ns1/pods", {"metadata": {"name": "p1"}})
    ws = WebSocket.connect("127.0.0.1", old.port, "/api/v1/namespaces/ns1/pods/p1/exec?command=sh",
                           ["v5.channel.k8s.io", "v4.channel.k8s.io"])
    assert ws.status == 101 and ws.headers["sec-websocket-protocol"] == "v5.channel.k8s.io"
    assert ws.headers["x-fake-apiserver"] == "old-a"
    assert ws.recv() == (TEXT, b"old-a exec p1")
    big = os.urandom(200_000)
    ws.send(big)
    assert ws.recv() == (BINARY, big)
    ws.send("text")
    assert ws.recv() == (TEXT, b"text")
    ws.send(b"\x03\xe8", CLOSE)
    assert ws.recv() == (CLOSE, b"\x03\xe8")
    ws.sock.close()
    # Without an upgrade the subresource still answers like before; a missing parent is a 404.
    assert get(old, "/api/v1/namespaces/ns1/pods/p1/exec").json()["kind"] == "Pod"
    missing = WebSocket.connect("127.0.0.1", old.port, "/api/v1/namespaces/ns1/pods/nope/exec")
    assert missing.status == 404
    missing.sock.close()


def test_fault_oversized_size_is_configurable(old):
    resp = call(old, "POST", "/__fake/fault", {"discovery": "oversized", "oversized_bytes": 2_000_000})
    assert resp.json() == {"discovery": "oversized", "oversized_bytes": 2_000_000}
    body = get(old, "/apis", V2).body
    assert len(body) == 2_000_000 and json.loads(body)["kind"] == "APIGroupDiscoveryList"
    set_fault(old, "ok")
    assert get(old, "/__fake/fault").json() == {"discovery": "ok"}


def test_fault_truncated_ignores_if_none_match(old):
    etag = get(old, "/apis", V2).headers["ETag"]
    assert get(old, "/apis", V2, **{"If-None-Match": etag}).status == 304
    set_fault(old, "truncated")
    conn = http.client.HTTPConnection("127.0.0.1", old.port, timeout=5)
    conn.request("GET", "/apis", headers={"Accept": V2, "If-None-Match": etag})
    resp = conn.getresponse()
    assert resp.status == 200
    with pytest.raises(http.client.IncompleteRead):
        resp.read()
    conn.close()


# --- additions for the membership e2e tests (tests/e2e/test_membership.py) ---------------------------------------

UNAUTHORIZED_BODY = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                     "message": "Unauthorized", "reason": "Unauthorized", "code": 401}


def test_fault_401_answers_unauthorized_status_on_every_discovery_path(old):
    set_fault(old, "401")
    for path in ("/api", "/apis", "/api/v1", "/apis/apps", "/apis/apps/v1"):
        for accept in (V2, "application/json", None):
            resp = get(old, path, accept)
            assert resp.status == 401, (path, accept)
            assert resp.headers["Content-Type"] == "application/json"
            assert resp.json() == UNAUTHORIZED_BODY
    # Only discovery: resources, /version and health still answer.
    assert get(old, "/api/v1/namespaces/ns1/configmaps").status == 200
    assert get(old, "/version").status == 200
    set_fault(old, "ok")
    assert get(old, "/apis", V2).status == 200


def test_fault_limited_to_paths(old):
    resp = call(old, "POST", "/__fake/fault", {"discovery": "500", "paths": ["/api", "/apis/apps/v1/"],
                                               "delay_ms": 300})
    assert resp.status == 200
    assert resp.json() == {"discovery": "500", "delay_ms": 300, "paths": ["/api", "/apis/apps/v1"]}
    assert get(old, "/__fake/fault").json() == resp.json()
    start = time.monotonic()
    assert get(old, "/api", V2).status == 500
    assert get(old, "/apis/apps/v1").status == 500
    assert time.monotonic() - start >= 0.6, "the delay applies to the listed paths"
    start = time.monotonic()
    for path in ("/apis", "/api/v1", "/apis/apps", "/apis/batch/v1"):  # exact paths only
        assert get(old, path, V2 if path == "/apis" else None).status == 200, path
    assert time.monotonic() - start < 0.3, "the other paths are not delayed"
    for bad in ([], "/api", ["api"], [1]):
        assert call(old, "POST", "/__fake/fault", {"discovery": "500", "paths": bad}).status == 400, bad
    set_fault(old, "ok")  # a POST without paths applies to every path again
    assert get(old, "/__fake/fault").json() == {"discovery": "ok"}
    set_fault(old, "401")
    assert get(old, "/apis/apps/v1").status == 401


def test_serve_adds_a_type_outside_discovery(cluster):
    a = cluster.start("a", apiset="old")
    other = cluster.start("other", apiset="old")
    widgets = "/apis/example.com/v1/namespaces/ns1/widgets"
    assert get(a, widgets).status == 404 and get(a, widgets).headers["Content-Type"].startswith("text/plain")
    spec = {"group": "example.com", "version": "v1", "resource": "widgets", "kind": "Widget", "namespaced": True}
    resp = call(a, "POST", "/__fake/serve", spec)
    assert resp.status == 200 and resp.json() == [spec]
    assert get(a, "/__fake/serve").json() == [spec]

    created = call(a, "POST", widgets, {"metadata": {"name": "w1"}, "spec": {"size": 1}})
    assert created.status == 201, created.body
    assert (created.json()["kind"], created.json()["apiVersion"]) == ("Widget", "example.com/v1")
    assert get(a, widgets + "/w1").json()["spec"] == {"size": 1}
    assert [o["metadata"]["name"] for o in get(a, widgets).json()["items"]] == ["w1"]
    missing = get(a, widgets + "/nope")
    assert missing.status == 404 and missing.json()["details"]["name"] == "nope"
    # A resource of the group/version that was not added: go-restful's 404 for an unknown resource.
    assert get(a, "/apis/example.com/v1/gadgets").json() == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "the server could not find the requested resource", "reason": "NotFound", "details": {},
        "code": 404}
    # Not in discovery (yet), and not served by the other instance.
    assert get(a, "/apis/example.com/v1").status == 404
    assert "example.com" not in {g["metadata"]["name"] for g in get(a, "/apis", V2).json()["items"]}
    assert "example.com" not in {g["name"] for g in get(a, "/apis").json()["groups"]}
    assert get(other, widgets).status == 404

    cluster_scoped = dict(spec, resource="things", kind="Thing", namespaced=False)
    assert call(a, "POST", "/__fake/serve", cluster_scoped).status == 200
    assert call(a, "POST", "/apis/example.com/v1/things", {"metadata": {"name": "t"}}).status == 201
    assert get(a, "/apis/example.com/v1/namespaces/ns1/things/t").status == 404  # wrong scope

    for bad in ({**spec, "namespaced": "yes"}, {k: v for k, v in spec.items() if k != "kind"},
                {**spec, "resource": ""}, {**spec, "extra": 1}, {**spec, "group": "a/b"}):
        assert call(a, "POST", "/__fake/serve", bad).status == 400, bad
    assert call(a, "DELETE", "/__fake/serve").json() == []
    assert get(a, widgets + "/w1").status == 404


def test_with_resource_adds_a_listed_type_to_a_copy(cluster):
    from kpp.testing.fake_apiserver.discovery import builtin_apiset, with_resource

    derived = with_resource("new", "only.example.com", "v1", "gadgets", "Gadget")
    core = with_resource("old", "", "v1", "gizmos", "Gizmo", namespaced=False)
    b = cluster.start("b", apiset=derived)
    c = cluster.start("c", apiset=core)
    assert "only.example.com" in {g["metadata"]["name"] for g in get(b, "/apis", V2).json()["items"]}
    assert [r["name"] for r in get(b, "/apis/only.example.com/v1").json()["resources"]] == ["gadgets"]
    assert call(b, "POST", "/apis/only.example.com/v1/namespaces/ns1/gadgets", {"metadata": {"name": "g"}}).status == 201
    assert "gizmos" in {r["name"] for r in get(c, "/api/v1").json()["resources"]}
    assert call(c, "POST", "/api/v1/gizmos", {"metadata": {"name": "z"}}).status == 201
    assert builtin_apiset("new").resource("only.example.com", "v1", "gadgets") is None
    with pytest.raises(ValueError):
        with_resource("old", "apps", "v1", "deployments", "Deployment")


SLICE = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes"


def shape(v):
    """The JSON structure with every scalar replaced by its type: keys in their order, lists by length."""
    if isinstance(v, dict):
        return [(k, shape(x)) for k, x in v.items()]
    if isinstance(v, list):
        return [shape(x) for x in v]
    return type(v).__name__


def test_instances_on_other_loopback_addresses_share_one_port(cluster):
    a = cluster.start("a", host="127.0.0.11", apiset="old")
    b = cluster.start("b", host="127.0.0.12", port=a.port, apiset="new")
    assert (a.url, b.url) == (f"http://127.0.0.11:{a.port}", f"http://127.0.0.12:{a.port}")
    for inst in (a, b):
        conn = http.client.HTTPConnection(inst.host, inst.port, timeout=5)
        conn.request("GET", "/api", headers={"Accept": "application/json"})
        resp = conn.getresponse()
        assert resp.headers["x-fake-apiserver"] == inst.name
        assert json.loads(resp.read())["serverAddressByClientCIDRs"][0]["serverAddress"] == f"{inst.host}:{a.port}"
        conn.close()
    assert cluster.restart("b").url == b.url


def test_kubernetes_endpoint_slice_as_the_lease_reconciler_writes_it(cluster, old, new):
    """The slice a real v1.36.3 apiserver wrote (the captured fixture) and the fake's have the same structure,
    key order included; it is read through any instance, at its real path."""
    r = get(old, SLICE)
    assert r.status == 404 and r.json()["reason"] == "NotFound", r.body  # no reconciler yet
    cluster.set_kubernetes_endpoints(["198.18.0.13", "198.18.0.11", "198.18.0.12"], 6443)
    r = get(new, SLICE)
    assert r.status == 200 and r.headers["Content-Type"] == "application/json"
    real = fixture("endpointslice_kubernetes.k8s-1.36.3.ipv4.json")
    assert shape(r.json()) == shape(real)
    assert {k: r.json()[k] for k in ("addressType", "endpoints", "ports")} == \
           {k: real[k] for k in ("addressType", "endpoints", "ports")}, "same IPs, same port: same content"
    assert r.json()["metadata"]["generation"] == 1
    # Updated in place (a new generation, the same uid); IPs in string order; an empty list is null.
    cluster.set_kubernetes_endpoints(["fd00:198:18::12", "fd00:198:18::11"], 6443, not_ready=["fd00:198:18::12"])
    v6 = get(old, SLICE).json()
    assert (v6["metadata"]["generation"], v6["metadata"]["uid"]) == (2, r.json()["metadata"]["uid"])
    assert v6["addressType"] == "IPv6"
    assert v6["endpoints"] == [{"addresses": ["fd00:198:18::11"], "conditions": {"ready": True}},
                               {"addresses": ["fd00:198:18::12"], "conditions": {"ready": False}}]
    cluster.set_kubernetes_endpoints([], 6443)
    assert b'"endpoints":null' in get(old, SLICE).body
    for bad in ([["10.0.0.1", "fd00::1"], 6443], [["cp-1"], 6443], [["10.0.0.1"], 0], [["10.0.0.1"], True]):
        with pytest.raises(ValueError):
            cluster.set_kubernetes_endpoints(*bad)
    cluster.delete_kubernetes_endpoints()
    assert get(new, SLICE).status == 404


def test_kubernetes_endpoints_control(cluster, old):
    r = call(old, "POST", "/__fake/kubernetes-endpoints", {"addresses": ["10.0.0.2", "10.0.0.1"], "port": 6443})
    assert r.status == 200 and [e["addresses"] for e in r.json()["endpoints"]] == [["10.0.0.1"], ["10.0.0.2"]]
    assert get(old, SLICE).json() == r.json()
    assert get(old, "/__fake/kubernetes-endpoints").json() == r.json()
    assert call(old, "POST", "/__fake/kubernetes-endpoints", {"addresses": ["nope"], "port": 1}).status == 400
    assert call(old, "POST", "/__fake/kubernetes-endpoints", {"port": 1}).status == 400
    assert call(old, "DELETE", "/__fake/kubernetes-endpoints").status == 404
    assert get(old, SLICE).status == 404
    assert old.requests() and all(not q["path"].startswith("/__fake") for q in old.requests())


def test_openapi_v3_index_lists_every_group_version(cluster):
    inst = cluster.start("idx", apiset="new")
    paths = get(inst, "/openapi/v3").json()["paths"]
    assert {"api/v1", "apis/apps/v1", "apis/resource.k8s.io/v1"} <= set(paths)
    inst.openapi_index = False
    assert get(inst, "/openapi/v3").status == 404
