#!/usr/bin/env python3
"""The local hop: GET one ConfigMap straight to kube-apiserver vs through Envoy (+ filter), per variant.

One control plane (etcd + ONE kube-apiserver `a`, v1.36.3). For every variant its own Envoy is started,
measured and stopped; the variants run round-robin `--rounds` times so machine noise spreads evenly.
Per measurement: a fresh keep-alive HTTPS connection (http.client, as compare.py's Client), `--warmup`
requests, then `--requests` sequential timed GETs; Envoy CPU (utime+stime of its process group, /proc),
apiserver CPU and the client's own CPU per request; Envoy cluster/listener stats before/after the timed run.

    make hop    (= .venv/bin/python scripts/k8s/hop.py [--requests 2000] [--warmup 200] [--rounds 3]
                   [--paired N] [--out target/hop/results.md])

Read-only use of kpp.*: bootstraps come from kpp.testing.envoyfront.bootstrap / kpp.render.render_bootstrap and
are then modified here (JSON), never by editing the renderers.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kpp import render
from kpp.testing import envoyfront, harness
from kpp.testing.cluster import DEFAULT_VERSION, ControlPlane, cpu_seconds
from kpp.testing.proc import client_tls

CM = "/api/v1/namespaces/default/configmaps/hop-cm"
ROOT = Path(__file__).resolve().parents[2]
NOOP_WASM = ROOT / "target" / "bench-noop" / "kpp_bench_noop.wasm"  # bench/noop/build.sh
H2_OPTS = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
    "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
    "explicit_http_config": {"http2_protocol_options": {}}}}


class Client:
    """One persistent HTTPS connection, the same request every time."""

    def __init__(self, base: str, token: str, ca: Path):
        scheme, rest = base.split("://")
        host, port = rest.split(":")
        if scheme == "http":
            self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        else:
            self.conn = http.client.HTTPSConnection(host, int(port),
                                                    context=client_tls(ca), timeout=30)
        self.h = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self.connects = 0

    def get(self, path: str) -> int:
        if self.conn.sock is None:
            self.connects += 1
        self.conn.request("GET", path, headers=self.h)
        r = self.conn.getresponse()
        r.read()
        return r.status

    def close(self):
        self.conn.close()


# ---- variants: functions from the Front-rendered bootstrap (dict) to the variant's bootstrap ----

def _hcm(b):
    return b["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def _local(b):
    return next(c for c in b["static_resources"]["clusters"] if c["name"] == "local")


def v_front(b, ctx):
    return b


def v_nolog(b, ctx):
    _hcm(b).pop("access_log", None)
    return b


def v_h2(b, ctx):
    b = v_nolog(b, ctx)
    c = _local(b)
    c["typed_extension_protocol_options"] = H2_OPTS
    # Go's TLS server speaks h2 only when ALPN says so; state it (Envoy would also add h2 for an h2 cluster).
    c["transport_socket"]["typed_config"].setdefault("common_tls_context", {})["alpn_protocols"] = ["h2"]
    return b


def v_reuse(b, ctx):
    b = v_nolog(b, ctx)
    c = _local(b)
    c["transport_socket"]["typed_config"]["max_session_keys"] = 1  # Envoy's default, stated
    c["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "common_http_protocol_options": {"idle_timeout": "3600s"},
        "explicit_http_config": {"http_protocol_options": {}}}}
    c["upstream_connection_options"] = {"tcp_keepalive": {}}
    return b


def _rerendered(b, ctx, **kw):
    """A fresh bootstrap for the same apiserver, with Front's downstream TLS copied from `b`."""
    p = json.loads(render.render_bootstrap(
        node="a", listen_port=ctx["listen"], admin_port=ctx["admin"], local=("127.0.0.1", ctx["port"]), peers=[],
        upstream_tls_sni=ctx["sni"], upstream_ca=ctx["ca"], **kw))
    p["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"] = \
        b["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"]
    return p


