"""What a load balancer and the kubelet see on the health paths through the proxy (docs/deploy.md
"Load balancer"), and HTTP/1.0 on the client listener.

| state                                   | /healthz, /readyz          | /livez            | static pod probes        |
|-----------------------------------------|----------------------------|-------------------|--------------------------|
| before the first snapshot (can serve    | 503 from the filter        | the apiserver's   | ready: no; live: yes     |
|   locally, cannot route to peers yet)   |                            |                   |                          |
| serving                                 | the apiserver's (200)      | the apiserver's   | ready, live              |
| local apiserver down                    | 503 (Envoy: no upstream)   | 503               | ready: no; live: yes     |
| draining (after SIGTERM)                | 503 (Envoy health_check)   | the apiserver's,  | ready: no; live: yes     |
|                                         |                            | Connection: close |                          |
|                                         |                            | / HTTP/2 GOAWAY   |                          |

The probes are the manifest's own (kpp.testing.static_envoy.probes), sent to the listener they name; the drain is
the manifest's own entrypoint script. HTTP/1.0 without a Host header is served like HTTP/1.1 (HAProxy's
check speaks it); the control bootstrap without `accept_http_10` answers it 426, as Envoy did before.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import time

from kpp import render
from kpp.testing import harness, static_envoy
from kpp.testing.topology import COMMON, NEW_ONLY, Topology, request

HEALTH = ("/healthz", "/readyz", "/readyz?verbose", "/livez")


def raw(host: str, port: int, text: str, ctx: ssl.SSLContext | None = None, timeout: float = 10.0):
    """Sends `text` as is and reads to EOF (HTTP/1.0: the server closes): (status, headers, body)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        sock = ctx.wrap_socket(s, server_hostname=render.KUBEADM_SNI) if ctx else s
        sock.sendall(text.encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split()[1]), headers, body


def http10(port: int, path: str, headers: str = ""):
    return raw("127.0.0.1", port, f"GET {path} HTTP/1.0\r\n{headers}\r\n")


def answers(topo: Topology) -> dict[str, tuple[int, str]]:
    """path -> (status, who answered: the fake apiserver's name, "filter", or "envoy")."""
    out = {}
    for path in HEALTH:
        r = request(topo.url(path))
        who = r.headers.get("x-fake-apiserver") or ("filter" if r.headers.get("x-kube-peer-proxy-reply") else "envoy")
        out[path] = (r.status, who)
    return out


def probe_results(client_url: str, admin_url: str) -> dict[str, int]:
    """The manifest's probes (the path on the listener each names; the client listener here is plain HTTP)."""
    out = {}
    for name, (listener, _scheme, path) in static_envoy.probes().items():
        out[name] = request((admin_url if listener == "admin" else client_url) + path, timeout=5).status
    return out


def test_manifest_probes_are_the_load_balancers_view_and_liveness_survives_a_drain():
    p = static_envoy.probes()
    assert p["readinessProbe"] == ("client", "HTTPS", "/readyz")
    assert p["livenessProbe"][0] == "admin" and p["livenessProbe"][2] != "/ready", "a draining Envoy is alive"
    assert p["startupProbe"] == ("admin", "HTTP", "/ready")
    unready, drain = static_envoy.drain_seconds()
    grace = static_envoy.pod()["spec"]["terminationGracePeriodSeconds"]
    assert grace >= unready + drain + 5, "the kubelet's SIGKILL must not cut the drain short"


