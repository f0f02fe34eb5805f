"""In-process load for the fault and restart e2e tests: a few threads with keep-alive connections that
send requests back to back and record every answer (or its absence) with timestamps."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Answer:
    t0: float
    t1: float
    worker: int
    method: str
    path: str
    status: int  # 0: no HTTP response (see error)
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    error: str = ""

    @property
    def served_by(self) -> str:
        return self.headers.get("x-fake-apiserver", "")

    @property
    def latency(self) -> float:
        return self.t1 - self.t0

    def status_json(self) -> dict | None:
        try:
            doc = json.loads(self.body)
        except ValueError:
            return None
        return doc if isinstance(doc, dict) and doc.get("kind") == "Status" else None

    def is_503_status_with_retry_after(self) -> bool:
        doc = self.status_json()
        return (self.status == 503 and "retry-after" in self.headers and doc is not None
                and doc.get("code") == 503 and doc.get("reason") == "ServiceUnavailable")

    @property
    def origin(self) -> str:
        """Who wrote the answer: "apiserver" (a fake apiserver), "filter" (a Status the filter wrote itself,
        message "kube-peer-proxy: …"), "envoy" (Envoy's local reply, e.g. upstream unreachable), "vm-failure"
        (Envoy's local reply for a request whose wasm VM failed: a Status with an empty message), "" (none)."""
        if self.status == 0:
            return ""
        if self.served_by:
            return "apiserver"
        doc = self.status_json()
        message = str((doc or {}).get("message") or "")
        if message.startswith("kube-peer-proxy:"):
            return "filter"
        return "envoy" if message or doc is None else "vm-failure"

    def is_filter_503(self) -> bool:
        """A 503 Status with Retry-After that the filter wrote itself (not Envoy's reply for a failed VM)."""
        return self.is_503_status_with_retry_after() and self.origin == "filter"

    def __repr__(self):
        return (f"<{self.method} {self.path} -> {self.status or self.error} from {self.served_by or '-'} "
                f"at {self.t0:.3f}+{self.latency * 1000:.0f}ms {self.body[:160]!r}>")


class Hammer:
    """`workers` threads, each sending `requests()` in a loop through its own keep-alive connection.

    `requests` is a callable (worker index, sequence number) → (method, path, body or None).
    """

    def __init__(self, port: int, requests, workers: int = 4, timeout: float = 10.0, pace: float = 0.0):
        self.port, self.requests, self.workers, self.timeout, self.pace = port, requests, workers, timeout, pace
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._in_flight: dict[int, float] = {}

    def in_flight(self) -> int:
        """How many requests are waiting for an answer right now."""
        with self._lock:
            return len(self._in_flight)

    def _run(self, idx: int):
        conn = None
        seq = 0
        while not self._stop.is_set():
            method, path, body = self.requests(idx, seq)
            seq += 1
            headers = {"Accept": "application/json"}
            if body is not None:
                headers["Content-Type"] = "application/json"
                body = json.dumps(body).encode() if not isinstance(body, bytes) else body
            t0 = time.monotonic()
            with self._lock:
                self._in_flight[idx] = t0
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                answer = Answer(t0, time.monotonic(), idx, method, path, resp.status,
                                {k.lower(): v for k, v in resp.getheaders()}, data)
                if resp.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as e:
                answer = Answer(t0, time.monotonic(), idx, method, path, 0,
                                error="timeout" if isinstance(e, socket.timeout) else type(e).__name__)
                if conn is not None:
                    conn.close()
                conn = None
            with self._lock:
                self._in_flight.pop(idx, None)
                self.answers.append(answer)
            if self.pace:
                time.sleep(self.pace)
        if conn is not None:
            conn.close()

    def start(self) -> "Hammer":
        for i in range(self.workers):
            t = threading.Thread(target=self._run, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> list[Answer]:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout + 5)
        assert not any(t.is_alive() for t in self._threads), "a client thread hung"
        with self._lock:
            return sorted(self.answers, key=lambda a: a.t0)

    def snapshot(self) -> list[Answer]:
        with self._lock:
            return sorted(self.answers, key=lambda a: a.t0)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
