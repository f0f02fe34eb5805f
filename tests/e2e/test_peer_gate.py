"""The peer gate's 401 is one of the filter's own replies and says so, as the others do.

Two kubeadm-profile nodes (kpp.render.render_kubeadm, real Envoy and the real .wasm; the topology of
test_pki_reload.two_nodes): B's peer listener accepts only front-proxy-CA certificates, and its wasm
gate (src/wasm/peer_gate.rs) then refuses any subject CN that is not an allowed front-proxy name, as
kube-apiserver's --requestheader-allowed-names does, with a 401 `Status`. That 401 carries
`x-kube-peer-proxy-reply: true` like the filter's other own replies (src/request/reply.rs LocalReply),
so a client or an operator can tell it from an apiserver's 401. The control: the real front-proxy
client certificate on the same listener is answered by the apiserver, without the header.
(tests/k8s/test_kubeadm.py checks the gate against the real kube-apiserver's own answers.)
"""

from __future__ import annotations

import http.client
import json
import uuid

from kpp.render import FILTER_REPLY_HEADER
from test_pki_reload import two_nodes  # the kubeadm two-node topology with TLS fake apiservers

REFUSED = "wasmcustom.kube_peer_proxy_peer_listener_refused_total"


def via_peer_listener(node, cert, path="/api/v1/namespaces/default/configmaps"):
    """One GET on the node's peer listener with `cert`, tagged with an Audit-ID to find it upstream."""
    aid = str(uuid.uuid4())
    conn = http.client.HTTPSConnection(node.ip, node.peer_port, context=node.client_ctx(cert), timeout=10)
    try:
        conn.request("GET", path, headers={"Audit-ID": aid, "X-Remote-User": "system:admin"})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read(), aid
    finally:
        conn.close()


def test_the_peer_gates_401_is_marked_as_the_filters_own_reply(tmp_path, envoys):
    pki, fakes, a, b = two_nodes(tmp_path, envoys)
    try:
        refused_before = b.envoy.stats().get(REFUSED, 0)
        # A front-proxy-CA certificate (TLS passes) whose CN is not an allowed name: the gate answers.
        other = pki.mint("kpp-not-a-proxy", pki.fp_ca)
        status, headers, body, aid = via_peer_listener(b, other)
        print(f"CN=kpp-not-a-proxy on B's peer listener: {status} {headers} {body[:120]!r}")
        assert status == 401, (status, body)
        assert headers.get(FILTER_REPLY_HEADER) == "true", headers
        assert headers.get("content-type") == "application/json", headers
        doc = json.loads(body)
        assert (doc["kind"], doc["reason"], doc["code"]) == ("Status", "Unauthorized", 401), doc
        assert "x-fake-apiserver" not in headers, "the apiserver answered, not the gate"
        assert not [q for q in b.fake.requests() if q["headers"].get("audit-id") == aid], "it reached b"
        assert b.envoy.stats().get(REFUSED, 0) == refused_before + 1
        # The control: the real front-proxy client on the same listener reaches b, whose answer is not
        # marked (the header is the filter's, not something every answer on this listener carries).
        status, headers, body, aid = via_peer_listener(b, pki.front_proxy_client())
        print(f"CN=front-proxy-client on B's peer listener: {status}, answered by {headers.get('x-fake-apiserver')}")
        assert (status, headers.get("x-fake-apiserver")) == (200, "b"), (status, headers, body[:200])
        assert FILTER_REPLY_HEADER not in headers, headers
        assert [q for q in b.fake.requests() if q["headers"].get("audit-id") == aid]
    finally:
        for n in (a, b):
            n.stop()
        fakes.stop_all()
