#!/usr/bin/env python3
"""The real deployment's hop: plain Envoy, the wasm floor and the filter in front of a real
kube-apiserver on a kubeadm node, measured in one run with paired rounds.

One kubeadm-like control-plane node (kpp.testing.kubeadm_node: kubeadm v1.36.3 writes the PKI and the
apiserver manifest, the real kube-apiserver runs with its flags, one etcd), and five Envoys rendered by
`kpp.render.render_kubeadm` (TLS on both sides, SDS secrets, header stripping), running side by side on
the node's address with their own ports:

* plain  — the kubeadm bootstrap with the wasm filter removed (no bootstrap extension, no peer listener);
* null   — the same with bench/null's filter in the filter's place: the proxy-wasm ABI with nothing in it (two
           VM entries per request, no host call, no SDK): what any proxy-wasm filter costs on this Envoy;
* least  — the same with bench/null/least.wat: exactly the VM entries and host calls the filter makes for a
           local GET (header map, certificate subject, the snapshot's CAS, `:status`), no code and no SDK: what
           any filter that does this job costs on this Envoy's ABI;
* floor  — the same with bench/noop's do-nothing wasm filter (reads `:path`, continues) in the filter's place;
* filter — the kubeadm bootstrap as rendered (filter, discovery service, peer listener).

bench/hopclient (Go, stdlib net/http: HTTP/2 over TLS, keep-alive, one connection per target, as client-go)
sends GETs of one ConfigMap and LISTs of a namespace's ConfigMaps: per round and path `--requests` requests to
every target, one request to each target in turn (the order rotating), never two at once; the apiserver
straight (`direct`) is one more target. Interleaving request by request makes other jobs' bursts hit all
targets alike (blocks of requests per target left CIs of ±100 µs on a loaded box; this gives ±20-30 µs).
Per round and path: the p50 of each target and the paired differences, with a t-distribution 95 % CI
over the rounds. Then one pass with Envoy's access log switched on (a runtime-gated log, off during the
rounds) gives Envoy's own timings per variant (%COMMON_DURATION% between the stream's time points, µs).
`--before other.wasm` adds a sixth Envoy with another build of the filter (A/B of a change).

    make hop   (= bash bench/noop/build.sh && .venv/bin/python scripts/k8s/hop.py --out target/hop/results.md)
    then:      python3 bench/update_doc.py ... (writes target/hop/results.md into docs/benchmarks.md, generated:hop)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from kpp.testing import harness
from kpp.testing.cluster import DEFAULT_VERSION
from kpp.testing.kubeadm_node import APISERVER_PORT, SNI, KubeadmCluster, kubeconfig_credentials
from kpp.testing.proc import OPENER, free_port

ROOT = Path(__file__).resolve().parents[2]
NOOP_WASM = ROOT / "target" / "bench-noop" / "kpp_bench_noop.wasm"  # bench/noop/build.sh
NULL_WASM = ROOT / "target" / "bench-noop" / "null.wasm"  # bench/noop/build.sh, from bench/null/null.wat
LEAST_WASM = ROOT / "target" / "bench-noop" / "least.wasm"  # bench/noop/build.sh, from bench/null/least.wat
HOPCLIENT = ROOT / "target" / "hopclient"
NS = "default"
GET = f"/api/v1/namespaces/{NS}/configmaps/hop-00"
LIST = f"/api/v1/namespaces/{NS}/configmaps"
FIRST_INDEX = 81  # KubeadmNode addresses 127.0.0.81 / 127.0.1.81 (docs/notes: 81-89 are the hop's)
VARIANTS = ("plain", "null", "least", "floor", "filter")
LOG_KEY = "hop.access_log"

# Envoy's own timings: microseconds between the stream's time points (Envoy's StreamInfo).
TIMINGS = {
    "DURATION ms": "%DURATION%",
    "REQUEST_DURATION ms": "%REQUEST_DURATION%",
    "RESPONSE_DURATION ms": "%RESPONSE_DURATION%",
    "upstream service time ms": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
    "request in → upstream send starts": "%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:us)%",
    "upstream send ends → first response byte": "%COMMON_DURATION(US_TX_END:US_RX_BEG:us)%",
    "first response byte → last": "%COMMON_DURATION(US_RX_BEG:US_RX_END:us)%",
    "first response byte → first byte to client": "%COMMON_DURATION(US_RX_BEG:DS_TX_BEG:us)%",
    "last response byte → last byte to client": "%COMMON_DURATION(US_RX_END:DS_TX_END:us)%",
    "whole stream (µs)": "%COMMON_DURATION(DS_RX_BEG:DS_TX_END:us)%",
}
FLAGS = "%RESPONSE_FLAGS%"


def _gated_log(path: Path) -> list:
    fmt = {k: v for k, v in TIMINGS.items()}
    fmt.update(flags=FLAGS, code="%RESPONSE_CODE%", path="%REQ(:PATH)%", cluster="%UPSTREAM_CLUSTER%",
               proto="%PROTOCOL%", bytes="%BYTES_SENT%", user="%REQ(X-REMOTE-USER)%")
    return [{"name": "envoy.access_loggers.file",
             # off (0 %) until the timing pass turns it on through the admin runtime layer
             "filter": {"runtime_filter": {"runtime_key": LOG_KEY,
                                           "percent_sampled": {"numerator": 0, "denominator": "HUNDRED"},
                                           "use_independent_randomness": False}},
             "typed_config": {"@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
                              "path": str(path), "log_format": {"json_format": fmt}}}]


def bootstrap(node, variant: str, port: int, peer_port: int, admin: int, log: Path, wasm: Path,
              modules: dict[str, Path] | None = None) -> dict:
    b = json.loads(node.render_envoy([], wasm, port=port, peer_port=peer_port, admin_port=admin,
                                     access_log=None))
    b["layered_runtime"] = {"layers": [{"name": "admin", "admin_layer": {}}]}
    listeners = b["static_resources"]["listeners"]
    hcm = listeners[0]["filter_chains"][0]["filters"][0]["typed_config"]
    hcm["access_log"] = _gated_log(log)
    if variant in ("filter", "before"):
        return b
    b.pop("bootstrap_extensions")
    b["static_resources"]["listeners"] = [listeners[0]]  # the peer listener's gate is wasm too
    filters = hcm["http_filters"]
    i = next(i for i, f in enumerate(filters) if f["name"] == "envoy.filters.http.wasm")
    if variant == "plain":
        del filters[i]
    else:  # null, least or floor: that filter in the same place, same root id (the floor with probe `path`)
        cfg = filters[i]["typed_config"]["config"]
        cfg["vm_config"]["code"]["local"]["filename"] = str(
            {"null": NULL_WASM, "least": LEAST_WASM, **(modules or {})}.get(variant, NOOP_WASM))
        cfg["configuration"]["value"] = "path"
    return b


def t975(df: int) -> float:
    """Two-sided 95 % quantile of Student's t."""
    table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
             10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101,
             19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052,
             28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}
    if df in table:
        return table[df]
    keys = sorted(table)
    for lo, hi in zip(keys, keys[1:]):
        if lo < df < hi:
            return table[lo] + (table[hi] - table[lo]) * (df - lo) / (hi - lo)
    return 1.960


