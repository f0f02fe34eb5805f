"""Streams and bodies through a reroute : real Envoy with the filter in front of `a` (old);
`b` and `c` (new) serve `lifecycle.k8s.io/v1alpha1 evictionrequests`, which `a` does not, so every request
below is forwarded by a's Envoy to b or c.

* a watch that lasts ≥ 60 s delivers every event (compared with the store's event log), even while the other
  new server is restarted under it;
* a WebSocket upgrade (like `exec`) to the rerouted resource works end to end — b and c get a synthetic
  `evictionrequests/exec` subresource (`fake_apiserver.with_subresource`; the fake answers WebSocket upgrades of
  exec-style subresources with an echo);
* a 10 MB request body and a 50 MB list response pass intact (SHA-256 of every payload).

The watch runs in the background for the whole module, so the other tests run while it is open; the watch
test comes last and waits for it to end.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
import time
from types import SimpleNamespace

import pytest

from kpp.testing import harness
from kpp.testing.fake_apiserver import with_subresource
from kpp.testing.fake_apiserver.websocket import BINARY, CLOSE, PING, PONG, TEXT, WebSocket
from kpp.testing.topology import Topology, request

GROUP_VERSION = "/apis/lifecycle.k8s.io/v1alpha1"
RESOURCE = "evictionrequests"
WATCH_SECONDS = 61
WATCH_NS = "watched"


def collection(ns: str) -> str:
    return f"{GROUP_VERSION}/namespaces/{ns}/{RESOURCE}"


def sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


class _Registry:
    """A module-lived stand-in for the `envoys` fixture (which lives for one test)."""

    def __init__(self, workdir):
        self.workdir, self.started = workdir, []

    def start(self, yaml, name, admin_port, **kwargs):
        kwargs.setdefault("workdir", self.workdir / f"envoy-{name}")
        envoy = harness.Envoy(yaml, name, admin_port, **kwargs)
        self.started.append(envoy)
        return envoy.start()


class LongWatch:
    """A watch through a's Envoy plus a writer that changes objects in the watched namespace meanwhile."""

    def __init__(self, topo: Topology):
        self.topo = topo
        self.events: list[tuple[str, str, int]] = []
        self.served_by = ""
        self.status = 0
        self.clean_end = False
        self.error = ""
        self.rv0 = 0
        self.started = self.ended = 0.0
        self.writes = 0
        self.write_failures: list = []
        self.churned = ""
        self._threads = []

    def _watch(self):
        self.rv0 = self.topo.cluster.store.resource_version
        conn = http.client.HTTPConnection("127.0.0.1", self.topo.port, timeout=WATCH_SECONDS + 30)
        self.started = time.monotonic()
        try:
            conn.request("GET", f"{collection(WATCH_NS)}?watch=1&resourceVersion={self.rv0}"
                                f"&timeoutSeconds={WATCH_SECONDS}")
            resp = conn.getresponse()
            self.status, self.served_by = resp.status, resp.getheader("x-fake-apiserver", "")
            while True:
                line = resp.readline()
                if not line:
                    break
                event = json.loads(line)
                meta = event["object"]["metadata"]
                self.events.append((event["type"], meta["name"], int(meta["resourceVersion"])))
            self.clean_end = resp.isclosed() or resp.read() == b""
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.error = repr(e)
        finally:
            self.ended = time.monotonic()
            conn.close()

    def _write(self):
        base = collection(WATCH_NS)
        deadline = self.started + WATCH_SECONDS - 4
        i = 0

        def send(method, path, body=None, headers=None):
            for _ in range(20):  # ride out the other server's restart (503 with Retry-After)
                r = request(self.topo.url(path), method, headers={"Content-Type": "application/json", **(headers or {})},
                            body=json.dumps(body).encode() if body is not None else None)
                if r.status != 503:
                    return r
                self.write_failures.append((method, path, r.status))
                time.sleep(0.1)
            return r

        while time.monotonic() < deadline:
            send("POST", base, {"metadata": {"name": f"w{i}"}, "spec": {"i": i}})
            if i >= 1:
                send("PATCH", f"{base}/w{i - 1}", {"spec": {"patched": True}},
                     {"Content-Type": "application/merge-patch+json"})
            if i >= 2:
                send("DELETE", f"{base}/w{i - 2}")
            self.writes += 1
            i += 1
            time.sleep(0.1)

    def _churn(self):
        """30 s in: stop the new server that is *not* serving the watch for 2 s, then start it again."""
        time.sleep(30)
        other = "c" if self.served_by == "b" else "b"
        inst = self.topo.cluster.instances[other]
        inst.stop()
        time.sleep(2)
        self.topo.cluster.start(other, inst.port, apiset=inst.apiset)
        self.churned = other

    def start(self) -> "LongWatch":
        watch = threading.Thread(target=self._watch, daemon=True)
        watch.start()
        harness.wait_until(lambda: self.served_by or self.error, 10, message="the watch did not start")
        for target in (self._write, self._churn):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        self._threads.insert(0, watch)
        return self

    def join(self):
        for t in self._threads:
            t.join(WATCH_SECONDS + 40)
        assert not any(t.is_alive() for t in self._threads), "watch, writer or churn thread hung"


