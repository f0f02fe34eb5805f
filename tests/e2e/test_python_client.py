"""The official Python `kubernetes` client through the old server's Envoy: dynamic-client discovery
sees the merged resources, and list/create/watch of a resource only the new servers serve work."""

from __future__ import annotations

import threading
import time

import pytest

from kpp.testing.topology import Topology



def test_dynamic_client_discovers_lists_creates_and_watches_a_new_only_resource(topo):
    # Imported here so a missing package fails this test loudly instead of skipping it.
    from kubernetes import client, dynamic

    topo.start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{topo.port}"
    api = dynamic.DynamicClient(client.ApiClient(cfg))

    claims = api.resources.get(api_version="resource.k8s.io/v1", kind="ResourceClaim")
    assert claims.namespaced and claims.name == "resourceclaims"
    # The old-only version is still there too: the merged view is a union.
    assert api.resources.get(api_version="resource.k8s.io/v1alpha3", kind="ResourceClaim")

    events = []

    def watch():
        for e in claims.watch(namespace="default", timeout=5):
            events.append((e["type"], e["object"].metadata.name))

    w = threading.Thread(target=watch)
    w.start()
    time.sleep(1)
    claims.create(namespace="default", body={"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                                             "metadata": {"name": "py-claim"}, "spec": {}})
    listed = claims.get(namespace="default")
    assert [i.metadata.name for i in listed.items] == ["py-claim"]
    w.join(timeout=20)
    assert ("ADDED", "py-claim") in events, events
    served = {q["path"] for inst in (topo.b, topo.c) for q in topo.fake_requests(inst)}
    assert any("resourceclaims" in p for p in served), "the client's requests never reached a new server"
