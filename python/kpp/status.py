"""kube-peer-proxy-status: what each node's filter sees, from its Envoy admin endpoint.

    kube-peer-proxy-status a=http://127.0.0.1:19441 b=http://127.0.0.1:19442 c=http://127.0.0.1:19443
    kube-peer-proxy-status --watch 127.0.0.1:9901          # on a node; refreshes in place, Ctrl-C quits

Per node (its Envoy's /stats/prometheus, the only thing read): the snapshot generation and the age of the
last completed discovery round; each member, fresh or not, and how long ago both its discovery parts were
last fetched; requests rerouted to a peer and the filter's 503s per second by code and by reason, and
discovery errors per second, as rates between two scrapes (--interval apart; in --watch, between
refreshes); the resources this node sent to a peer; and the kubelet's probes of kube-apiserver that came
through this Envoy, which should be none (a WARNING otherwise). The filter does not publish which member
serves which resource; the rerouted resources (by their counters' labels) are the ones that node does not
serve itself but a peer does, and the 503s' resources are those only unreachable or stale members serve.

Standard library only (an operator runs it on a control-plane node).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import time
import urllib.request
from dataclasses import dataclass, field

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
PREFIX = "kube_peer_proxy_"
# Envoy's counter of the kubelet's probes that reached an apiserver through the client listener, not
# counting the static pod's own readiness probe (kpp.render.KUBELET_PROBE_VCLUSTER; docs/deploy.md
# "Kubelet probes through the proxy"). Zero unless kube-apiserver's probes moved to <node-ip>:6443.
PROBES = "envoy_vhost_vcluster_upstream_rq_total"
PROBES_VCLUSTER = "kubelet_probe"
# No proxy: the admin endpoint is on loopback, and an HTTP_PROXY in the environment must not see it.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class Scrape:
    """One node's kube_peer_proxy_* samples (and PROBES) at one moment."""
    at: float
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    error: str | None = None

    def get(self, name: str, **labels) -> list[tuple[dict, float]]:
        out = []
        for (n, ls), v in self.samples.items():
            d = dict(ls)
            if n == name and all(d.get(k) == val for k, val in labels.items()):
                out.append((d, v))
        return out

    def one(self, name: str) -> float | None:
        vals = self.get(name)
        return vals[0][1] if vals else None


def parse(text: str, at: float) -> Scrape:
    s = Scrape(at)
    for line in text.splitlines():
        if not line.startswith((PREFIX, PROBES + "{")):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
        s.samples[(m.group(1), labels)] = value
    return s


def admin_url(spec: str) -> tuple[str, str]:
    """NAME=URL, URL or HOST:PORT -> (name, base URL)."""
    name, _, url = spec.partition("=") if "=" in spec else ("", "", spec)
    if not url.startswith(("http://", "https://")):
        url = "http://" + url
    url = url.rstrip("/")
    return name or url.split("//", 1)[1], url


def scrape(url: str, timeout: float = 3.0) -> Scrape:
    now = time.time()
    try:
        with _OPENER.open(url + "/stats/prometheus", timeout=timeout) as r:
            return parse(r.read().decode("utf-8", "replace"), now)
    except OSError as e:
        return Scrape(now, error=f"{type(e).__name__}: {getattr(e, 'reason', e)}")


def _rates(prev: Scrape | None, cur: Scrape, name: str, key) -> dict[str, float]:
    """Per-second increase of a counter between two scrapes, summed by key(labels). A counter that went
    down (Envoy restarted) counts from zero."""
    out: dict[str, float] = {}
    if prev is None or prev.error or cur.at <= prev.at:
        return out
    dt = cur.at - prev.at
    for labels, v in cur.get(name):
        before = prev.samples.get((name, tuple(sorted(labels.items()))), 0.0)
        inc = v - before if v >= before else v
        if inc > 0:
            k = key(labels)
            out[k] = out.get(k, 0.0) + inc / dt
    return out


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = int(seconds)
    return f"{s} s ago" if s < 120 else f"{s // 60} min ago" if s < 7200 else f"{s // 3600} h ago"


def _rate_text(rates: dict[str, float]) -> str:
    if not rates:
        return "none"
    return "  ".join(f"{k} {v:.1f}" for k, v in sorted(rates.items(), key=lambda kv: (-kv[1], kv[0])))


def _gvr(ls: dict) -> str:
    return "/".join(x for x in (ls.get("group") or "core", ls.get("version", ""), ls.get("resource", "")) if x)


