"""Clients behind a load balancer that retry the way client-go does (stdlib only, its own process).

    .venv/bin/python -m kpp.testing.lbclient --config '<json>' --out results.json

What is reproduced, and from where:

* Go's net/http Transport (client-go's transport): one keep-alive connection per client. An idle
  connection the server closed is noticed before it is reused (Go's persistConn read loop sees the EOF
  at once and drops it from the idle pool). A request on a *reused* connection that fails before any
  response byte is retried at once on a new connection when nothing was written, or when the method
  is replayable (GET/HEAD without a body): `persistConn.shouldRetryRequest` (net/http/transport.go).
  `Connection: close` on a response closes the connection after it.
* client-go's rest.Request (`k8s.io/client-go/rest/request.go`, `with_retry.go`): up to 10 retries
  (`maxRetries`). A 429 or 5xx with a `Retry-After` in seconds is retried after that many seconds, for
  every verb (`checkWait`). A GET whose error is a connection reset or a probable EOF (or a lost
  HTTP/2 connection) is retried after 1 s (`IsNextRetry` makes an artificial `Retry-After: 1`); other
  verbs, and other errors (connection refused, timeouts), are not retried: the call fails.
* client-go's Reflector (`k8s.io/client-go/tools/cache/reflector.go`): LIST, then WATCH from its
  resourceVersion. A watch stream that ends, cleanly or cut (a cut counts as a probable EOF in
  `StreamWatcher`), is re-opened at once from the last resourceVersion seen; a watch request that
  fails is retried by rest.Request as above; a watch request refused or answered 429 backs off 800 ms.
  A 410 Gone re-lists.

Config: {"lb": [host, port], "kubectl_lb": [host, port], "ca": path, "sni": name, "duration": s,
"workers": 8, "rate": 200, "kubectl_interval": s, "watchers": 6, "namespace": ns, "peer_only": path,
"common": path, "run": prefix, optional "cert"/"key" (a client certificate) and "stop_file" (the run ends
early once that file exists)}. Prints `START <monotonic>`; writes every call's record at the end.
"""
from __future__ import annotations

import argparse
import http.client
import json
import random
import select
import socket
import ssl
import sys
import threading
import time

from kpp.testing.proc import client_tls

MAX_RETRIES = 10  # client-go's default (rest.Request maxRetries)
REQUEST_TIMEOUT = 10.0
WATCH_BACKOFF = 0.8  # the Reflector's backoff manager's initial wait


class Failed(Exception):
    pass


def _reset_or_eof(e: BaseException) -> bool:
    """client-go's net.IsConnectionReset / net.IsProbableEOF, for Python's exceptions."""
    return isinstance(e, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected,
                          http.client.IncompleteRead, http.client.BadStatusLine, ssl.SSLEOFError,
                          ssl.SSLZeroReturnError, EOFError)) or "EOF" in str(e)


class Transport:
    """One keep-alive TLS connection, Go's Transport as described above."""

    def __init__(self, addr, ctx: ssl.SSLContext, sni: str, keep_alive: bool = True):
        self.addr, self.ctx, self.sni, self.keep_alive = tuple(addr), ctx, sni, keep_alive
        self.conn: http.client.HTTPSConnection | None = None
        self.dials = 0

    def _idle_closed(self) -> bool:
        sock = self.conn.sock if self.conn else None
        if sock is None:
            return True
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        # Readable while idle: EOF, a TLS alert, or only a TLS 1.3 session ticket.
        sock.setblocking(False)
        try:
            sock.recv(1)
            return True  # EOF (b"") or stray bytes: the connection is not reusable
        except ssl.SSLWantReadError:
            return False
        except OSError:
            return True
        finally:
            sock.setblocking(True)

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _dial(self):
        self.conn = http.client.HTTPSConnection(self.addr[0], self.addr[1], timeout=REQUEST_TIMEOUT,
                                                context=self.ctx)
        sock = socket.create_connection(self.addr, REQUEST_TIMEOUT)
        self.conn.sock = self.ctx.wrap_socket(sock, server_hostname=self.sni)
        self.dials += 1

    def round_trip(self, method, path, body=None, headers=None, stream=False):
        """(status, headers, body or the response when stream) or raises the transport error."""
        replayable = method in ("GET", "HEAD") and body is None
        while True:
            reused = self.conn is not None
            if reused and self._idle_closed():
                self.close()
                reused = False
            if self.conn is None:
                self._dial()
            written = False
            try:
                h = {"Accept": "application/json", **(headers or {})}
                if body is not None:
                    h["Content-Type"] = "application/json"
                if not self.keep_alive:
                    h["Connection"] = "close"
                self.conn.request(method, path, body=body, headers=h)
                written = True
                resp = self.conn.getresponse()
                if stream:
                    return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp
                data = resp.read()
                status, hdrs = resp.status, {k.lower(): v for k, v in resp.getheaders()}
                if resp.will_close or not self.keep_alive:
                    self.close()
                return status, hdrs, data
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if reused and (not written or replayable) and not isinstance(e, socket.timeout):
                    continue  # Go retries on a fresh connection at once
                raise


