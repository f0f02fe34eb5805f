"""Processes, ports, waiting and HTTP: the few primitives every harness of the test kit shares
(kpp.testing.harness, cluster, kubeadm_node, the simulations, bench/envoy_bench.py).

Loopback only: every request here goes through an opener without proxies, so an HTTP(S)_PROXY in the
environment never sees a test's traffic.
"""
from __future__ import annotations

import ctypes
import functools
import json
import queue
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

# ---- processes ------------------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
# Resolved before any fork: between fork and exec the child should only call it.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def die_with_parent(sig: int):
    """A preexec_fn: the kernel sends the child `sig` when its parent dies without stopping it
    (SIGKILL, a CI timeout), instead of an orphan keeping the ports. The signal fires when the
    *thread* that started the child exits, so start children from a long-lived thread."""
    return functools.partial(_prctl, _PR_SET_PDEATHSIG, sig)


def read_line(stream, timeout: float, what: str) -> str:
    """One line from a child's pipe, bounded: a child that hangs before writing it raises TimeoutError
    instead of blocking the caller. The reader is a daemon thread, so it may outlive a timeout until
    the caller kills the child (which closes the pipe)."""
    lines: queue.Queue = queue.Queue(maxsize=1)
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"{what}: no line within {timeout} s") from None


def kill_and_reap(p: subprocess.Popen, timeout: float = 10.0) -> bool:
    """SIGKILL a child that may still run and reap it, bounded: False when it is still there after
    `timeout` s (stuck in the kernel), so cleanup that calls this in a `finally` goes on."""
    if p.poll() is None:
        p.kill()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
    return True


# ---- ports and waiting ----------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (racy, but fine on a test box)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout: float, interval: float = 0.1, message: str = "", *,
               retry_errors: bool = False, error: type[Exception] = AssertionError):
    """Poll predicate until it returns a truthy value, which is returned; bounded by timeout seconds.

    Past the deadline raises `error(message)`. With retry_errors, an exception from predicate counts
    as "not yet" and the last one is named in the message; without, it propagates at once."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except Exception as e:  # noqa: BLE001 - re-raised unless the caller retries on errors
            if not retry_errors:
                raise
            last = e
        if time.monotonic() >= deadline:
            text = message or f"condition not met within {timeout}s"
            raise error(f"{text} (last error: {last!r})" if retry_errors else text)
        time.sleep(interval)


def wait_for(pred, timeout: float, what: str, interval: float = 0.25):
    """wait_until for things that fail until they are up (connection refused, 503): errors are
    retried, and the TimeoutError names `what` and the last error."""
    return wait_until(pred, timeout, interval, f"{what} not within {timeout}s", retry_errors=True,
                      error=TimeoutError)


# ---- TLS ------------------------------------------------------------------------------------------

def client_tls(ca: Path | str, cert: Path | str | None = None, key: Path | str | None = None, *,
               check_hostname: bool = True) -> ssl.SSLContext:
    """A client's context: the server is verified against ca; cert/key, if given, are presented."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = check_hostname
    if cert:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def server_tls(cert: Path | str, key: Path | str, client_cas=(), client_cert: ssl.VerifyMode = ssl.CERT_NONE
               ) -> ssl.SSLContext:
    """A server's context presenting cert/key; client certificates verified against client_cas when
    client_cert asks for them (CERT_OPTIONAL or CERT_REQUIRED)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    for ca in client_cas:
        ctx.load_verify_locations(str(ca))
    ctx.verify_mode = client_cert
    return ctx


# ---- HTTP -----------------------------------------------------------------------------------------

OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Response:
    """status, lower-cased headers, body bytes."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def __repr__(self):
        by = served_by(self)
        return f"<{self.status}{' ' + by if by else ''} {self.body[:300]!r}>"


def _tls_opener(ctx: ssl.SSLContext):
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))


def request(url: str, method: str = "GET", headers: dict | None = None, body: bytes | None = None,
            timeout: float = 10.0, context: ssl.SSLContext | None = None) -> Response:
    """One request; an HTTP error status is a Response too. Connection failures raise OSError."""
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=body)
    opener = _tls_opener(context) if context is not None else OPENER
    try:
        with opener.open(req, timeout=timeout) as r:
            return Response(r.status, {k.lower(): v for k, v in r.headers.items()}, r.read())
    except urllib.error.HTTPError as e:
        return Response(e.code, {k.lower(): v for k, v in e.headers.items()}, e.read())


def api_request(base: str, path: str, method: str = "GET", body=None, token: str | None = None,
                headers: dict | None = None, ca=None, timeout: float = 20.0) -> Response:
    """A request to an apiserver or an Envoy in front of one: `body` is JSON-encoded, the bearer token is the
    caller's (never anything a proxy adds), https is verified against `ca`."""
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {token}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    return request(base + path, method=method, headers=h, body=data, timeout=timeout,
                   context=client_tls(ca) if base.startswith("https://") else None)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body text) of a GET (Envoy's admin endpoints)."""
    r = request(url, timeout=timeout)
    return r.status, r.text


def status(url: str, headers: dict | None = None, timeout: float = 2.0) -> int:
    """The status of a GET; 0 when no answer came (refused, reset, timed out)."""
    try:
        return request(url, headers=headers, timeout=timeout).status
    except OSError:
        return 0


def get_json(url: str, timeout: float = 2.0):
    """A GET's JSON body (Envoy's /clusters?format=json, etcd's /health); HTTP errors raise."""
    with OPENER.open(url, timeout=timeout) as r:
        return json.load(r)


def served_by(resp) -> str:
    """Which fake apiserver answered (its x-fake-apiserver header); "" for anything else."""
    return resp.headers.get("x-fake-apiserver", "")