@pytest.fixture(scope="module")
def streams(tmp_path_factory, request):
    failed_before = request.session.testsfailed
    registry = _Registry(tmp_path_factory.mktemp("streams"))
    topo = Topology(registry)
    exec_set = with_subresource("new", "lifecycle.k8s.io", "v1alpha1", RESOURCE, "exec", ["create", "get"])
    topo.b = topo.cluster.restart("b", apiset=exec_set)
    topo.c = topo.cluster.restart("c", apiset=exec_set)
    try:
        topo.start()
        watch = LongWatch(topo).start()
        yield SimpleNamespace(topo=topo, watch=watch)
        watch.join()
    finally:
        for envoy in registry.started:
            envoy.stop()
        topo.close()
        if request.session.testsfailed > failed_before:
            for envoy in registry.started:
                print(f"\n===== envoy {envoy.name} ({envoy.log_path}), last 300 lines =====")
                print(envoy.log_tail(300), end="")


def test_websocket_exec_to_a_rerouted_resource_works_end_to_end(streams):
    topo = streams.topo
    assert topo.send("POST", collection("default"), {"metadata": {"name": "shell"}}).status == 201
    path = f"{collection('default')}/shell/exec?command=sh&stdin=true&stdout=true"
    ws = WebSocket.connect("127.0.0.1", topo.port, path, ["v5.channel.k8s.io", "v4.channel.k8s.io"])
    try:
        assert ws.status == 101, (ws.status, ws.headers)
        assert ws.headers["sec-websocket-protocol"] == "v5.channel.k8s.io"
        served = ws.headers.get("x-fake-apiserver")
        assert served in {"b", "c"}, ws.headers
        assert ws.headers.get("x-fake-peer-proxied") == "true", "the peer must see x-kubernetes-peer-proxied"
        assert ws.recv() == (TEXT, f"{served} exec shell".encode())
        for size in (1, 1000, 70_000, 1 << 20):
            payload = os.urandom(size)
            ws.send(payload)
            opcode, echoed = ws.recv()
            assert opcode == BINARY and sha(echoed) == sha(payload), size
        ws.send("text frame")
        assert ws.recv() == (TEXT, b"text frame")
        ws.send(b"ping!", PING)
        assert ws.recv() == (PONG, b"ping!")
        ws.send((1000).to_bytes(2, "big"), CLOSE)
        assert ws.recv() == (CLOSE, (1000).to_bytes(2, "big"))
    finally:
        ws.sock.close()
    assert not any(q["path"].startswith(path.split("?")[0]) for q in topo.fake_requests(topo.a))


def test_10mb_request_body_through_a_reroute(streams):
    topo = streams.topo
    blob = os.urandom(5 * 1024 * 1024).hex()  # 10 MiB of JSON string
    body = json.dumps({"metadata": {"name": "big-body"}, "spec": {"blob": blob}}).encode()
    assert len(body) > 10 * 1024 * 1024
    r = request(topo.url(collection("bodies")), "POST", headers={"Content-Type": "application/json"}, body=body,
                timeout=60)
    assert r.status == 201 and r.headers.get("x-fake-apiserver") in {"b", "c"}, r
    assert sha(r.json()["spec"]["blob"]) == sha(blob)
    stored = topo.cluster.store.get(("lifecycle.k8s.io", RESOURCE, "bodies", "big-body"))
    assert sha(stored["spec"]["blob"]) == sha(blob), "the peer stored a different body"
    r = request(topo.url(f"{collection('bodies')}/big-body"), timeout=60)
    assert r.status == 200 and sha(r.json()["spec"]["blob"]) == sha(blob)


def test_50mb_list_response_through_a_reroute(streams):
    topo = streams.topo
    expected = {}
    for i in range(50):
        blob = os.urandom(512 * 1024).hex()  # 1 MiB each
        expected[f"obj-{i:02d}"] = sha(blob)
        r = request(f"{topo.b.url}{collection('big')}", "POST", headers={"Content-Type": "application/json"},
                    body=json.dumps({"metadata": {"name": f"obj-{i:02d}"}, "spec": {"blob": blob}}).encode())
        assert r.status == 201, r
    r = request(topo.url(collection("big")), timeout=120)
    assert r.status == 200 and r.headers.get("x-fake-apiserver") in {"b", "c"}, r
    assert len(r.body) >= 50 * 1024 * 1024, len(r.body)
    assert int(r.headers["content-length"]) == len(r.body)
    items = r.json()["items"]
    assert {i["metadata"]["name"]: sha(i["spec"]["blob"]) for i in items} == expected


def test_watch_through_a_reroute_lasting_60s_delivers_every_event(streams):
    topo, watch = streams.topo, streams.watch
    watch.join()
    assert not watch.error, watch.error
    assert watch.status == 200 and watch.served_by in {"b", "c"}
    assert watch.ended - watch.started >= 60, f"the watch lasted {watch.ended - watch.started:.1f} s"
    assert watch.clean_end, "the watch did not end with the server's terminating chunk"
    assert watch.churned and watch.churned != watch.served_by
    key_prefix = ("lifecycle.k8s.io", RESOURCE, WATCH_NS)
    with topo.cluster.store.cond:
        log = topo.cluster.store.events_after(watch.rv0)
    expected = [(e.type, e.key[3], e.rv) for e in log if e.key[:3] == key_prefix]
    last = watch.events[-1][2] if watch.events else 0
    expected = [e for e in expected if e[2] <= last]
    assert watch.writes > 300, watch.writes
    assert len(watch.events) > 3 * 300
    assert watch.events == expected, (len(watch.events), len(expected))
    # Every write the writer made before the end is in the stream (no event after the last one got lost).
    all_writes = [(e.type, e.key[3], e.rv) for e in log if e.key[:3] == key_prefix]
    assert all_writes == expected, "events after the last delivered one"
    print(f"watch through {watch.served_by}: {watch.ended - watch.started:.1f} s, {len(watch.events)} events, "
          f"{watch.writes} write rounds, {len(watch.write_failures)} writes retried while {watch.churned} restarted")