def ci(xs: list[float]) -> tuple[float, float]:
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def p50(us: list[float]) -> float:
    return statistics.median(us)


def run_client(args: list[str]) -> dict:
    r = subprocess.run([str(HOPCLIENT), *args], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"hopclient failed:\n{r.stderr}")
    return json.loads(r.stdout)


def access_timings(path: Path) -> dict:
    rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []
    out: dict = {"n": len(rows), "flags": sorted({r.get("flags") for r in rows}),
                 "codes": sorted({str(r.get("code")) for r in rows}),
                 "proto": sorted({r.get("proto") for r in rows})}
    for k in TIMINGS:
        vals = [float(r[k]) for r in rows if r.get(k) not in (None, "", "-")]
        out[k] = statistics.median(vals) if vals else None
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--requests", type=int, default=100, help="per round, target and path")
    p.add_argument("--warmup", type=int, default=100, help="per target and path before the first round")
    p.add_argument("--items", type=int, default=40, help="ConfigMaps in the listed namespace")
    p.add_argument("--timing-requests", type=int, default=300, help="per variant and path, access log on")
    p.add_argument("--no-direct", action="store_true", help="leave the apiserver-straight target out")
    p.add_argument("--out", default=str(ROOT / "target" / "hop" / "results.md"))
    p.add_argument("--wasm", default=None, help="the filter's .wasm (default: make build's target/kube_peer_proxy.wasm)")
    p.add_argument("--before", default=None, help="another build of the filter, measured as one more variant `before`")
    p.add_argument("--module", action="append", default=[], metavar="NAME=PATH",
                   help="one more variant NAME: the module at PATH in the filter's place, as `null` and `least` "
                        "(e.g. a variant of bench/null/least.wat without one of its calls); repeatable")
    a = p.parse_args(argv)
    modules = {}
    for m in a.module:
        name, _, path = m.partition("=")
        if not path or name in VARIANTS + ("before", "direct") or not Path(path).is_file():
            raise SystemExit(f"--module {m}: want NAME=PATH, a new name and an existing .wasm")
        modules[name] = Path(path)
    wasm = Path(a.wasm) if a.wasm else harness.wasm_path()
    for f, how in ((NOOP_WASM, "bash bench/noop/build.sh"), (NULL_WASM, "bash bench/noop/build.sh"),
                   (LEAST_WASM, "bash bench/noop/build.sh"),
                   (wasm, "make build")):
        if not f.is_file():
            raise SystemExit(f"{f} is missing: {how}")
    t_all = time.monotonic()
    subprocess.run(["go", "build", "-o", str(HOPCLIENT), "."], cwd=ROOT / "bench" / "hopclient", check=True)
    workdir = Path(tempfile.mkdtemp(prefix="kpp-hop-"))
    cluster = KubeadmCluster(workdir, [("cp-1", "")], first_index=FIRST_INDEX)
    node = cluster.first
    envoys: dict[str, harness.Envoy] = {}
    ports: dict[str, int] = {}
    variants = VARIANTS + (("before",) if a.before else ()) + tuple(modules)
    logs = {v: workdir / f"access-{v}.log" for v in variants}
    try:
        # KubeadmCluster.start without its own Envoy: kubeadm phases, etcd, apiserver, RBAC
        node.prepare()
        node.reload_dir.mkdir(parents=True, exist_ok=True)  # SDS watches it (pki-reload renames into it)
        cluster.etcd.start()
        node.start_apiserver()
        node.wait_apiserver()
        cluster.apply_rbac()
        cms = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"hop-{i:02d}", "namespace": NS,
                                                                      "labels": {"app": "hop"}},
                "data": {"config.yaml": f"item: {i}\n" + "key: " + "v" * 200 + "\n"}} for i in range(a.items)]
        cluster.apply(cms)
        t_up = time.monotonic() - t_all
        print(f"kubeadm node up in {t_up:.0f} s ({workdir})", flush=True)
        for v in variants:
            port, peer, admin = free_port(), free_port(), free_port()
            b = bootstrap(node, v, port, peer, admin, logs[v], Path(a.before) if v == "before" else wasm, modules)
            (workdir / f"envoy-{v}.json").write_text(json.dumps(b, indent=1))
            envoys[v] = harness.Envoy(json.dumps(b, indent=1) + "\n", f"hop-{v}", admin,
                                      workdir=workdir / f"envoy-{v}", log_level="warning",
                                      component_log_level="wasm:info")
            envoys[v].start(timeout=60)
            ports[v] = port
        for v in ("filter", "before"):
            if v in envoys:
                envoys[v].wait_snapshot(60)
        urls = {v: f"https://{node.node_ip}:{ports[v]}" for v in variants}
        targets = [f"{v}={urls[v]}" for v in variants]
        if not a.no_direct:
            targets.insert(0, f"direct=https://{node.apiserver_ip}:{APISERVER_PORT}#{SNI}")
        common = ["-ca", str(node.pki / "ca.crt"), "-token", cluster.token]
        for t in targets:
            common += ["-target", t]
        common += ["-path", f"get={GET}", "-path", f"list={LIST}"]
        t0 = time.monotonic()
        res = run_client(common + ["-rounds", str(a.rounds), "-n", str(a.requests), "-warmup", str(a.warmup)])
        t_rounds = time.monotonic() - t0
        print(f"paired rounds: {t_rounds:.0f} s; protocols {res['proto']}", flush=True)
        # the timing pass: access logs on, the three Envoys only
        for v in variants:
            req = urllib.request.Request(f"{envoys[v].admin_url}/runtime_modify?{LOG_KEY}=100", method="POST")
            with OPENER.open(req, timeout=5) as r:
                assert r.status == 200, r.status
        tim_args = ["-ca", str(node.pki / "ca.crt"), "-token", cluster.token]
        for v in variants:
            tim_args += ["-target", f"{v}={urls[v]}"]
        tim_args += ["-path", f"get={GET}", "-path", f"list={LIST}", "-rounds", "1",
                     "-n", str(a.timing_requests), "-warmup", "0"]
        run_client(tim_args)
        # and the kubeadm clients' way in: admin.conf's client certificate, through the filter only
        # (without the filter nobody asserts a certificate's identity); the filter then reads the subject,
        # adds the identity headers and the request goes to `local` with the front-proxy certificate
        crt, key = kubeconfig_credentials(node.kubeconfig("admin"), workdir / "creds")
        run_client(["-ca", str(node.pki / "ca.crt"), "-cert", str(crt), "-key", str(key),
                    "-target", f"filter={urls['filter']}", "-path", f"get={GET}", "-path", f"list={LIST}",
                    "-rounds", "1", "-n", str(a.timing_requests), "-warmup", "0"])
        # Envoy writes a file access log from a buffer it flushes about once a second: wait (bounded)
        # until every variant's log holds the timing pass's last path, the filter's certificate pass too
        want = {v: a.timing_requests * (2 if v == "filter" else 1) for v in variants}
        deadline = time.monotonic() + 15
        while True:
            have = {v: sum(1 for l in logs[v].read_text().splitlines() if l.strip().endswith("}")
                           and json.loads(l).get("path") == LIST) for v in variants}
            if all(have[v] >= want[v] for v in variants) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        timings = {}
        for v in variants:
            rows = [json.loads(l) for l in logs[v].read_text().splitlines() if l.strip()]
            for name, path in (("get", GET), ("list", LIST)):
                for who, cert in ((v, False), (f"{v} (certificate)", True)):
                    sel = [r for r in rows if r.get("path") == path and (r.get("user") not in (None, "", "-")) == cert]
                    if not sel:
                        continue
                    tmp = workdir / f"t-{who}-{name}.jsonl".replace(" ", "_")
                    tmp.write_text("\n".join(json.dumps(r) for r in sel[1:]))  # the connection's first left out
                    timings[(who, name)] = access_timings(tmp)
        stats = {v: envoys[v].stats(r"^cluster\.local(-anon)?\.upstream_(cx|rq)_total$") for v in variants}
    finally:
        for e in envoys.values():
            e.stop()
        cluster.stop()
    total = time.monotonic() - t_all
    text = report(a, res, timings, stats, total, t_up, t_rounds, targets, variants)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(
        {"client": res, "timings": {f"{v}/{n}": t for (v, n), t in timings.items()}, "stats": stats}))
    print(text)
    print(f"written to {out} ({total:.0f} s)")