def test_health_paths_before_the_first_snapshot_while_serving_and_with_the_local_apiserver_down(topo):
    # The peers' discovery hangs: the first round (and so the first snapshot) cannot finish for 10 s.
    for inst in (topo.b, topo.c):
        assert request(f"{inst.url}/__fake/fault", "POST", body=b'{"discovery":"timeout"}').status == 200
    topo.start(plugin={"fetch_timeout": "10s", "refresh_interval": "1s"}, wait_snapshot=False)
    admin = topo.envoy.admin_url
    assert topo.envoy.snapshot_generation() == 0
    before = answers(topo)
    assert before == {"/healthz": (503, "filter"), "/readyz": (503, "filter"), "/readyz?verbose": (503, "filter"),
                      "/livez": (200, "a")}, before
    # Without the filter's answer the load balancer would get the local apiserver's 200 (Envoy forwards it).
    assert request(f"{topo.a.url}/readyz").status == 200 and request(f"{topo.a.url}/healthz").status == 200
    body = request(topo.url("/readyz?verbose")).body.decode()
    assert "no discovery snapshot yet" in body and body.endswith("readyz check failed\n"), body
    # It serves locally all the while: only routing to the peers waits for the snapshot.
    assert request(topo.url(COMMON)).headers.get("x-fake-apiserver") == "a"
    status, headers, _ = http10(topo.port, "/healthz")
    assert (status, headers.get("x-kube-peer-proxy-reply")) == (503, "true")
    assert probe_results(topo.url(""), admin) == {"startupProbe": 200, "livenessProbe": 200, "readinessProbe": 503}
    assert topo.envoy.snapshot_generation() == 0, "the window without a snapshot ended during the test"

    for inst in (topo.b, topo.c):
        request(f"{inst.url}/__fake/fault", "POST", body=b'{"discovery":"ok"}')
    harness.wait_until(lambda: request(topo.url(NEW_ONLY)).headers.get("x-fake-apiserver") in ("b", "c"), 30,
                       message="never routed to the peers")
    serving = answers(topo)
    assert serving == {p: (200, "a") for p in HEALTH}, serving
    assert http10(topo.port, "/healthz")[0] == 200
    assert probe_results(topo.url(""), admin) == {"startupProbe": 200, "livenessProbe": 200, "readinessProbe": 200}

    topo.a.stop()
    down = answers(topo)
    assert all(status == 503 for status, _ in down.values()), down
    assert probe_results(topo.url(""), admin) == {"startupProbe": 200, "livenessProbe": 200, "readinessProbe": 503}


def test_a_peer_down_at_start_does_not_keep_the_node_unready(topo):
    """Readiness waits for the first discovery round, not for every peer: a dead peer must not keep every
    restarted node out of the load balancer. What only that peer serves gets 503 + Retry-After, never 404."""
    topo.c.stop()
    topo.start()
    assert answers(topo) == {p: (200, "a") for p in HEALTH}
    r = request(topo.url(NEW_ONLY))
    assert r.status == 200 and r.headers.get("x-fake-apiserver") == "b", r


def test_http10_without_host_is_served_and_the_control_without_accept_http_10_answers_426(topo, envoys):
    topo.start()
    status, headers, body = http10(topo.port, "/healthz")
    assert (status, headers.get("x-fake-apiserver"), body) == (200, "a", b"ok")
    status, headers, body = http10(topo.port, NEW_ONLY)
    assert status == 200 and headers.get("x-fake-apiserver") in ("b", "c"), (status, headers)
    # The host the upstream sees: Envoy's default for HTTP/1.0 without Host.
    served = topo.b if headers["x-fake-apiserver"] == "b" else topo.c
    last = [q for q in served.requests() if q["path"] == NEW_ONLY][-1]
    assert last["headers"].get("host") == render.HTTP10_DEFAULT_HOST
    assert last["headers"].get("x-kubernetes-peer-proxied") == "true"
    # Control: the same bootstrap without accept_http_10 is Envoy's default behaviour.
    yaml, port, admin = topo.bootstrap()
    b = json.loads(yaml)
    del b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_protocol_options"]
    envoys.start(json.dumps(b), "no-http10", admin)
    assert http10(port, "/healthz")[0] == 426
    assert request(f"http://127.0.0.1:{port}/healthz").status == 200


