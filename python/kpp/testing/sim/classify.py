"""Which servers served which API set when, and what every response means against that timeline.

Two timelines per server, both as closed-open intervals of time.monotonic(), defined the same way with and
without the filter (nothing here asks the filter what it knows):

* **running** — the process is up: from `start()` returning to the moment `stop()` is called.
* **in service** — the server is ready *and* its discovery answers: from the first moment its `/readyz`
  answers 200 (through its Envoy) and a direct `GET /apis` on it answers 200, until it is stopped.
  Leaving the front load balancer does not end it (peers can still reach the server).

Every start, stop, ready and load-balancer change is a **change**. A request is *in a change window* when
its life [sent, answered] overlaps [change, change + grace], grace being the filter's `refresh_interval`:
one discovery round, plus (through the overlap) the request's own duration.

A 404 for a resource (not for an object) is
* **false** when during the request's whole life some *in-service* server served the GVR: the cluster
  served it, the client was told it does not exist;
* **while a server was starting** when it was not false but some *running* server served the GVR the
  whole time: a server had started but its /readyz or discovery had not answered yet;
* **genuine** otherwise (nobody running served it, e.g. old-only GVRs after the last old server stopped).
Both kinds of non-genuine 404 fail the filter run, change window or not.

**Availability** of a class (old-only, new-only, common): of the requests (get/list/create/delete; watches
are counted apart) for a GVR that some in-service server served during the request's whole life and
that are *not* in a change window, the share answered 2xx.

503s are told apart by who wrote them: the filter (a `Status` whose message starts "kube-peer-proxy:"),
Envoy because an upstream was unreachable (a `Status` naming the reset), or Envoy because the wasm VM
failed (its local reply mapper gives a `Status` with an empty message).

A request that overlaps a change of the serving set is judged against the whole interval, so a response
is never called false because of where exactly inside its lifetime the server changed.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass, field

from kpp.testing.sim import gvrs as gvr_defs


@dataclass
class Timeline:
    service: list[tuple[str, str, float, float]] = field(default_factory=list)
    running: list[tuple[str, str, float, float]] = field(default_factory=list)
    _open_service: dict[str, tuple[str, float]] = field(default_factory=dict)
    _open_running: dict[str, tuple[str, float]] = field(default_factory=dict)
    changes: list[float] = field(default_factory=list)  # every start, stop, ready and LB change

    def begin(self, kind: str, server: str, apiset: str, t: float):
        opened = self._open_service if kind == "service" else self._open_running
        if server in opened:
            raise ValueError(f"{server} already has an open {kind} interval")
        opened[server] = (apiset, t)
        self.changes.append(t)

    def end(self, kind: str, server: str, t: float):
        opened, closed = ((self._open_service, self.service) if kind == "service"
                          else (self._open_running, self.running))
        apiset, since = opened.pop(server)
        closed.append((server, apiset, since, t))
        self.changes.append(t)

    def change(self, t: float):
        """A change that is not a begin or end, e.g. a server leaving or entering the load balancer."""
        self.changes.append(t)

    def intervals(self, kind: str) -> list[tuple[str, str, float, float]]:
        opened, closed = ((self._open_service, self.service) if kind == "service"
                          else (self._open_running, self.running))
        return closed + [(s, a, t, math.inf) for s, (a, t) in opened.items()]


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _covers(merged: list[tuple[float, float]], t0: float, t1: float) -> bool:
    return any(a <= t0 and t1 <= b for a, b in merged)


FILTER_PREFIX = "kube-peer-proxy:"  # the filter's own Status messages start with this (src/request/reply.rs)
F503 = "503 from the filter (Status, Retry-After)"
E503 = "503 from Envoy: upstream unreachable (Status, Retry-After)"
VM503 = "503 from Envoy: wasm VM failed (Status, empty message)"


class Classifier:
    def __init__(self, timeline: Timeline, apisets: dict, grace: float):
        """apisets: name ("old"/"new") → fake ApiSet; grace: the change window in seconds."""
        self.grace = grace
        self.changes = sorted(timeline.changes)
        self.gvrs = {g["id"]: g for g in gvr_defs.table()}
        self.service: dict[int, list] = {}
        self.running: dict[int, list] = {}
        for gid, g in self.gvrs.items():
            for kind, target in (("service", self.service), ("running", self.running)):
                target[gid] = _merge([(t0, t1) for _, a, t0, t1 in timeline.intervals(kind)
                                      if gvr_defs.served_by(apisets[a], g)])

    def in_change_window(self, t0: float, t1: float) -> bool:
        """[t0, t1] overlaps [c, c + grace] for some change c."""
        i = bisect.bisect_left(self.changes, t0 - self.grace)
        return i < len(self.changes) and self.changes[i] <= t1

    def servable(self, rec: list) -> bool:
        """Some in-service server served the record's GVR during its whole life."""
        return _covers(self.service[rec[3]], rec[0], rec[1])

    def outcome(self, rec: list) -> str:
        t0, t1, op, gid, status, retry_after, served, nf, is_status, err, message = rec
        if status == 0:
            return "no response: timeout" if err == "timeout" else "no response: connection error"
        if 200 <= status < 300:
            return "2xx"
        if status == 404:
            if nf == "object":
                return "404 object not found"
            if _covers(self.service[gid], t0, t1):
                return "FALSE 404"
            if _covers(self.running[gid], t0, t1):
                return "404 while a server was starting"
            return "404 genuine"
        if status == 503:
            if retry_after and is_status and not served:
                if message.startswith(FILTER_PREFIX):
                    return F503
                return E503 if message else VM503
            if retry_after and is_status:
                return "503 Status with Retry-After from the apiserver"
            return "503 with Retry-After (not a Status)" if retry_after else "503 without Retry-After"
        if status >= 500:
            return f"other 5xx ({status})"
        return f"other 4xx ({status})"


