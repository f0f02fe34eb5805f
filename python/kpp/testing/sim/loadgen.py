"""Load generator of the upgrade simulation (stdlib only).

Runs as its own process, so its interpreter lock does not compete with the fake apiservers that live
in the orchestrator's process. A fixed number of worker threads (bounded concurrency), each with one
keep-alive HTTP/1.1 connection to the front load balancer, run create → get → list → delete cycles on
a random GVR of a random class, paced so that all workers together send `--rate` requests per second;
watcher threads hold long watches (re-established from the last resourceVersion when a stream ends).

    .venv/bin/python -m kpp.testing.sim.loadgen --config '<json>' --out results.json

Config: {"port", "duration", "rate", "workers", "watchers_per_class", "seed", "run", "gvrs": [...]}
(gvrs as kpp.testing.sim.gvrs.table()). Prints `START <monotonic time>` once all threads are about to begin; writes
every request's record to --out at the end. Times are time.monotonic(), which is one clock for all
processes on the machine, so the orchestrator can lay them over its upgrade timeline.

Record: [t_start, t_end, op, gvr_id, status, has_retry_after, served_by, not_found_kind, status_body, error,
         message]
  status 0 = no HTTP response (error names the exception); not_found_kind for 404s: "object" (a Status
  naming the object: the resource is served, the object is missing) or "resource" (the server does not
  serve the resource: plain "404 page not found" or "the server could not find the requested resource");
  status_body is 1 when the body is a Kubernetes Status JSON; message is that Status's message (first
  MESSAGE_CHARS characters) for non-2xx answers, which tells who answered a 503: the filter's own start
  with "kube-peer-proxy:", Envoy's (upstream unreachable) name the reset, a failed wasm VM's is empty.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time

REQUEST_TIMEOUT = 10.0  # a request without an answer after this long is a hang
WATCH_IDLE_TIMEOUT = 30.0
MESSAGE_CHARS = 120


def parse_body(body: bytes):
    try:
        return json.loads(body)
    except ValueError:
        return None


def status_message(status: int, doc) -> str:
    if 200 <= status < 300 or not (isinstance(doc, dict) and doc.get("kind") == "Status"):
        return ""
    return str(doc.get("message") or "")[:MESSAGE_CHARS]


def not_found_kind(doc) -> str:
    if isinstance(doc, dict) and doc.get("kind") == "Status" and (doc.get("details") or {}).get("name"):
        return "object"
    return "resource"


class Client:
    """One keep-alive connection; reconnects after any failure."""

    def __init__(self, port: int, timeout: float = REQUEST_TIMEOUT):
        self.port, self.timeout = port, timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None):
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            self.conn.request(method, path, body=body, headers=headers)
            resp = self.conn.getresponse()
            data = resp.read()
            if resp.will_close:
                self.close()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data, ""
        except socket.timeout:
            self.close()
            return 0, {}, b"", "timeout"
        except (OSError, http.client.HTTPException) as e:
            self.close()
            return 0, {}, b"", type(e).__name__

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class Run:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.port = cfg["port"]
        self.gvrs = cfg["gvrs"]
        self.by_class: dict[str, list[dict]] = {}
        for g in self.gvrs:
            self.by_class.setdefault(g["cls"], []).append(g)
        self.lock = threading.Lock()
        self.records: list[list] = []
        self.created: dict[str, int] = {}  # name -> gvr id, for every 201
        self.deleted: set[str] = set()  # names whose delete answered 200
        # names whose delete got no verdict (connection lost, 5xx while a server stopped): the server may have
        # applied it, as client-go's caller must assume, so their absence from the store is not a lost write
        self.delete_unanswered: set[str] = set()
        self.lost: list[list] = []  # [name, gvr id, op, t]: a 201-created object a later read could not find
        self.watch_stats: dict[str, dict] = {}
        self.start_at = 0.0
        self.stop_at = 0.0

    # --- workers --------------------------------------------------------------------------------------------

    def worker(self, idx: int):
        rng = random.Random(f"{self.cfg['seed']}-{idx}")
        client = Client(self.port)
        interval = self.cfg["workers"] / self.cfg["rate"]
        records = []
        next_t = self.start_at + rng.random() * interval

        def send(op, g, method, path, body=None):
            nonlocal next_t
            now = time.monotonic()
            if next_t > now:
                time.sleep(next_t - now)
            elif now - next_t > 1.0:  # fell behind (slow answers): do not burst to catch up
                next_t = now
            next_t += interval
            t0 = time.monotonic()
            status, headers, data, err = client.request(method, path, body)
            t1 = time.monotonic()
            doc = parse_body(data) if data[:1] == b"{" else None
            nf = not_found_kind(doc) if status == 404 else ""
            is_status = int(isinstance(doc, dict) and doc.get("kind") == "Status")
            records.append([t0, t1, op, g["id"], status, int("retry-after" in headers),
                            headers.get("x-fake-apiserver", ""), nf, is_status, err, status_message(status, doc)])
            return status, nf

        seq = 0
        while time.monotonic() < self.stop_at:
            g = rng.choice(self.by_class[rng.choice(sorted(self.by_class))])
            name = f"{self.cfg['run']}-w{idx}-{seq}"
            seq += 1
            item = f"{g['collection']}/{name}"
            body = json.dumps({"metadata": {"name": name, "labels": {"sim": self.cfg["run"]}},
                               "spec": {"worker": idx, "seq": seq}}).encode()
            status, _ = send("create", g, "POST", g["collection"], body)
            created = status == 201
            if created:
                with self.lock:
                    self.created[name] = g["id"]
                status, nf = send("get", g, "GET", item)
                if status == 404 and nf == "object":
                    with self.lock:
                        self.lost.append([name, g["id"], "get", time.monotonic()])
            if time.monotonic() >= self.stop_at:
                break
            send("list", g, "GET", g["collection"])
            if created and time.monotonic() < self.stop_at:
                status, nf = send("delete", g, "DELETE", item)
                if status == 200:
                    with self.lock:
                        self.deleted.add(name)
                elif status == 404 and nf == "object":
                    with self.lock:
                        self.lost.append([name, g["id"], "delete", time.monotonic()])
                elif status != 404:
                    with self.lock:
                        self.delete_unanswered.add(name)
        client.close()
        with self.lock:
            self.records.extend(records)

    # --- watchers -------------------------------------------------------------------------------------------

    def watcher(self, idx: int, g: dict):
        stats = {"gvr": g["id"], "starts": 0, "events": 0, "breaks": 0, "expired": 0}
        records = []
        rv = None
        while time.monotonic() < self.stop_at:
            remaining = max(1, int(self.stop_at - time.monotonic()))
            path = f"{g['collection']}?watch=1&timeoutSeconds={remaining}"
            if rv:
                path += f"&resourceVersion={rv}"
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT)
            t0 = time.monotonic()
            try:
                conn.request("GET", path, headers={"Accept": "application/json"})
                resp = conn.getresponse()
            except socket.timeout:
                records.append([t0, time.monotonic(), "watch", g["id"], 0, 0, "", "", 0, "timeout", ""])
                conn.close()
                continue
            except (OSError, http.client.HTTPException) as e:
                records.append([t0, time.monotonic(), "watch", g["id"], 0, 0, "", "", 0, type(e).__name__, ""])
                conn.close()
                time.sleep(0.2)
                continue
            t1 = time.monotonic()
            headers = {k.lower(): v for k, v in resp.getheaders()}
            if resp.status != 200:
                data = resp.read()
                doc = parse_body(data) if data[:1] == b"{" else None
                nf = not_found_kind(doc) if resp.status == 404 else ""
                is_status = int(isinstance(doc, dict) and doc.get("kind") == "Status")
                records.append([t0, t1, "watch", g["id"], resp.status, int("retry-after" in headers),
                                headers.get("x-fake-apiserver", ""), nf, is_status, "",
                                status_message(resp.status, doc)])
                conn.close()
                time.sleep(0.5)
                continue
            records.append([t0, t1, "watch", g["id"], 200, int("retry-after" in headers),
                            headers.get("x-fake-apiserver", ""), "", 0, "", ""])
            stats["starts"] += 1
            if conn.sock is not None:  # None when the response took the connection over (Connection: close)
                conn.sock.settimeout(WATCH_IDLE_TIMEOUT)
            try:
                while True:
                    line = resp.readline()
                    if not line:
                        break
                    event = json.loads(line)
                    if event.get("type") == "ERROR":
                        stats["expired"] += 1
                        rv = None
                        break
                    rv = event["object"]["metadata"]["resourceVersion"]
                    stats["events"] += 1
            except (OSError, http.client.HTTPException, ValueError):
                if time.monotonic() < self.stop_at:
                    stats["breaks"] += 1
            finally:
                conn.close()
        with self.lock:
            self.records.extend(records)
            self.watch_stats[f"{g['cls']}#{idx}"] = stats

    # --- run ------------------------------------------------------------------------------------------------

    def run(self) -> dict:
        threads = [threading.Thread(target=self.worker, args=(i,), daemon=True) for i in range(self.cfg["workers"])]
        n = 0
        for cls in sorted(self.by_class):
            watched = next((g for g in self.by_class[cls] if g["namespaced"]), None)
            for _ in range(self.cfg.get("watchers_per_class", 0) if watched else 0):
                threads.append(threading.Thread(target=self.watcher, args=(n, watched), daemon=True))
                n += 1
        self.start_at = time.monotonic() + 0.3
        self.stop_at = self.start_at + self.cfg["duration"]
        print(f"START {self.start_at:.6f}", flush=True)
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=self.cfg["duration"] + 3 * REQUEST_TIMEOUT + WATCH_IDLE_TIMEOUT)
        hung = sum(t.is_alive() for t in threads)
        with self.lock:
            return {"start": self.start_at, "stop": self.stop_at, "end": time.monotonic(), "hung_threads": hung,
                    "workers": self.cfg["workers"], "rate": self.cfg["rate"],
                    "records": list(self.records), "created": dict(self.created), "deleted": sorted(self.deleted),
                    "delete_unanswered": sorted(self.delete_unanswered),
                    "lost": list(self.lost), "watch": dict(self.watch_stats)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="JSON object (see above)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    result = Run(json.loads(a.config)).run()
    with open(a.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