def test_draining_turns_the_health_paths_503_first_then_stops_accepting_then_exits(topo, envoys):
    """The manifest's entrypoint on SIGTERM, step by step."""
    yaml, port, admin = topo.bootstrap()
    envoy = static_envoy.StaticPodEnvoy(yaml, "drain", admin, workdir=envoys.base_dir / "envoy-drain",
                                        component_log_level="wasm:info")
    envoys.started.append(envoy)
    envoy.start()
    envoy.wait_snapshot(20)
    topo.port = port
    assert answers(topo) == {p: (200, "a") for p in HEALTH}
    unready, drain = static_envoy.drain_seconds()
    t0 = envoy.terminate()
    harness.wait_until(lambda: request(topo.url("/readyz")).status == 503, 2, 0.02,
                       message="/readyz still 200 after SIGTERM")
    t_unready = time.monotonic() - t0
    draining = answers(topo)
    assert {p: s for p, (s, _) in draining.items()} == {"/healthz": 503, "/readyz": 503, "/readyz?verbose": 503,
                                                          "/livez": 200}, draining
    r = request(topo.url(COMMON))
    assert (r.status, r.headers.get("x-fake-apiserver"), r.headers.get("connection")) == (200, "a", "close"), \
        "while unready it still serves, and closes each connection after its answer"
    # HTTP/2: a GOAWAY after the answer, so the next request opens a new connection.
    two = subprocess.run(["curl", "-sv", "--http2-prior-knowledge", topo.url(COMMON), topo.url(COMMON),
                          "-o", "/dev/null", "-o", "/dev/null"], capture_output=True, text=True, timeout=20)
    assert "GOAWAY" in two.stderr and "Re-using existing connection" not in two.stderr, two.stderr
    assert http10(port, "/healthz")[0] == 503
    assert probe_results(topo.url(""), envoy.admin_url) == {"startupProbe": 503, "livenessProbe": 200,
                                                           "readinessProbe": 503}

    def refused():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return False
        except OSError:
            return True

    harness.wait_until(refused, unready + 5, 0.05, message="still accepting long after KPP_UNREADY_SECONDS")
    t_closed = time.monotonic() - t0
    rc = envoy.wait_exit(drain + 10)
    t_exit = envoy.exited_at - t0
    assert rc == 0, envoy.log_tail(50)
    assert t_unready < 1.0
    assert unready - 0.5 <= t_closed <= unready + 2, (t_closed, unready)
    # Nothing in flight here: Envoy stops as soon as the requests are done, well before KPP_DRAIN_SECONDS.
    assert t_exit - t_closed < 2.0, (t_closed, t_exit)
    log = envoy.log_text()
    assert "SIGTERM: failing health checks" in log and "no longer accepting connections" in log, log[-2000:]
    print(f"drain: unready after {t_unready * 1000:.0f} ms, listener closed after {t_closed:.2f} s, "
          f"exit after {t_exit:.2f} s")


def test_http10_in_the_kubeadm_profile_strips_identity_and_routes_like_http11(tmp_path, envoys):
    """HTTP/1.0 without Host, with forged identity, routing and address headers: the certificate's identity
    is asserted (never the client's headers), the peer-only resource is rerouted to B's peer listener."""
    from test_pki_reload import two_nodes  # the kubeadm two-node topology with TLS fake apiservers

    pki, fakes, a, b = two_nodes(tmp_path, envoys, with_reload=False)
    try:
        alice = pki.mint("alice", pki.ca, orgs=("devs",))
        # A's first round may have run before B's peer listener was up: wait until A has learned B.
        harness.wait_until(lambda: a.get(NEW_ONLY, alice)[1].get("x-fake-apiserver") == "b", 20,
                           message="A never routed to B")
        forged = ("X-Remote-User: system:admin\r\nX-Remote-Group: system:masters\r\n"
                  "x-remote-extra-scopes: all\r\nX-Forwarded-For: 203.0.113.7\r\n"
                  f"{render.ROUTE_HEADER}: local\r\n")
        for who, cert in (("alice", alice), ("anonymous", None)):
            fakes.instances["b"].clear_requests()
            status, headers, body = raw(a.ip, a.client_port, f"GET {NEW_ONLY} HTTP/1.0\r\n{forged}\r\n",
                                        a.client_ctx(cert))
            assert (status, headers.get("x-fake-apiserver")) == (200, "b"), (who, status, headers, body[:300])
            (seen,) = [q["headers"] for q in fakes.instances["b"].requests() if q["path"] == NEW_ONLY]
            assert seen.get("x-kubernetes-peer-proxied") == "true"
            assert seen.get("x-remote-user") == ("alice" if cert else None), (who, seen)
            assert seen.get("x-remote-group") == ("devs" if cert else None), (who, seen)
            assert not [k for k in seen if k.startswith("x-remote-extra-")], seen
            assert "203.0.113.7" not in seen.get("x-forwarded-for", ""), seen
        status, headers, body = raw(a.ip, a.client_port, "GET /healthz HTTP/1.0\r\n\r\n", a.client_ctx())
        assert (status, headers.get("x-fake-apiserver"), body) == (200, "a", b"ok")
    finally:
        fakes.stop_all()