def v_nofilter(b, ctx):
    """Plain Envoy: render with with_filter=False, same downstream TLS, no access log (compare with 3)."""
    return _rerendered(b, ctx, wasm_path=str(harness.wasm_path()), with_filter=False)


def v_nofilter_plain_down(b, ctx):
    """6 without downstream TLS: the client speaks plain http to Envoy (isolates the downstream TLS cost)."""
    p = v_nofilter(b, ctx)
    del p["static_resources"]["listeners"][0]["filter_chains"][0]["transport_socket"]
    return p


def v_floor(b, ctx):
    """6 with the do-nothing wasm filter of bench/noop (reads `:path`, continues): what any wasm filter
    costs here, so 3 − 9 is this filter's own logic."""
    p = _rerendered(b, ctx, wasm_path=str(NOOP_WASM), with_filter=True, filter_plugin="path")
    p.pop("bootstrap_extensions", None)
    return p


def v_best(b, ctx):
    b = v_h2(b, ctx)
    _hcm(b)["generate_request_id"] = False
    return b


VARIANTS = [
    ("1 straight to apiserver a (no Envoy)", None),
    ("2 Envoy + filter as Front renders it (access log on)", v_front),
    ("3 = 2 without the access log", v_nolog),
    ("4 = 3 + upstream HTTP/2", v_h2),
    ("5 = 3 + explicit upstream reuse (idle_timeout 3600s, max_session_keys 1, tcp keepalive)", v_reuse),
    ("6 plain Envoy, no filter, no access log (TLS both sides)", v_nofilter),
    ("7 = 4 + generate_request_id false", v_best),
    ("8 = 6 without downstream TLS (client plain http)", v_nofilter_plain_down),
    ("9 = 6 + the do-nothing wasm filter (bench/noop)", v_floor),
]

STATS = ("cluster.local.upstream_cx_total", "cluster.local.upstream_cx_http1_total",
         "cluster.local.upstream_cx_http2_total", "cluster.local.upstream_rq_total",
         "cluster.local.ssl.handshake", "cluster.local.ssl.session_reused",
         "http.apiserver.downstream_cx_total", "http.apiserver.downstream_rq_total")


def envoy_stats(env) -> dict:
    s = env.stats(r"^(cluster\.local\.|http\.apiserver\.downstream_(cx|rq)_total)")
    return {k: s.get(k, 0) for k in STATS}


def group_cpu(pgid: int) -> float:
    tot = 0.0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getpgid(int(d)) == pgid:
                    tot += cpu_seconds(int(d))
            except (OSError, FileNotFoundError, IndexError):
                pass
    return tot