def render_node(name: str, prev: Scrape | None, cur: Scrape, width: int) -> list[str]:
    if cur.error:
        return [f"node {name}: admin endpoint unreachable ({cur.error})"]
    gen = cur.one(PREFIX + "snapshot_generation")
    age = cur.one(PREFIX + "snapshot_age_seconds")
    fresh = sorted(cur.get(PREFIX + "server_fresh"), key=lambda x: x[0].get("server", ""))
    last = {ls.get("server"): v for ls, v in cur.get(PREFIX + "server_last_success_age_seconds")}
    if gen is None and not fresh:
        return [f"node {name}: no kube_peer_proxy metrics (is the filter loaded? no discovery round yet?)"]
    n_fresh = sum(1 for _, v in fresh if v == 1)
    lines = [f"node {name}   generation {int(gen) if gen is not None else '-'}   last round "
             f"{_ago(age)}   members {n_fresh}/{len(fresh)} fresh"]
    cells = [f"{ls.get('server', '?')}: {'fresh' if v == 1 else 'NOT FRESH'}, ok {_ago(last.get(ls.get('server')))}"
             for ls, v in fresh]
    lines += _wrap("  members   ", cells, width)
    rer = _rates(prev, cur, PREFIX + "rerouted_request_total", lambda ls: ls.get("code", "?"))
    err = _rates(prev, cur, PREFIX + "peer_proxy_errors_total", lambda ls: ls.get("type", "?"))
    disc = _rates(prev, cur, PREFIX + "discovery_sync_errors_total",
                  lambda ls: f"{ls.get('server', '?')} {ls.get('type', '?')}")
    if prev is None:
        lines.append("  rates     (one scrape: no rates)")
    else:
        lines.append(f"  reroutes/s by code      {_rate_text(rer)}")
        lines.append(f"  filter 503s/s by reason {_rate_text(err)}")
        lines.append(f"  discovery errors/s      {_rate_text(disc)}")
    probes = cur.get(PROBES, envoy_virtual_cluster=PROBES_VCLUSTER)
    if probes:  # absent: a bootstrap without the virtual cluster (rendered before it existed)
        n = sum(v for _, v in probes)
        rate = _rates(prev, cur, PROBES, lambda ls: ls.get("envoy_virtual_cluster", "")).get(PROBES_VCLUSTER, 0.0)
        cells = [f"{int(n)} total" + (f", {rate:.1f}/s" if prev is not None else "")]
        if n:
            cells.append("WARNING: kube-apiserver probed via Envoy (docs/deploy.md)")
        lines += _wrap("  kubelet probes proxied  ", cells, width)
    totals: dict[str, float] = {}
    for ls, v in cur.get(PREFIX + "rerouted_request_total"):
        totals[_gvr(ls)] = totals.get(_gvr(ls), 0) + v
    lines += _wrap("  served by a peer here (rerouted, total): ",
                   [f"{k} {int(v)}" for k, v in sorted(totals.items(), key=lambda kv: -kv[1])] or ["none"], width)
    only_gone: dict[str, float] = {}
    for ls, v in cur.get(PREFIX + "peer_proxy_errors_total"):
        if ls.get("type") == "peer_unavailable":
            only_gone[_gvr(ls)] = only_gone.get(_gvr(ls), 0) + v
    if only_gone:
        lines += _wrap("  503 peer_unavailable (only unreachable/stale members serve it), total: ",
                       [f"{k} {int(v)}" for k, v in sorted(only_gone.items(), key=lambda kv: -kv[1])], width)
    return lines


def _wrap(head: str, cells: list[str], width: int) -> list[str]:
    """head + cells joined by "; ", continued on indented lines, none wider than width."""
    lines, cur = [], head
    pad = " " * min(len(head), 12)
    for i, c in enumerate(cells):
        piece = c + (";" if i < len(cells) - 1 else "")
        if len(cur) + len(piece) + 1 > width and cur.strip() and cur != head:
            lines.append(cur.rstrip())
            cur = pad
        cur += ("" if cur in (head, pad) else " ") + piece
    lines.append(cur.rstrip())
    return [ln[:width] for ln in lines]


def report(nodes: list[tuple[str, str]], prev: dict[str, Scrape] | None, cur: dict[str, Scrape], width: int) -> str:
    span = ""
    if prev:
        dts = [cur[n].at - prev[n].at for n, _ in nodes if n in prev]
        span = f"   rates over the last {max(dts):.1f} s" if dts else ""
    out = [f"kube-peer-proxy status   {time.strftime('%H:%M:%S')}{span}"[:width]]
    for name, _url in nodes:
        out.append("")
        out += render_node(name, (prev or {}).get(name), cur[name], width)
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="kube-peer-proxy-status", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("nodes", nargs="+", metavar="[NAME=]ADMIN",
                   help="a node's Envoy admin endpoint: http://127.0.0.1:9901, 127.0.0.1:9901, or a=... to name it")
    p.add_argument("--watch", action="store_true", help="refresh in place every --interval seconds until Ctrl-C")
    p.add_argument("--interval", type=float, default=2.0,
                   help="seconds between the two scrapes the rates come from (default %(default)s)")
    p.add_argument("--width", type=int, default=0, help="output width (default: the terminal's)")
    a = p.parse_args(argv)
    nodes = [admin_url(n) for n in a.nodes]

    def width() -> int:
        return a.width or shutil.get_terminal_size((120, 40)).columns

    def scrape_all() -> dict[str, Scrape]:
        return {name: scrape(url) for name, url in nodes}

    prev = scrape_all()
    if not a.watch:
        time.sleep(a.interval)
        print(report(nodes, prev, scrape_all(), width()))
        return 0
    try:
        sys.stdout.write("\x1b[H\x1b[2J" + report(nodes, None, prev, width()) + "\n")
        sys.stdout.flush()
        while True:
            time.sleep(a.interval)
            cur = scrape_all()
            # home, the report with each line cleared to its end, then clear what is below
            text = report(nodes, prev, cur, width()).replace("\n", "\x1b[K\n")
            sys.stdout.write("\x1b[H" + text + "\x1b[K\n\x1b[J")
            sys.stdout.flush()
            prev = cur
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
