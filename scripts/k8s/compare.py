#!/usr/bin/env python3
"""kube-peer-proxy (Envoy + wasm filter) side by side with the built-in Mixed Version Proxy.

One control plane, v1.36.3, three servers on one etcd, the built-in MVP switched ON on all of them
(`UnknownVersionInteroperabilityProxy`, `--peer-ca-file`, `--proxy-client-cert-file/key`,
`--peer-advertise-ip/port`, front-proxy requestheader flags): `a` without batch/v1 and autoscaling/v2,
`b` and `c` serving everything. An Envoy with the filter sits in front of `a` (peers b and c).
The same servers therefore serve both paths at once:

    ours:     client --https-> Envoy a --(filter: reroute, x-kubernetes-peer-proxied)--tls--> b|c
    built-in: client --https-> apiserver a --(MVP: authn+authz at a, then mTLS+X-Remote-*)--> b|c

(the filter's forwarded request carries x-kubernetes-peer-proxied: true, so b's own MVP serves it
locally; the filter fetches discovery with profile=nopeer, so it sees each server's own view.)

    .venv/bin/python scripts/k8s/compare.py [--requests 1000] [--out FILE]    (= make compare-mvp)

Prints markdown tables (and writes them to --out, default under ~/.cache/kube-peer-proxy/compare/).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from kpp.testing import envoyfront, harness
from kpp.testing.cluster import (A_RUNTIME_CONFIG, CACHE, CRD_GROUP, DEFAULT_VERSION, ControlPlane, cpu_seconds,
                         crd_manifest, wait_for)
from kpp.testing.proc import client_tls

V2 = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
NOPEER = V2 + ";profile=nopeer"
JOBS = "/apis/batch/v1/namespaces/default/jobs"


class Client:
    """One persistent connection (what a real client keeps), plain http or https."""

    def __init__(self, base: str, token: str, ca: Path | None = None):
        self.base, self.token, self.ca = base, token, ca
        self.conn = None

    def _connect(self):
        scheme, rest = self.base.split("://")
        host, port = rest.split(":")
        if scheme == "https":
            return http.client.HTTPSConnection(host, int(port), context=client_tls(self.ca), timeout=30)
        return http.client.HTTPConnection(host, int(port), timeout=30)

    def req(self, path, method="GET", body=None, headers=None):
        h = {"Authorization": f"Bearer {self.token}", "Accept": "application/json", **(headers or {})}
        data = json.dumps(body).encode() if body is not None else None
        if data:
            h["Content-Type"] = "application/json"
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = self._connect()
            try:
                self.conn.request(method, path, body=data, headers=h)
                r = self.conn.getresponse()
                return r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = None
                if attempt:
                    raise

    def close(self):
        if self.conn:
            self.conn.close()
            self.conn = None


def job(name):
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}}}


def gvrs(doc):
    return {(g["metadata"].get("name", ""), v["version"], r["resource"]) for g in doc.get("items", [])
            for v in g.get("versions", []) for r in v.get("resources") or [] if v.get("freshness") != "Stale"}


OURS = "kube-peer-proxy (Envoy a)"
BUILTIN = "built-in MVP (apiserver a)"


class Bench:
    def __init__(self, workdir: Path, n: int, mvp: bool):
        self.workdir, self.n, self.mvp = workdir, n, mvp
        self.cp = ControlPlane(workdir, [("a", DEFAULT_VERSION, A_RUNTIME_CONFIG), ("b", DEFAULT_VERSION, ""),
                                         ("c", DEFAULT_VERSION, "")], mvp=mvp, kubectl=str(harness.tool("kubectl")))
        self.front = None
        self.out: list[str] = []
        self.idle_note = ""

    def start(self):
        self.cp.start()
        a = self.cp.servers["a"]
        self.front = envoyfront.Front(self.cp, a, self.workdir / "front-a", log_level="warning").start()
        alice = self.cp.tokens["alice"]
        self.paths = {OURS: Client(self.front.url, alice, self.cp.ca)}
        if self.mvp:
            self.paths[BUILTIN] = Client(a.url, alice, self.cp.ca)
        self.direct_b = Client(self.cp.servers["b"].url, alice, self.cp.ca)
        # the built-in MVP needs its peer discovery cache: wait until a reroutes jobs
        t0 = time.monotonic()
        for label, c in self.paths.items():
            wait_for(lambda c=c: c.req(JOBS)[0] == 200, 120, f"{label} rerouting batch/v1 jobs")
        self.ready_s = time.monotonic() - t0

    def stop(self):
        if self.front:
            self.front.stop()
        self.cp.stop()

    def served_by(self, aid: str) -> str:
        """Servers whose audit log has this Audit-ID (the built-in MVP logs it at a *and* at the peer)."""
        def hits():
            return {n for n, s in self.cp.servers.items() if any(e["auditID"] == aid for e in s.audit_events())}
        try:
            wait_for(hits, 5, "audit event")
        except TimeoutError:
            return "?"
        time.sleep(0.5)
        return ",".join(sorted(hits()))

    # ---- (a) correctness ----
    def correctness(self, suffix: str = "") -> list:
        rows = []
        kubectl = self.cp.kubectl
        for label, c in self.paths.items():
            res = {}
            aid = str(uuid.uuid4())
            st, _, _ = c.req(JOBS, "POST", job(f"j-{uuid.uuid4().hex[:6]}"))
            res["create batch/v1 Job (only b,c serve it)"] = st == 201
            st, _, body = c.req(JOBS, headers={"Audit-ID": aid})
            res["GET/LIST it via a → 200, served by"] = f"{st}, audit at {self.served_by(aid)}"
            st, _, body = c.req("/apis/batch/v1/namespaces/kube-system/jobs")
            res["RBAC for the original user (alice in kube-system → 403)"] = st == 403
            st, _, body = c.req("/apis", headers={"Accept": V2})
            res["aggregated /apis lists batch/v1 jobs"] = st == 200 and ("batch", "v1", "jobs") in gvrs(json.loads(body))
            st, _, body = c.req("/apis", headers={"Accept": NOPEER})
            res["profile=nopeer → a's own view (no batch)"] = st == 200 and ("batch", "v1", "jobs") not in gvrs(json.loads(body))
            st, _, body = c.req("/apis/batch/v1")
            res["GET /apis/batch/v1 (per-GV discovery)"] = f"{st}"
            # kubectl
            kc = self.cp.kubeconfig(c.base, self.cp.tokens["alice"], self.workdir / f"kc-{uuid.uuid4().hex[:6]}.json")
            r = subprocess.run([kubectl, f"--kubeconfig={kc}", "get", "jobs", "-o", "name"], capture_output=True,
                               text=True, timeout=60)
            res["kubectl get jobs"] = r.returncode == 0 and "job.batch/" in r.stdout
            r = subprocess.run([kubectl, f"--kubeconfig={kc}", "api-resources", "--api-group=batch", "-o", "name"],
                               capture_output=True, text=True, timeout=60)
            res["kubectl api-resources shows jobs.batch"] = "jobs.batch" in r.stdout.split()
            r = subprocess.run([kubectl, f"--kubeconfig={kc}", "create", "-f", "-"], capture_output=True, text=True,
                               timeout=60, input=json.dumps(job(f"j-k-{uuid.uuid4().hex[:6]}")))
            res["kubectl create -f job.json (client-side validation on)"] = r.returncode == 0 or r.stderr.strip()[:80]
            res["watch through the reroute delivers events"] = self.watch_ok(c)
            res["new CRD: seconds until listed in /apis via a"] = self.crd_seconds(c)
            rows.append((label + suffix, res))
        return rows

    def watch_ok(self, c: Client) -> bool:
        w = Client(c.base, c.token, c.ca)
        conn = w._connect()
        conn.request("GET", JOBS + "?watch=1&timeoutSeconds=20", headers={"Authorization": f"Bearer {c.token}"})
        resp = conn.getresponse()
        if resp.status != 200:
            return False
        name = f"j-w-{uuid.uuid4().hex[:6]}"
        seen = threading.Event()

        def rd():
            for line in resp:
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if e["type"] == "ADDED" and e["object"]["metadata"]["name"] == name:
                    seen.set()
                    return
        threading.Thread(target=rd, daemon=True).start()
        time.sleep(0.5)
        self.direct_b.req(JOBS, "POST", job(name))
        ok = seen.wait(15)
        conn.close()
        return ok

    def crd_seconds(self, c: Client) -> str:
        plural = f"gizmos{uuid.uuid4().hex[:5]}"
        crd = crd_manifest(plural)
        admin = Client(self.cp.servers["b"].url, self.cp.admin_token, self.cp.ca)
        st, _, body = admin.req("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "POST", crd)
        assert st == 201, body
        self.cp.wait_established(crd["metadata"]["name"], self.cp.servers["b"])
        t0 = time.monotonic()
        gvr = (CRD_GROUP, "v1", plural)
        while time.monotonic() - t0 < 60:
            st, _, body = c.req("/apis", headers={"Accept": V2})
            if st == 200 and gvr in gvrs(json.loads(body)):
                st2, _, _ = c.req(f"/apis/{CRD_GROUP}/v1/namespaces/default/{plural}")
                if st2 == 200:
                    return f"{time.monotonic() - t0:.1f}"
            time.sleep(0.1)
        return "not within 60 s"

    # ---- (b) latency and CPU ----
    def cpu(self) -> dict[str, float]:
        d = {f"apiserver {n}": cpu_seconds(s.proc.pid) for n, s in self.cp.servers.items()}
        d["envoy a"] = sum(cpu_seconds(p) for p in self.front.pids())
        return d

    def idle_rates(self, seconds: float = 5.0) -> dict[str, float]:
        """CPU seconds per second of every process while nothing is sent (leases, controllers)."""
        b = self.cpu()
        time.sleep(seconds)
        a = self.cpu()
        return {k: (a[k] - b[k]) / seconds for k in a}

    def latency(self):
        for i in range(50):
            self.direct_b.req(JOBS, "POST", job(f"bench-{i:03d}"))
        st, _, body = self.direct_b.req(JOBS)
        n_jobs = len(json.loads(body)["items"])
        cases = [("GET one Job (rerouted)", JOBS + "/bench-007"), (f"LIST {n_jobs} Jobs (rerouted)", JOBS),
                 ("GET one ConfigMap (local at a)", "/api/v1/namespaces/default/configmaps/kube-root-ca.crt")]
        st, _, _ = self.direct_b.req("/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
        if st != 200:
            self.direct_b.req("/api/v1/namespaces/default/configmaps", "POST",
                              {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-root-ca.crt"}})
            cases[2] = ("GET one ConfigMap (local at a)", "/api/v1/namespaces/default/configmaps/kube-root-ca.crt")
        a = self.cp.servers["a"]
        clients = dict(self.paths)
        clients["no proxy (straight to b), baseline"] = self.direct_b
        clients["straight to a (local only)"] = Client(a.url, self.cp.tokens["alice"], self.cp.ca)
        self.out.append(f"### (b) Latency and CPU ({self.n} sequential requests per cell, one keep-alive "
                        "connection, after 100 warm-up requests)\n")
        self.out.append("| request | path | p50 ms | p99 ms | mean ms | apiserver a CPU ms/req | apiserver b+c CPU ms/req "
                        "| Envoy CPU ms/req | total CPU ms/req |")
        self.out.append("|---|---|---|---|---|---|---|---|---|")
        results = {}
        idle = self.idle_rates()
        self.idle_note = ("Idle CPU subtracted (measured for 5 s before the runs, in CPU ms per second): "
                          + ", ".join(f"{k} {v * 1000:.0f}" for k, v in idle.items()) + ".")
        for case, path in cases:
            for label, c in clients.items():
                if "local" in case and "baseline" in label:
                    continue
                if "local only" in label and "local" not in case:
                    continue
                for _ in range(100):
                    c.req(path)
                before = self.cpu()
                t_start = time.monotonic()
                lat = []
                for _ in range(self.n):
                    t = time.perf_counter()
                    st, _, _ = c.req(path)
                    lat.append((time.perf_counter() - t) * 1000)
                    assert st == 200, (label, path, st)
                after = self.cpu()
                elapsed = time.monotonic() - t_start
                d = {k: max(0.0, after[k] - before[k] - idle[k] * elapsed) * 1000 / self.n for k in after}
                lat.sort()
                p50, p99 = lat[len(lat) // 2], lat[max(0, int(len(lat) * 0.99) - 1)]
                bc = d["apiserver b"] + d["apiserver c"]
                env_cpu = d["envoy a"] if "Envoy" in label else 0.0
                total = d["apiserver a"] + bc + env_cpu
                results[(case, label)] = (p50, p99)
                self.out.append(f"| {case} | {label} | {p50:.2f} | {p99:.2f} | {statistics.mean(lat):.2f} | "
                                f"{d['apiserver a']:.3f} | {bc:.3f} | "
                                f"{env_cpu:.3f} | {total:.3f} |")
        self.out.append("")
        return results

    # ---- (c) the serving peer stops ----
    def failover(self, seconds: float, only: str, suffix: str = "") -> dict:
        tables = {}
        steps = (("b stopped gracefully (SIGTERM), c still serves batch/v1", "b", signal.SIGTERM, seconds, True),
                 ("b stopped hard (SIGKILL), c still serves batch/v1", "b", signal.SIGKILL, seconds, False),
                 ("c stopped too (SIGKILL): nobody serves batch/v1", "c", signal.SIGKILL, seconds * 1.5, False))
        for step, victim, sig, secs, restart in steps:
            timeline = {label: [] for label in self.paths if label == only}
            server = self.cp.servers[victim]
            os.killpg(server.proc.pid, sig)  # not stop(): requests go on while it shuts down
            t0 = time.monotonic()
            while time.monotonic() - t0 < secs:
                for label, c in self.paths.items():
                    if label != only:
                        continue
                    t = time.perf_counter()
                    try:
                        st, _, body = c.req(JOBS + "?limit=1")
                    except Exception as e:  # noqa: BLE001
                        st, body = 0, str(e).encode()
                    timeline[label].append((time.monotonic() - t0, st, (time.perf_counter() - t) * 1000, body[:160]))
                time.sleep(0.1)
            server.stop(signal.SIGKILL)  # reap (already gone, or still draining after secs)
            if restart:
                server.start()
                server.wait_ready(self.cp.admin_token, self.cp.ca)
                time.sleep(15)  # both proxies see b again (the filter: next discovery round; MVP: its lease)
            rows = tables.setdefault(step, [])
            for label, tl in timeline.items():
                ok = [x for x in tl if x[1] == 200]
                bad = [x for x in tl if x[1] != 200]
                codes = {}
                for x in bad:
                    codes[x[1]] = codes.get(x[1], 0) + 1
                last_bad = f"{bad[-1][0]:.1f}" if bad else "-"
                after = [x for x in ok if not bad or x[0] > bad[-1][0]]
                first_ok = f"{after[0][0]:.1f}" if after and bad else ("-" if bad else "0")
                def body(x):
                    return x[3].decode("utf-8", "replace").replace("|", "/").replace("\n", " ")[:110]
                ex = (body(bad[0]) + (" *… last:* " + body(bad[-1]) if body(bad[-1]) != body(bad[0]) else "")
                      if bad else "")
                rows.append(f"| {label}{suffix} | {len(tl)} | {len(ok)} | {len(bad)} {codes or ''} | {runs(tl)} | "
                            f"{last_bad} | {first_ok} | {max(x[2] for x in tl):.0f} | {ex} |")
        return tables


def runs(tl) -> str:
    """Run-length view of the status codes: `503 0.0–9.4, 404 9.5–15.0`."""
    out = []
    for t, st, _, _ in tl:
        if out and out[-1][0] == st:
            out[-1][2] = t
        else:
            out.append([st, t, t])
    parts = [f"{st} {a:.1f}–{b:.1f}" for st, a, b in out]
    if len(parts) > 6:
        flips = len(parts) - 4
        parts = parts[:2] + [f"… {flips} more alternations …"] + parts[-2:]
    return ", ".join(parts)


def fmt(v):
    if v is True:
        return "yes"
    if v is False:
        return "**no**"
    return str(v)


def correctness_table(rows) -> list[str]:
    out = ["### (a) Correctness\n", "| scenario | " + " | ".join(l for l, _ in rows) + " |",
           "|---|" + "---|" * len(rows)]
    for k in rows[0][1]:
        out.append(f"| {k} | " + " | ".join(fmt(r.get(k, "-")) for _, r in rows) + " |")
    return out + [""]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--failover-seconds", type=float, default=40)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    t0 = time.monotonic()
    head = [f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores; "
            f"kube-apiserver {DEFAULT_VERSION} ×3 (a without {A_RUNTIME_CONFIG}; b, c full), one etcd, "
            "Envoy 1.40 (func-e) in front of a.\n"]
    # Run 1: the built-in MVP switched on. Both paths share these servers: the filter's forwarded
    # requests carry x-kubernetes-peer-proxied, so b/c serve them without a second hop.
    on = Bench(Path(tempfile.mkdtemp(prefix="kpp-compare-mvp-on-")), a.requests, mvp=True)
    try:
        on.start()
        rows = on.correctness(" — MVP-on servers")
        on.latency()
        fo_builtin = on.failover(a.failover_seconds, BUILTIN)
    finally:
        on.stop()
    # Run 2: same servers with the MVP off (as tests/k8s runs them), for the filter alone: with the MVP
    # on, whatever the filter routes to a locally would be proxied again by a's MVP.
    off = Bench(Path(tempfile.mkdtemp(prefix="kpp-compare-mvp-off-")), a.requests, mvp=False)
    try:
        off.start()
        rows = off.correctness(" — MVP-off servers") + rows
        fo_ours = off.failover(a.failover_seconds, OURS)
    finally:
        off.stop()
    out = head + correctness_table(rows) + on.out + [on.idle_note, "", "### (c) The serving peer stops\n"]
    for step in fo_builtin:
        out += [f"**{step}** — `GET {JOBS}?limit=1` every ~100 ms from the moment of the kill\n",
                "| path | requests | 200 | non-200 (codes) | status over time (s since the kill) | last non-200 at s "
                "| first 200 after the last failure at s | slowest ms | failure body (first; last if different) |",
                "|---|---|---|---|---|---|---|---|---|"]
        out += fo_ours.get(step, []) + fo_builtin[step] + [""]
    text = "\n".join(out) + "\n"
    path = Path(a.out) if a.out else CACHE / "compare" / f"results-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(text)
    print(f"written to {path} ({time.monotonic() - t0:.0f} s)")


if __name__ == "__main__":
    main()