class Client:
    """client-go's rest.Request retry policy over one Transport; records every logical call."""

    def __init__(self, transport: Transport, records: list, kind: str):
        self.t, self.records, self.kind = transport, records, kind

    def do(self, method, path, body=None):
        t0 = time.monotonic()
        attempts = 0
        first_error = ""
        while True:
            try:
                status, headers, data = self.t.round_trip(method, path, body)
            except (OSError, http.client.HTTPException) as e:
                err = type(e).__name__
                first_error = first_error or err
                if method == "GET" and _reset_or_eof(e) and attempts < MAX_RETRIES:
                    attempts += 1
                    time.sleep(1.0)
                    continue
                self.records.append([self.kind, method, path, t0, time.monotonic(), 0, attempts, first_error, err])
                return 0, {}, b""
            ra = headers.get("retry-after", "")
            if (status == 429 or 500 <= status < 600) and ra.isdigit() and attempts < MAX_RETRIES:
                attempts += 1
                first_error = first_error or str(status)
                time.sleep(int(ra))
                continue
            self.records.append([self.kind, method, path, t0, time.monotonic(), status, attempts, first_error,
                                 data[:200].decode(errors="replace") if status >= 400 else ""])
            return status, headers, data


class Run:
    def __init__(self, cfg):
        self.cfg = cfg
        # cert/key: a real kube-apiserver's client certificate (the kubeadm nodes' admin.conf identity)
        self.ctx = client_tls(cfg["ca"], cfg.get("cert"), cfg.get("key"))
        self.lock = threading.Lock()
        self.records: list = []
        self.created: list = []  # [name, t] of every 201
        self.watches: list = []
        self.watching = 0  # watchers whose first stream is open
        self.start_at = self.stop_at = 0.0

    def transport(self, addr, keep_alive=True):
        return Transport(addr, self.ctx, self.cfg["sni"], keep_alive)

    def worker(self, idx):
        records = []
        c = Client(self.transport(self.cfg["lb"]), records, "worker")
        ns = self.cfg["namespace"]
        interval = self.cfg["workers"] / self.cfg["rate"]
        next_t = self.start_at + random.Random(idx).random() * interval
        seq = 0
        created = []
        while time.monotonic() < self.stop_at:
            now = time.monotonic()
            if next_t > now:
                time.sleep(next_t - now)
            elif now - next_t > 1.0:
                next_t = now
            next_t += interval
            op = seq % 4
            name = f"{self.cfg['run']}-w{idx}-{seq}"
            if op == 0:
                body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                                   "data": {"seq": str(seq)}}).encode()
                status, _, _ = c.do("POST", f"/api/v1/namespaces/{ns}/configmaps", body)
                if status == 201:
                    created.append([name, time.monotonic()])
                last = name
            elif op == 1:
                c.do("GET", f"/api/v1/namespaces/{ns}/configmaps/{last}")
            elif op == 2:
                c.do("GET", self.cfg["peer_only"])
            else:
                c.do("GET", self.cfg["common"])
            seq += 1
        c.t.close()
        with self.lock:
            self.records.extend(records)
            self.created.extend(created)

    def kubectl(self):
        """kubectl-like: a new connection for every call (a new process each time), client-go's retries."""
        records = []
        while time.monotonic() < self.stop_at:
            c = Client(self.transport(self.cfg["kubectl_lb"], keep_alive=False), records, "kubectl")
            c.do("GET", self.cfg["peer_only"] if len(records) % 2 else self.cfg["common"])
            c.t.close()
            time.sleep(self.cfg["kubectl_interval"])
        with self.lock:
            self.records.extend(records)

    def watcher(self, idx):
        ns = self.cfg["namespace"]
        records = []
        c = Client(self.transport(self.cfg["lb"]), records, "watch-list")
        w = {"idx": idx, "streams": [], "names": []}
        rv = None
        while time.monotonic() < self.stop_at:
            if rv is None:
                status, _, data = c.do("GET", f"/api/v1/namespaces/{ns}/configmaps")
                if status != 200:
                    time.sleep(WATCH_BACKOFF)
                    continue
                rv = json.loads(data)["metadata"]["resourceVersion"]
                if not w["streams"]:
                    w["listed_at"] = time.monotonic()
            path = f"/api/v1/namespaces/{ns}/configmaps?watch=1&allowWatchBookmarks=true&resourceVersion={rv}" \
                   f"&timeoutSeconds={max(1, int(self.stop_at - time.monotonic()) + 5)}"
            # The watch request itself: rest.Request's retries, on its own connection (HTTP/1.1: one stream).
            t = self.transport(self.cfg["lb"])
            t0 = time.monotonic()
            attempts = 0
            while True:
                try:
                    status, headers, resp = t.round_trip("GET", path, stream=True)
                    break
                except (OSError, http.client.HTTPException) as e:
                    if _reset_or_eof(e) and attempts < MAX_RETRIES:
                        attempts += 1
                        time.sleep(1.0)
                        continue
                    status, headers, resp = 0, {}, None
                    break
            if status != 200:
                records.append(["watch", "GET", path, t0, time.monotonic(), status, attempts, "", ""])
                t.close()
                ra = headers.get("retry-after", "")
                if status == 410:
                    rv = None
                elif (status == 429 or 500 <= status < 600) and ra.isdigit():
                    time.sleep(int(ra))  # rest.Request's checkWait
                elif status == 0 or status == 429:
                    time.sleep(WATCH_BACKOFF)
                continue
            stream = {"opened": t0, "established": time.monotonic(), "attempts": attempts, "events": 0,
                      "end": "", "ended": 0.0}
            if not w["streams"]:
                with self.lock:
                    self.watching += 1
            buf = b""
            try:
                t.conn.sock.settimeout(30)
                while True:
                    chunk = resp.read1(65536)
                    if not chunk:
                        stream["end"] = "clean"
                        break
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        ev = json.loads(line)
                        if ev["type"] == "ERROR":
                            rv = None if ev["object"].get("code") == 410 else rv
                            continue
                        rv = ev["object"]["metadata"]["resourceVersion"]
                        if ev["type"] == "ADDED":
                            w["names"].append(ev["object"]["metadata"]["name"])
                        stream["events"] += 1
            except (OSError, http.client.HTTPException, ValueError) as e:
                stream["end"] = "cut:" + type(e).__name__
            stream["ended"] = time.monotonic()
            t.close()
            w["streams"].append(stream)
        with self.lock:
            self.records.extend(records)
            self.watches.append(w)

    def run(self):
        watchers = [threading.Thread(target=self.watcher, args=(i,), daemon=True) for i in range(self.cfg["watchers"])]
        self.start_at = time.monotonic() + 60
        self.stop_at = self.start_at + self.cfg["duration"]
        for t in watchers:
            t.start()
        # Workers (and so creates) start once every watcher has its first stream open.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._watching() >= self.cfg["watchers"]:
                break
            time.sleep(0.05)
        self.start_at = time.monotonic() + 0.2
        self.stop_at = self.start_at + self.cfg["duration"]
        print(f"START {self.start_at:.6f}", flush=True)
        if self.cfg.get("stop_file"):
            threading.Thread(target=self._stop_on_file, daemon=True).start()
        others = [threading.Thread(target=self.worker, args=(i,), daemon=True) for i in range(self.cfg["workers"])]
        others.append(threading.Thread(target=self.kubectl, daemon=True))
        for t in others:
            t.start()
        for t in others + watchers:
            t.join(self.cfg["duration"] + 60)
        return {"start": self.start_at, "stop": self.stop_at, "records": self.records, "created": self.created,
                "watches": self.watches, "hung": sum(t.is_alive() for t in others + watchers)}

    def _stop_on_file(self):
        """A run whose end is not known in advance (a kubeadm upgrade): it stops when the file appears."""
        from pathlib import Path
        while time.monotonic() < self.stop_at:
            if Path(self.cfg["stop_file"]).exists():
                self.stop_at = time.monotonic()
                return
            time.sleep(0.2)

    def _watching(self):
        with self.lock:
            return self.watching


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    result = Run(json.loads(a.config)).run()
    with open(a.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
