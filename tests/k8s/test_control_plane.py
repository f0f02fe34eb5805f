"""The filter in front of real kube-apiservers (v1.36.3, built from the Go module proxy) on one etcd.

Topology (tests/k8s/conftest.py): server `a` runs with `--runtime-config=batch/v1=false,autoscaling/v2=false`
(a whole group and one version of a group it still serves are missing), server `b` serves everything.
A CRD (`widgets.stable.kpp.example`) and an aggregated APIService (`v1alpha1.wardle.kpp.example`,
backed by a tiny HTTPS server in the test process) exist on both (shared etcd). Each server has an
Envoy with the filter in front of it; Envoy talks TLS to the apiservers (CA verified, SNI/SAN
`kubernetes.default.svc`), passes the client's `Authorization: Bearer` through untouched, and fetches
discovery with the static token of `kpp-discovery`, a user with no RBAC binding of its own (the
built-in `system:discovery` role lets every authenticated user read /api and /apis).

How "the request reached b, with the loop-prevention header" is shown. The apiserver audit log does
not record request headers, so the evidence comes from three places that together leave no gap:
1. the client sends a unique `Audit-ID` header, which kube-apiserver adopts as the event's auditID:
   that ID appears in b's audit log (with the client's own user, `alice`) and never in a's;
2. Envoy a's access log, written after the filter ran, records the upstream cluster (`peer-b`) and
   the value of `x-kubernetes-peer-proxied` on the forwarded request (`true`);
3. the header's meaning is checked end to end: the same request *sent by the client* with
   `x-kubernetes-peer-proxied: true` is served by a itself (404: a does not serve batch/v1).
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid

import pytest

from kpp.testing import harness
from kpp.testing.cluster import CRD_GROUP, WARDLE_GROUP, WARDLE_VERSION, crd_manifest
from kpp.testing.envoyfront import K8S_PLUGIN
from k8senv import NOPEER, V2, discovery, from_access_log, gvrs, http

JOBS = "/apis/batch/v1/namespaces/default/jobs"
HPAS = "/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"
FLUNDERS = f"/apis/{WARDLE_GROUP}/{WARDLE_VERSION}/namespaces/default/flunders"
WIDGETS = f"/apis/{CRD_GROUP}/v1/namespaces/default/widgets"
# kubectl/client-go 1.36 discovery Accept.
BACKGROUND = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
KUBECTL_ACCEPT = V2 + ",application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"


def job(name: str) -> dict:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                                           "containers": [{"name": "c", "image": "busybox"}]}}}}


def hpa(name: str) -> dict:
    return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "d"},
                     "minReplicas": 1, "maxReplicas": 3}}


def audit_ids(server) -> dict[str, dict]:
    return {e["auditID"]: e for e in server.audit_events()}


def wait_audit(server, audit_id: str, timeout: float = 10.0) -> dict:
    return harness.wait_until(lambda: audit_ids(server).get(audit_id), timeout,
                              message=f"audit id {audit_id} not in {server.name}'s audit log")


def access_entry(front, audit_id: str) -> dict:
    return from_access_log(front.envoy, lambda: next((e for e in front.access_entries() if e["audit_id"] == audit_id),
                                                     None),
                           message=f"audit id {audit_id} not in Envoy {front.local.name}'s access log")


def test_servers_really_differ(env):
    a = discovery(env.server("a").url, env.tokens["kpp-admin"], ca=env.cp.ca)
    b = discovery(env.server("b").url, env.tokens["kpp-admin"], ca=env.cp.ca)
    assert ("batch", "v1", "jobs") in b - a
    assert ("autoscaling", "v2", "horizontalpodautoscalers") in b - a
    assert ("autoscaling", "v1", "horizontalpodautoscalers") in a & b
    for common in ((CRD_GROUP, "v1", "widgets"), (WARDLE_GROUP, WARDLE_VERSION, "flunders")):
        assert common in a & b, common
    assert env.direct("a", JOBS).status == 404


@pytest.mark.parametrize("path,obj", [(JOBS, job("j-route")), (HPAS, hpa("h-route"))],
                         ids=["whole-group-missing", "version-missing"])
def test_gvr_only_b_serves_sent_to_a_is_served_by_b_as_the_client(env, path, obj):
    name = obj["metadata"]["name"]
    r = env.via("a", path, method="POST", body=obj)
    assert r.status == 201, r
    aid = str(uuid.uuid4())
    r = env.via("a", f"{path}/{name}", headers={"Audit-ID": aid})
    assert r.status == 200, r
    assert r.json()["metadata"]["name"] == name
    event = wait_audit(env.server("b"), aid)
    assert event["user"]["username"] == "alice", "b authorized the client's own token"
    assert event["requestURI"] == f"{path}/{name}"
    assert event["responseStatus"]["code"] == 200
    assert aid not in audit_ids(env.server("a")), "a never saw the rerouted request"
    entry = access_entry(env.fronts["a"], aid)
    assert (entry["cluster"], entry["peer_proxied"], str(entry["code"])) == ("peer-b", "true", "200"), entry
    assert env.via("a", f"{path}/{name}", method="DELETE", body=BACKGROUND).status == 200


def test_client_sent_loop_marker_is_served_by_a_itself(env):
    aid = str(uuid.uuid4())
    r = env.via("a", JOBS, headers={"x-kubernetes-peer-proxied": "true", "Audit-ID": aid})
    assert r.status == 404, r
    assert wait_audit(env.server("a"), aid)["responseStatus"]["code"] == 404
    assert aid not in audit_ids(env.server("b"))
    assert access_entry(env.fronts["a"], aid)["cluster"] == "local"


def test_rbac_is_decided_by_the_serving_peer_for_the_original_user(env):
    aid = str(uuid.uuid4())
    r = env.via("a", "/apis/batch/v1/namespaces/kube-system/jobs", headers={"Audit-ID": aid})
    assert r.status == 403, r
    assert r.json()["reason"] == "Forbidden" and "alice" in r.json()["message"]
    ev = wait_audit(env.server("b"), aid)
    assert ev["user"]["username"] == "alice" and ev["responseStatus"]["code"] == 403
    r = env.via("a", JOBS, token="not-a-token")
    assert r.status == 401, r


def test_locally_served_requests_stay_local(env):
    for path in (CONFIGMAPS, "/apis/autoscaling/v1/namespaces/default/horizontalpodautoscalers", WIDGETS, FLUNDERS):
        aid = str(uuid.uuid4())
        r = env.via("a", path, headers={"Audit-ID": aid})
        assert r.status == 200, (path, r)
        assert wait_audit(env.server("a"), aid)["user"]["username"] == "alice"
        assert aid not in audit_ids(env.server("b")), path
        entry = access_entry(env.fronts["a"], aid)
        assert entry["cluster"] == "local" and entry["peer_proxied"] in (None, "-"), entry


def test_aggregated_api_through_envoy(env):
    before = len(env.cp.wardle.requests)
    r = env.via("a", FLUNDERS)
    assert r.status == 200, r
    assert r.json()["kind"] == "FlunderList" and r.headers.get("x-kpp-wardle") == "served"
    got = env.cp.wardle.requests[before:]
    assert any(q["path"].startswith(FLUNDERS) and q["user"] == "alice" for q in got), got


def test_merged_discovery_through_a_lists_b_resources_and_nopeer_gets_a_own_view(env):
    a_own = discovery(env.server("a").url, env.tokens["kpp-admin"], ca=env.cp.ca)
    b_own = discovery(env.server("b").url, env.tokens["kpp-admin"], ca=env.cp.ca)
    merged = discovery(env.fronts["a"].url, env.tokens["alice"], accept=KUBECTL_ACCEPT, ca=env.cp.ca)
    assert merged == a_own | b_own
    assert {("batch", "v1", "jobs"), ("autoscaling", "v2", "horizontalpodautoscalers")} <= merged
    r = env.via("a", "/apis", headers={"Accept": V2})
    assert r.headers["content-type"] == V2
    nopeer = discovery(env.fronts["a"].url, env.tokens["alice"], accept=NOPEER, ca=env.cp.ca)
    assert nopeer == a_own
    assert ("batch", "v1", "jobs") not in nopeer
    # The merged document is only ever a replacement for a's own 200: a client a does not accept
    # gets a's refusal, exactly as it would from a directly.
    for token in ("not-a-token", None):
        direct = http(env.server("a").url, "/apis", ca=env.cp.ca, token=token, headers={"Accept": V2})
        r = env.via("a", "/apis", token=token, headers={"Accept": V2})
        assert r.status == direct.status and r.status in (401, 403), (token, r.status, direct.status)
    # per-group-version discovery of a GV only b serves is forwarded like a resource request
    r = env.via("a", "/apis/batch/v1")
    assert r.status == 200 and any(x["name"] == "jobs" for x in r.json()["resources"]), r


def test_kubectl_through_a_envoy(env, tmp_path):
    kc_a = env.kubeconfig("a")
    out = env.kubectl(kc_a, "api-resources", "--api-group=batch", "-o", "name").stdout
    assert "jobs.batch" in out.split(), out
    direct = env.kubectl(env.kubeconfig("a", "kpp-admin", direct=True), "api-resources", "--api-group=batch",
                         "-o", "name", check=False)
    assert "jobs.batch" not in direct.stdout.split(), direct.stdout
    versions = env.kubectl(kc_a, "api-versions").stdout.split()
    assert "batch/v1" in versions and "autoscaling/v2" in versions
    env.kubectl(kc_a, "create", "-f", "-", input=json.dumps(job("j-kubectl")))
    got = json.loads(env.kubectl(kc_a, "get", "job", "j-kubectl", "-o", "json").stdout)
    assert got["metadata"]["name"] == "j-kubectl"
    names = env.kubectl(kc_a, "get", "jobs.v1.batch", "-o", "name").stdout.split()
    assert "job.batch/j-kubectl" in names
    env.kubectl(kc_a, "create", "-f", "-", input=json.dumps(hpa("h-kubectl")))
    got = json.loads(env.kubectl(kc_a, "get", "horizontalpodautoscalers.v2.autoscaling", "h-kubectl",
                                 "-o", "json").stdout)
    assert got["apiVersion"] == "autoscaling/v2"
    env.kubectl(kc_a, "delete", "job", "j-kubectl", "--cascade=background", "--wait=false")
    env.kubectl(kc_a, "delete", "horizontalpodautoscalers.v2.autoscaling", "h-kubectl", "--wait=false")
    # and the aggregated API + CRD, served locally by a
    assert "flunder" in env.kubectl(kc_a, "get", f"flunders.{WARDLE_GROUP}", "-o", "name").stdout
    env.kubectl(kc_a, "get", f"widgets.{CRD_GROUP}")


def test_watch_through_the_reroute_delivers_events(env):
    import http.client
    import subprocess
    front = env.fronts["a"]
    # The watch starts at the list's resourceVersion: every change after it is delivered however late
    # the watch is registered, so no wait is needed before the writes below.
    rv = env.direct("b", JOBS).json()["metadata"]["resourceVersion"]
    conn = http.client.HTTPSConnection("127.0.0.1", front.port, timeout=30, context=env.cp.ssl_context())
    conn.request("GET", JOBS + f"?watch=1&resourceVersion={rv}&allowWatchBookmarks=false&timeoutSeconds=30",
                 headers={"Authorization": f"Bearer {env.tokens['alice']}"})
    resp = conn.getresponse()
    assert resp.status == 200
    events = []

    def reader():
        try:
            for line in resp:
                if line.strip():
                    events.append(json.loads(line))
        except (OSError, ValueError, AttributeError):  # the connection is closed at the end of the test
            pass
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    # created on b directly: the event must come back through Envoy a
    assert env.direct("b", JOBS, method="POST", body=job("j-watch")).status == 201
    assert env.direct("b", JOBS + "/j-watch", method="DELETE", body=BACKGROUND).status == 200
    harness.wait_until(lambda: {(e["type"], e["object"].get("metadata", {}).get("name")) for e in events}
                       >= {("ADDED", "j-watch"), ("DELETED", "j-watch")}, 15,
                       message=f"watch events through the reroute: {events}")
    assert not [e for e in events if e["type"] == "ERROR"], events
    # shutdown() ends the reader's blocked read now (close() alone would wait for it, i.e. for the
    # watch's own 30 s timeout)
    conn.sock.shutdown(socket.SHUT_RDWR)
    t.join(5)
    assert not t.is_alive(), "the watch reader did not stop"
    conn.close()
    # kubectl's watch too. --watch-only prints only changes after kubectl's own list (or watch-list
    # snapshot), so the job is created once b's audit log shows kubectl's watch started (ResponseStarted
    # is written when the watch is registered).
    kc = env.kubeconfig("a")
    b = env.server("b")

    def kubectl_watches():
        return [e for e in b.audit_events() if e.get("verb") == "watch" and e["user"].get("username") == "alice"
                and e.get("objectRef", {}).get("resource") == "jobs" and e.get("userAgent", "").startswith("kubectl")]
    before = len(kubectl_watches())
    out = env.cp.workdir / "kubectl-watch-jobs.out"
    with open(out, "w") as f:
        proc = subprocess.Popen([env.cp.kubectl, f"--kubeconfig={kc}", "get", "jobs", "--watch-only",
                                 "--output-watch-events", "-o", "name", "--request-timeout=60s"],
                                stdout=f, stderr=subprocess.STDOUT, text=True)
    try:
        harness.wait_until(lambda: len(kubectl_watches()) > before, 30, 0.2,
                           message=f"kubectl's watch never reached b: {out.read_text()!r}")
        assert env.direct("b", JOBS, method="POST", body=job("j-kwatch")).status == 201
        line = harness.wait_until(lambda: next((l for l in out.read_text().splitlines() if l.strip()), None), 15,
                                  0.1, message=f"kubectl's watch printed nothing: {out.read_text()!r}")
        assert "j-kwatch" in line, line
    finally:
        proc.kill()
        proc.wait(10)
        env.direct("b", JOBS + "/j-kwatch", method="DELETE", body=BACKGROUND)


def test_crd_created_during_the_test_is_routable_within_one_refresh(env):
    plural = f"gadgets{uuid.uuid4().hex[:6]}"
    crd = crd_manifest(plural)
    gvr = (CRD_GROUP, "v1", plural)
    r = env.via("a", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", method="POST", body=crd,
                token=env.tokens["kpp-admin"])
    assert r.status == 201, r
    env.cp.wait_established(crd["metadata"]["name"], env.server("a"))
    established = time.monotonic()
    refresh = float(K8S_PLUGIN["refresh_interval"].rstrip("s"))
    fetch_timeout = float(K8S_PLUGIN["fetch_timeout"].rstrip("s"))

    def listed():
        r = env.via("a", "/apis", headers={"Accept": V2})
        return r.status == 200 and gvr in gvrs(r.json())
    harness.wait_until(listed, refresh + fetch_timeout + 2, 0.1,
                       message=f"{gvr} not in merged discovery within one refresh")
    took = time.monotonic() - established
    path = f"/apis/{CRD_GROUP}/v1/namespaces/default/{plural}"
    obj = {"apiVersion": f"{CRD_GROUP}/v1", "kind": crd["spec"]["names"]["kind"], "metadata": {"name": "g1"}}
    # a new CRD's storage may answer 429 "storage is (re)initializing" for a moment on either server
    r = harness.wait_until(lambda: (lambda r: r if r.status != 429 else None)(env.via("a", path, method="POST", body=obj)),
                           20, 0.2, message="CRD storage never became ready on a")
    assert r.status == 201, r
    assert harness.wait_until(lambda: env.via("b", path + "/g1").status == 200, 20, 0.2)
    kc = env.kubeconfig("a")
    assert env.kubectl(kc, "get", f"{plural}.{CRD_GROUP}", "-o", "name").stdout.strip().endswith("/g1")
    print(f"CRD listed in merged discovery {took:.2f}s after Established (refresh {refresh}s)")