def busy_seconds() -> float:
    """System-wide non-idle CPU seconds (all cores) from /proc/stat."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / os.sysconf("SC_CLK_TCK")


def start_envoy(cp, a, fn, workdir: Path):
    listen, admin = harness.free_port(), harness.free_port()
    wd = workdir / f"envoy-{time.monotonic_ns()}"
    b = json.loads(envoyfront.bootstrap(cp, a, [], listen, admin, wd / "access.log"))
    ctx = {"listen": listen, "admin": admin, "port": a.port, "sni": envoyfront.SNI, "ca": str(cp.ca)}
    b = fn(b, ctx)
    wd.mkdir(parents=True, exist_ok=True)
    (wd / "bootstrap.json").write_text(json.dumps(b, indent=2))
    env = harness.Envoy(json.dumps(b, indent=2) + "\n", "hop", admin, workdir=wd / "envoy",
                        log_level="warning", component_log_level="wasm:info")
    env.start(timeout=60)
    if "bootstrap_extensions" in b:
        env.wait_snapshot(60)
    tls = "transport_socket" in b["static_resources"]["listeners"][0]["filter_chains"][0]
    return env, f"{'https' if tls else 'http'}://127.0.0.1:{listen}"


def paired(cp, a, variants, workdir: Path, n: int, warmup: int) -> dict:
    """All variants at once (one Envoy each, started before, idle otherwise); the timed loop sends one
    request to each target in turn (rotating order), so machine drift hits every variant alike."""
    envs, clients = {}, {}
    try:
        for v, fn in variants:
            if fn is None:
                envs[v], base = None, a.url
            else:
                envs[v], base = start_envoy(cp, a, fn, workdir)
            clients[v] = Client(base, cp.tokens["alice"], cp.ca)
        for v, c in clients.items():
            for _ in range(warmup):
                assert c.get(CM) == 200
        lat = {v: [] for v in clients}
        i0 = {v: group_cpu(e.process.pid) for v, e in envs.items() if e}
        time.sleep(3.0)
        cpu0 = {v: group_cpu(e.process.pid) for v, e in envs.items() if e}
        idle = {v: (cpu0[v] - i0[v]) / 3.0 for v in cpu0}
        t0 = time.monotonic()
        order = list(clients)
        for i in range(n):
            k = i % len(order)
            for v in order[k:] + order[:k]:
                t = time.perf_counter()
                st = clients[v].get(CM)
                lat[v].append((time.perf_counter() - t) * 1000)
                assert st == 200, st
        cpu1 = {v: group_cpu(e.process.pid) for v, e in envs.items() if e}
        el = time.monotonic() - t0
        out = {}
        for v, l in lat.items():
            l.sort()
            out[v] = {"p50": l[n // 2], "p99": l[int(n * 0.99) - 1], "mean": statistics.mean(l),
                      "env_cpu_raw": (cpu1[v] - cpu0[v]) * 1000 / n if envs[v] else None,
                      "env_cpu": max(0.0, cpu1[v] - cpu0[v] - idle[v] * el) * 1000 / n if envs[v] else None,
                      "idle_ms_s": idle[v] * 1000 if envs[v] else None}
        return out
    finally:
        for c in clients.values():
            c.close()
        for e in envs.values():
            if e:
                e.stop()


def measure(cp, a, variant, fn, workdir: Path, n: int, warmup: int, idle_s: float) -> dict:
    token = cp.tokens["alice"]
    env = None
    res = {"variant": variant}
    try:
        if fn is None:
            base = a.url
        else:
            env, base = start_envoy(cp, a, fn, workdir)
        c = Client(base, token, cp.ca)
        for _ in range(warmup):
            assert c.get(CM) == 200
        # idle CPU of Envoy and apiserver (discovery rounds, leases) with the connection open but quiet
        e0 = group_cpu(env.process.pid) if env else 0.0
        s0 = cpu_seconds(a.proc.pid)
        st_idle0 = envoy_stats(env) if env else {}
        time.sleep(idle_s)
        e1 = group_cpu(env.process.pid) if env else 0.0
        s1 = cpu_seconds(a.proc.pid)
        st_idle1 = envoy_stats(env) if env else {}
        idle_env, idle_srv = (e1 - e0) / idle_s, (s1 - s0) / idle_s
        st0 = envoy_stats(env) if env else {}
        e0, s0, p0 = (group_cpu(env.process.pid) if env else 0.0), cpu_seconds(a.proc.pid), time.process_time()
        b0 = busy_seconds()
        t0 = time.monotonic()
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            st = c.get(CM)
            lat.append((time.perf_counter() - t) * 1000)
            assert st == 200, st
        el = time.monotonic() - t0
        b1 = busy_seconds()
        p1, s1, e1 = time.process_time(), cpu_seconds(a.proc.pid), (group_cpu(env.process.pid) if env else 0.0)
        st1 = envoy_stats(env) if env else {}
        c.close()
        lat.sort()
        res.update(p50=lat[n // 2], p99=lat[int(n * 0.99) - 1], mean=statistics.mean(lat),
                   client_cpu=(p1 - p0) * 1000 / n, connects=c.connects,
                   srv_cpu=max(0.0, s1 - s0 - idle_srv * el) * 1000 / n,
                   env_cpu_raw=(e1 - e0) * 1000 / n if env else None,
                   env_cpu=max(0.0, e1 - e0 - idle_env * el) * 1000 / n if env else None,
                   idle_env_ms_s=idle_env * 1000, elapsed=el,
                   # CPU busy on the box beyond Envoy + apiserver + this client, per request (other jobs, etcd)
                   other_cpu=max(0.0, (b1 - b0) - (e1 - e0) - (s1 - s0) - (p1 - p0)) * 1000 / n,
                   stats_delta={k: st1[k] - st0[k] for k in st1} if env else {},
                   stats_idle_delta={k: st_idle1[k] - st_idle0[k] for k in st_idle1} if env else {},
                   stats_end=st1)
    finally:
        if env:
            env.stop()
    return res


def fmt_table(results: dict, variants: list) -> list[str]:
    base = statistics.median(r["p50"] for r in results[variants[0][0]])
    out = ["| variant | p50 ms (3 runs) | median p50 | p99 (median) | mean (median) | Envoy CPU ms/req "
           "(idle-subtracted; raw) | apiserver CPU ms/req | client CPU ms/req | other CPU on the box ms/req (3 runs) | upstream cx opened during timed run "
           "(idle window); totals since start (last run) | delta p50 vs straight |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for v, _ in variants:
        rs = results[v]
        med = statistics.median(r["p50"] for r in rs)
        p99 = statistics.median(r["p99"] for r in rs)
        mean = statistics.median(r["mean"] for r in rs)
        if rs[0]["env_cpu"] is None:
            ecpu, cx = "-", "-"
        else:
            ecpu = (f"{statistics.median(r['env_cpu'] for r in rs):.3f}; "
                    f"{statistics.median(r['env_cpu_raw'] for r in rs):.3f}")
            cx = ", ".join(f"{r['stats_delta']['cluster.local.upstream_cx_total']}"
                           f" ({r['stats_idle_delta']['cluster.local.upstream_cx_total']})" for r in rs)
            e = rs[-1]["stats_end"]
            cx += (f"; at end: {e['cluster.local.upstream_cx_total']} total, "
                   f"{e['cluster.local.upstream_cx_http2_total']} h2, "
                   f"{e['cluster.local.ssl.session_reused']} TLS resumed")
        other = ", ".join(f"{r['other_cpu']:.2f}" for r in rs)
        delta = "—" if v == variants[0][0] else f"{med - base:+.3f}"
        p50s = ", ".join(f"{r['p50']:.3f}" for r in rs)
        out.append(f"| {v} | {p50s} | {med:.3f} | {p99:.3f} | {mean:.3f} | "
                   f"{ecpu} | {statistics.median(r['srv_cpu'] for r in rs):.3f} | "
                   f"{statistics.median(r['client_cpu'] for r in rs):.3f} | {other} | {cx} | "
                   f"{delta} |")
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle", type=float, default=3.0, help="seconds of idle CPU measurement per Envoy")
    p.add_argument("--only", default=None, help="comma-separated variant numbers (smoke tests)")
    p.add_argument("--out", default=str(ROOT / "target" / "hop" / "results.md"))
    p.add_argument("--paired", type=int, default=0,
                   help="after the round-robin: this many paired runs (all Envoys up, requests alternated)")
    p.add_argument("--skip-rr", action="store_true", help="only the paired runs")
    a = p.parse_args(argv)
    variants = [v for v in VARIANTS if not a.only or v[0].split()[0] in a.only.split(",")]
    t_all = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="kpp-hop-"))
    cp = ControlPlane(workdir, [("a", DEFAULT_VERSION, "")], kubectl=str(harness.tool("kubectl")))
    results: dict[str, list] = {v: [] for v, _ in variants}
    raw = []
    try:
        cp.start()
        srv = cp.servers["a"]
        st, _, body = cp.api(srv, "/api/v1/namespaces/default/configmaps", "POST",
                             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hop-cm"},
                              "data": {"k": "v" * 64}})
        assert st in (201, 409), body
        print(f"control plane up in {cp.startup_seconds:.0f} s", flush=True)
        for rnd in range(0 if a.skip_rr else a.rounds):
            for v, fn in variants:
                r = measure(cp, srv, v, fn, workdir, a.requests, a.warmup, a.idle)
                r["round"] = rnd
                results[v].append(r)
                raw.append(r)
                print(f"round {rnd} {v}: p50 {r['p50']:.3f} p99 {r['p99']:.3f} mean {r['mean']:.3f} "
                      f"envoy {r['env_cpu']} srv {r['srv_cpu']:.3f} client {r['client_cpu']:.3f} "
                      f"Δstats {r['stats_delta']} idleΔ {r['stats_idle_delta']}", flush=True)
        pair_res = []
        for i in range(a.paired):
            r = paired(cp, srv, variants, workdir, a.requests, a.warmup)
            pair_res.append(r)
            print(f"paired {i}: " + "; ".join(f"{v[:2]} p50 {x['p50']:.3f} cpu {x['env_cpu_raw']}" for v, x in r.items()),
                  flush=True)
    finally:
        cp.stop()
    total = time.monotonic() - t_all
    head = [f"# The local hop: GET one ConfigMap straight vs through Envoy\n",
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores by "
            f"`scripts/k8s/hop.py --requests {a.requests} --warmup {a.warmup} --rounds {a.rounds} --paired {a.paired}` "
            f"({total:.0f} s): one kube-apiserver {DEFAULT_VERSION} (+ etcd), Envoy 1.40 via func-e "
            f"(--concurrency 2), `target/kube_peer_proxy.wasm`. Each cell: a fresh keep-alive HTTPS connection "
            f"(Python http.client, TLS to Envoy / apiserver), {a.warmup} warm-up GETs, {a.requests} sequential "
            f"GETs of `{CM}` (bearer token of alice, Accept: application/json); variants interleaved round-robin, "
            f"each with its own Envoy started and stopped.\n"]
    body = [] if a.skip_rr else fmt_table(results, variants)
    if pair_res:
        base = statistics.median(r[variants[0][0]]["p50"] for r in pair_res)
        body += ["", f"Paired runs ({len(pair_res)}): all variants up at once, {a.requests} rounds of one GET to each "
                 "target in rotating order (drift and other jobs hit every variant alike).", "",
                 "| variant | p50 ms (per run) | median p50 | p99 (median) | mean (median) | Envoy CPU ms/req (idle-subtracted; raw) "
                 "| delta p50 vs straight |", "|---|---|---|---|---|---|---|"]
        for v, _ in variants:
            rs = [r[v] for r in pair_res]
            med = statistics.median(x["p50"] for x in rs)
            cpu = "-" if rs[0]["env_cpu_raw"] is None else (
                f"{statistics.median(x['env_cpu'] for x in rs):.3f}; {statistics.median(x['env_cpu_raw'] for x in rs):.3f}")
            body.append(f"| {v} | {', '.join(format(x['p50'], '.3f') for x in rs)} | {med:.3f} | "
                        f"{statistics.median(x['p99'] for x in rs):.3f} | {statistics.median(x['mean'] for x in rs):.3f} "
                        f"| {cpu} | {'—' if v == variants[0][0] else format(med - base, '+.3f')} |")
        raw.append({"paired": pair_res})
    text = "\n".join(head + body) + "\n"
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(text)
    (Path(a.out).with_suffix(".json")).write_text(json.dumps(raw, indent=1, default=str))
    print(text)
    print(f"written to {a.out} ({total:.0f} s)")


if __name__ == "__main__":
    main()
