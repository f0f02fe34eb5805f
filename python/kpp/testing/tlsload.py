"""Clients that keep running through one HTTPS endpoint while something changes under it (renewed
certificates: tests/e2e/test_pki_reload.py, tests/k8s/test_pki_renewal.py).

* keep-alive workers that GET the given paths in turn on one connection each;
* one worker that opens a new connection (a new TLS handshake) for every request;
* one watch per watched path, opened at start and expected to stream until stop();
* a creator that POSTs objects every `create_every` seconds, so the watches have events to deliver.

Every answer other than the expected status, and every connection error, is a failure. Bounded: it
runs until stop(), with a pause between requests.
"""
from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
from typing import Callable


class TlsLoad:
    def __init__(self, host: str, port: int, context: Callable[[], ssl.SSLContext], paths: list[str],
                 watches: list[str], creates: list[tuple[str, Callable[[int], dict]]], *,
                 keepalive_workers: int = 3, pause: float = 0.02, create_every: float = 0.25,
                 headers: dict | None = None):
        self.host, self.port, self.context, self.paths = host, port, context, paths
        self.creates, self.pause, self.create_every = creates, pause, create_every
        self.headers = headers or {}
        self.stop_ev = threading.Event()
        self.lock = threading.Lock()
        self.ok = 0
        self.failures: list[str] = []
        self.watch_events: dict[str, list[float]] = {p: [] for p in watches}
        self.watch_broken: dict[str, str] = {}
        self.threads = [threading.Thread(target=self._worker, args=(i, True), daemon=True)
                        for i in range(keepalive_workers)]
        self.threads.append(threading.Thread(target=self._worker, args=(keepalive_workers, False), daemon=True))
        self.threads += [threading.Thread(target=self._watch, args=(p,), daemon=True) for p in watches]
        if creates:
            self.threads.append(threading.Thread(target=self._creator, daemon=True))

    def _conn(self, timeout=10.0) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context(), timeout=timeout)

    def _record(self, what, status, want=200, body=b""):
        with self.lock:
            if status == want:
                self.ok += 1
            else:
                self.failures.append(f"{time.strftime('%H:%M:%S')} {what}: {status} {body[:200]!r}")

    def _worker(self, i, keepalive):
        conn = None
        seq = i
        while not self.stop_ev.is_set():
            path = self.paths[seq % len(self.paths)]
            seq += 1
            try:
                conn = conn or self._conn()
                conn.request("GET", path, headers=self.headers)
                r = conn.getresponse()
                body = r.read()
                self._record(path, r.status, body=body)
                if not keepalive or (r.getheader("connection") or "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                self._record(path, f"{type(e).__name__}: {e}")
                conn = None
            time.sleep(self.pause)
        if conn:
            conn.close()

    def _watch(self, path):
        conn = None
        try:
            conn = self._conn(timeout=60)
            sep = "&" if "?" in path else "?"
            conn.request("GET", f"{path}{sep}watch=true", headers=self.headers)
            r = conn.getresponse()
            if r.status != 200:
                self.watch_broken[path] = f"HTTP {r.status} {r.read()[:200]!r}"
                return
            while not self.stop_ev.is_set():
                line = r.readline()
                if not line:
                    if not self.stop_ev.is_set():
                        self.watch_broken[path] = "stream ended"
                    return
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("type") == "ADDED":
                    self.watch_events[path].append(time.monotonic())
        except (OSError, http.client.HTTPException) as e:
            if not self.stop_ev.is_set():
                self.watch_broken[path] = f"{type(e).__name__}: {e}"
        finally:
            if conn:
                conn.close()

    def _creator(self):
        n = 0
        while not self.stop_ev.wait(self.create_every):
            for path, body in self.creates:
                n += 1
                try:
                    conn = self._conn()
                    conn.request("POST", path, json.dumps(body(n)).encode(),
                                 {"Content-Type": "application/json", **self.headers})
                    r = conn.getresponse()
                    data = r.read()
                    conn.close()
                    self._record(f"POST {path}", r.status, want=201, body=data)
                except (OSError, http.client.HTTPException) as e:
                    self._record(f"POST {path}", f"{type(e).__name__}: {e}", want=201)

    def start(self) -> "TlsLoad":
        for t in self.threads:
            t.start()
        return self

    def stop(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(15)

    def events_after(self, t: float) -> dict[str, int]:
        return {p: sum(1 for x in ts if x > t) for p, ts in self.watch_events.items()}

    def summary(self, t_last_change: float) -> str:
        return (f"{self.ok} requests answered as expected, {len(self.failures)} failed; watch events after the "
                f"last change: {self.events_after(t_last_change)}; broken watches: {self.watch_broken or 'none'}")
