"""kubectl v1.36.3, a real client, through the old server's Envoy for resources only new servers have."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from kpp.testing import harness
from kpp.testing.topology import Topology


@pytest.fixture
def kubectl(topo, tmp_path):
    binary = harness.tool("kubectl")
    version = subprocess.run([str(binary), "version", "--client"], capture_output=True, text=True).stdout
    assert "v1.36.3" in version, version
    topo.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(textwrap.dedent(f"""\
        apiVersion: v1
        kind: Config
        clusters: [{{name: a, cluster: {{server: "http://127.0.0.1:{topo.port}"}}}}]
        users: [{{name: anonymous, user: {{}}}}]
        contexts: [{{name: a, context: {{cluster: a, user: anonymous, namespace: default}}}}]
        current-context: a
        """))

    # A fresh cache dir per test: kubectl must discover through the proxy, not from disk.
    argv = [str(binary), "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache")]

    def run(*args, check=True, timeout=60):
        cmd = [*argv, *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        return r

    run.tmp = tmp_path
    run.argv = argv
    return run


CLAIM = """\
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: demo-claim
spec: {}
"""


def test_kubectl_api_resources_sees_merged_discovery(kubectl):
    out = kubectl("api-resources", "--api-group=resource.k8s.io", "-o", "wide").stdout
    assert "resource.k8s.io/v1 " in out and "resourceclaims" in out, out
    versions = kubectl("api-versions").stdout.split()
    assert "resource.k8s.io/v1" in versions and "resource.k8s.io/v1alpha3" in versions, versions
    assert "lifecycle.k8s.io/v1alpha1" in versions, "a group only the new servers have"


def test_kubectl_create_get_watch_delete_a_new_only_resource(kubectl, topo):
    manifest = kubectl.tmp / "claim.yaml"
    manifest.write_text(CLAIM)
    kubectl("create", "-f", str(manifest), "--validate=false")
    out = kubectl("get", "resourceclaims.v1.resource.k8s.io", "-o", "name").stdout
    assert "resourceclaim.resource.k8s.io/demo-claim" in out, out

    # A watch through the reroute lists the existing object, then streams one created meanwhile.
    watch = subprocess.Popen(
        [*kubectl.argv, "get", "resourceclaims.v1.resource.k8s.io", "--watch", "--request-timeout=6s", "-o", "name"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    harness.wait_until(lambda: any("watch=true" in q["path"] for i in (topo.b, topo.c) for q in topo.fake_requests(i)),
                       10, message="the watch never reached a new server")
    manifest.write_text(CLAIM.replace("demo-claim", "second-claim"))
    kubectl("create", "-f", str(manifest), "--validate=false")
    out, err = watch.communicate(timeout=30)
    assert "resourceclaim.resource.k8s.io/demo-claim" in out, (out, err)
    assert "resourceclaim.resource.k8s.io/second-claim" in out, (out, err)
    kubectl("delete", "resourceclaims.v1.resource.k8s.io", "second-claim")

    # Every reroute landed on a new server and was marked as proxied.
    for inst in (topo.b, topo.c):
        for q in topo.fake_requests(inst):
            if "/resource.k8s.io/v1/" in q["path"]:
                assert q["headers"].get("x-kubernetes-peer-proxied") == "true", q
    kubectl("delete", "resourceclaims.v1.resource.k8s.io", "demo-claim")
    out = kubectl("get", "resourceclaims.v1.resource.k8s.io", "-o", "name").stdout
    assert "demo-claim" not in out
    assert topo.counter("kube_peer_proxy_rerouted_request_total") >= 4


def test_kubectl_get_raw_apis_gets_the_merged_legacy_list(kubectl):
    import json
    doc = json.loads(kubectl("get", "--raw", "/apis").stdout)
    # `get --raw` asks for plain JSON: the legacy APIGroupList, merged across servers (upstream
    # would answer with the local server's own list).
    assert doc["kind"] == "APIGroupList"
    assert "lifecycle.k8s.io" in {g["name"] for g in doc["groups"]}