def report(a, res, timings, stats, total, t_up, t_rounds, targets, variants) -> str:
    names = [t.split("=", 1)[0] for t in targets]
    per = {}  # (target, path) -> [p50 per round, µs]
    for s in res["samples"]:
        per.setdefault((s["target"], s["path"]), []).append((s["round"], p50(s["us"]), s["us"]))
    lines = [
        "The real deployment's hop, measured "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} cores by "
        f"`scripts/k8s/hop.py --rounds {a.rounds} --requests {a.requests}` ({total:.0f} s: node up {t_up:.0f} s, "
        f"paired rounds {t_rounds:.0f} s; load average before the run's end "
        f"{os.getloadavg()[0]:.1f}). kube-apiserver {DEFAULT_VERSION} on a kubeadm node, Envoy 1.40 "
        "(`--concurrency 2`) rendered by `render_kubeadm`; client bench/hopclient (Go net/http, "
        f"{'/'.join(sorted(set(res['proto'].values())))}, TLS, one kept-alive connection per target, bearer token). "
        f"GET `{GET}`; LIST `{LIST}` ({a.items} ConfigMaps). Each round and path: {a.requests} requests to every "
        "target, one to each in turn (order rotating), never two at once; µs.", "",
        "| target | GET p50 (median of the rounds' p50) | GET p90 | LIST p50 | LIST p90 | first request (new connection) |",
        "|---|---:|---:|---:|---:|---:|"]
    for n in names:
        row = [n]
        for path in ("get", "list"):
            rs = per[(n, path)]
            row.append(f"{statistics.median(r[1] for r in rs):.0f}")
            row.append(f"{statistics.median(r[2][int(len(r[2]) * 0.9)] for r in rs):.0f}")
        row.append(f"{res['first_us'][n]:.0f}")
        lines.append("| " + " | ".join(row) + " |")
    pairs = [("filter", "plain"), ("null", "plain"), ("least", "plain"), ("least", "null"), ("filter", "least"),
             ("floor", "plain"), ("floor", "null"), ("filter", "floor")]
    if "before" in names:
        pairs += [("before", "plain"), ("filter", "before")]
    added = [n for n in names if n not in VARIANTS + ("before", "direct")]  # --module variants
    pairs += [(n, "plain") for n in added] + [(n, "least") for n in added]
    if "direct" in names:
        pairs.append(("plain", "direct"))
    lines += ["", f"Paired differences of the per-round p50 ({a.rounds} rounds; mean ± 95 % CI, t-distribution):", "",
              "| difference | GET µs | LIST µs |", "|---|---:|---:|"]
    diffs = {}
    for x, y in pairs:
        row = [f"{x} − {y}"]
        for path in ("get", "list"):
            dx = {r[0]: r[1] for r in per[(x, path)]}
            dy = {r[0]: r[1] for r in per[(y, path)]}
            d = [dx[k] - dy[k] for k in sorted(dx)]
            m, h = ci(d)
            diffs[(x, y, path)] = (m, h)
            row.append(f"{m:+.1f} ± {h:.1f}")
        lines.append("| " + " | ".join(row) + " |")
    tv = list(variants) + ["filter (certificate)"]
    lines += ["", f"Envoy's own timings ({a.timing_requests} requests per variant and path after the rounds, "
              "access log on; medians, µs unless named ms). `filter (certificate)`: the same requests with "
              "admin.conf's client certificate instead of the token (the filter asserts its identity; the "
              "apiserver authenticates the front proxy), through the filter only:", "",
              "| timing | " + " | ".join(f"{v} {p}" for p in ("GET", "LIST") for v in tv) + " |",
              "|---|" + "---:|" * (2 * len(tv))]
    for k in TIMINGS:
        cells = []
        for p in ("get", "list"):
            for v in tv:
                val = timings[(v, p)][k]
                cells.append("-" if val is None else f"{val:g}")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines.append("| response flags | " + " | ".join(
        ",".join(timings[(v, p)]["flags"]) for p in ("get", "list") for v in tv) + " |")
    cx = "; ".join(f"{v}: " + ", ".join(f"{k.split('.')[1]} {k.rsplit('.', 1)[1]} {n}" for k, n in sorted(s.items()))
                   for v, s in stats.items())
    lines += ["", f"Upstream connections and requests per Envoy over the whole run: {cx}.", "",
              "| goal | measured | holds |", "|---|---|---|"]
    for path, label in (("get", "local GET"), ("list", "LIST")):
        m, h = diffs[("filter", "plain", path)]
        nm, nh = diffs[("null", "plain", path)]
        lm, lh = diffs[("least", "plain", path)]
        lines.append(f"| filter ≤ plain Envoy + 50 µs p50 ({label}) | filter − plain {m:+.1f} ± {h:.1f} µs "
                     f"(the null filter alone: {nm:+.1f} ± {nh:.1f}; the least of this job, least.wat: "
                     f"{lm:+.1f} ± {lh:.1f}) | {'yes' if m <= 50 else 'no'} (mean) |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