OUTCOME_ORDER = ["2xx", "FALSE 404", "404 while a server was starting", "404 genuine", "404 object not found",
                 F503, E503, VM503, "503 with Retry-After (not a Status)", "503 without Retry-After"]


def summarize(result: dict, timeline: Timeline, apisets: dict, store_missing: list[str], grace: float) -> dict:
    """Counts for the table from the load generator's result and the timeline."""
    clf = Classifier(timeline, apisets, grace)
    gmap = clf.gvrs
    outcomes: Counter = Counter()
    false_by_class: Counter = Counter()
    false_examples: list = []
    starting_by_class: Counter = Counter()
    watch_outcomes: Counter = Counter()
    judged: Counter = Counter()  # class → requests for a GVR in service, outside change windows
    available: Counter = Counter()  # class → of those, answered 2xx
    in_window: Counter = Counter()  # class → requests for a GVR in service, in a change window (not judged)
    unavailable: Counter = Counter()  # (class, outcome) of the judged requests that were not 2xx
    unavailable_examples: list = []
    requests = [r for r in result["records"] if r[2] != "watch"]
    latencies = sorted(r[1] - r[0] for r in requests)
    for r in result["records"]:
        o = clf.outcome(r)
        if r[2] == "watch":
            watch_outcomes[o] += 1
        else:
            outcomes[o] += 1
        if o in ("FALSE 404", "404 while a server was starting") and len(false_examples) < 10:
            false_examples.append((r, gmap[r[3]]["collection"], o))
        if r[2] == "watch":
            continue
        cls = gmap[r[3]]["cls"]
        if o == "FALSE 404":
            false_by_class[cls] += 1
        elif o == "404 while a server was starting":
            starting_by_class[cls] += 1
        if clf.servable(r):
            if clf.in_change_window(r[0], r[1]):
                in_window[cls] += 1
            else:
                judged[cls] += 1
                if o == "2xx":
                    available[cls] += 1
                else:
                    unavailable[(cls, o)] += 1
                    if len(unavailable_examples) < 10:
                        unavailable_examples.append((r, gmap[r[3]]["collection"], o))
    duration = result["stop"] - result["start"]
    in_run = [r for r in requests if r[1] <= result["stop"]]
    lost = list(result["lost"]) + [[name, None, "store", None] for name in store_missing]
    return {
        "duration": duration,
        "grace": grace,
        "requests": len(requests),
        "rate": len(in_run) / duration if duration > 0 else 0.0,
        "outcomes": outcomes,
        "watch_outcomes": watch_outcomes,
        "false_by_class": false_by_class,
        "starting_by_class": starting_by_class,
        "false_examples": false_examples,
        "false_404": outcomes["FALSE 404"] + watch_outcomes["FALSE 404"],
        "starting_404": outcomes["404 while a server was starting"] + watch_outcomes["404 while a server was starting"],
        "judged": judged,
        "available": available,
        "in_window": in_window,
        "availability": {c: (100.0 * available[c] / judged[c] if judged[c] else None) for c in gvr_defs.CLASSES},
        "unavailable": unavailable,
        "unavailable_examples": unavailable_examples,
        "lost_writes": len(lost),
        "lost": lost,
        "created": len(result["created"]),
        "deleted": len(result["deleted"]),
        "delete_unanswered": len(result.get("delete_unanswered", [])),
        "p50": latencies[len(latencies) // 2] if latencies else 0.0,
        "p99": latencies[int(len(latencies) * 0.99)] if latencies else 0.0,
        "max": latencies[-1] if latencies else 0.0,
        "watch": result["watch"],
        "hung_threads": result["hung_threads"],
        "workers": result["workers"],
    }


def availability_text(s: dict, cls: str) -> str:
    pct = s["availability"][cls]
    return "-" if pct is None else f"{pct:.2f}% ({s['available'][cls]}/{s['judged'][cls]})"


def _row_keys(summaries: dict) -> list[str]:
    seen = set()
    for s in summaries.values():
        seen |= set(s["outcomes"]) | set(s["watch_outcomes"])
    rest = sorted(k for k in seen if k not in OUTCOME_ORDER)
    return [k for k in OUTCOME_ORDER if k in seen or k in ("FALSE 404",)] + rest


def table(summaries: dict) -> str:
    """The comparison table, one column per mode."""
    modes = list(summaries)
    rows: list[tuple[str, list[str]]] = []

    def add(label, fn):
        rows.append((label, [fn(summaries[m]) for m in modes]))

    add("duration (s)", lambda s: f"{s['duration']:.1f}")
    add("clients (workers + watchers)", lambda s: f"{s['workers']} + {len(s['watch'])}")
    add("requests (get/list/create/delete)", lambda s: str(s["requests"]))
    add("achieved req/s", lambda s: f"{s['rate']:.1f}")
    add("latency p50 / p99 / max (ms)",
        lambda s: f"{s['p50'] * 1000:.1f} / {s['p99'] * 1000:.1f} / {s['max'] * 1000:.0f}")
    rows.append(("responses:", ["" for _ in modes]))
    for key in _row_keys(summaries):
        add(f"  {key}", lambda s, k=key: str(s["outcomes"][k]))
        if key == "FALSE 404":
            for cls in gvr_defs.CLASSES:
                add(f"    false 404, {cls}", lambda s, c=cls: str(s["false_by_class"][c]))
        if key == "404 while a server was starting":
            for cls in gvr_defs.CLASSES:
                add(f"    while starting, {cls}", lambda s, c=cls: str(s["starting_by_class"][c]))
    rows.append(("availability (2xx for a GVR in service, outside change windows):", ["" for _ in modes]))
    for cls in gvr_defs.CLASSES:
        add(f"  {cls}", lambda s, c=cls: availability_text(s, c))
    add("  in change windows, not judged (grace)", lambda s: "{} ({:.0f} ms)".format(
        sum(s["in_window"].values()), s["grace"] * 1000))
    rows.append(("watch starts (initial response):", ["" for _ in modes]))
    for key in _row_keys(summaries):
        add(f"  {key}", lambda s, k=key: str(s["watch_outcomes"][k]))
    add("watch streams / events / broken", lambda s: "{} / {} / {}".format(
        sum(w["starts"] for w in s["watch"].values()), sum(w["events"] for w in s["watch"].values()),
        sum(w["breaks"] for w in s["watch"].values())))
    add("objects created / deleted / delete without verdict",
        lambda s: f"{s['created']} / {s['deleted']} / {s.get('delete_unanswered', 0)}")
    add("LOST WRITES", lambda s: str(s["lost_writes"]))
    add("FALSE 404 (all, incl. watches)", lambda s: str(s["false_404"]))
    add("404 while a server was starting (all)", lambda s: str(s["starting_404"]))
    add("wasm VM panics (Envoy logs)", lambda s: "-" if s.get("wasm_panics") is None else str(s["wasm_panics"]))
    add("hung client threads", lambda s: str(s["hung_threads"]))

    width = max(len(label) for label, _ in rows) + 2
    colw = [max(len(m), *(len(vals[i]) for _, vals in rows)) + 2 for i, m in enumerate(modes)]
    lines = ["".ljust(width) + "".join(m.rjust(w) for m, w in zip(modes, colw))]
    lines.append("-" * (width + sum(colw)))
    for label, vals in rows:
        lines.append(label.ljust(width) + "".join(v.rjust(w) for v, w in zip(vals, colw)))
    return "\n".join(lines)
