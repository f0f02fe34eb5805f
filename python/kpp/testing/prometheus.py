"""A real Prometheus (Debian's `prometheus` binary) for the monitoring tests, and what they need around it.

* `Prometheus`: one process on 127.0.0.1 with a temporary config and TSDB, scraping Envoy admin endpoints
  (`/stats/prometheus`) every second from a file_sd target file the test rewrites while it runs, and
  evaluating a rule file every second.
* `scaled_rules`: deploy/monitoring's rules with every duration (`for:`, range selectors) divided by a
  factor, so a test sees an alert fire and clear in seconds instead of minutes. Thresholds stay.
* `parse_exposition` and `selectors`: the series an Envoy exports, and the metric names, label matchers
  and grouping labels a PromQL expression uses (a small tokenizer for the expressions in
  deploy/monitoring, not a PromQL parser), so a test can compare the two.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from collections import deque
from pathlib import Path

import yaml

from kpp.testing.proc import die_with_parent, free_port, get_json, wait_until

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "kube-peer-proxy.rules.yaml"
DASHBOARD = MONITORING / "dashboard.json"
JOB = "kube-peer-proxy"

_die_with_parent = die_with_parent(signal.SIGTERM)


def binary(name: str) -> str:
    """`prometheus` or `promtool` (Debian package prometheus, installed by scripts/setup.sh)."""
    path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
    if not path:
        raise RuntimeError(f"{name} is missing: run scripts/setup.sh (apt package prometheus)")
    return path


# ---- durations ----------------------------------------------------------------------------------------

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")


def seconds(text: str) -> float:
    """A Prometheus duration ("5m", "1h30m") in seconds."""
    parts = _DURATION.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return sum(int(n) * _UNITS[u] for n, u in parts)


def _fmt(s: float) -> str:
    return f"{max(1, round(s))}s"


def scale_expr(expr: str, factor: float) -> str:
    """Range selectors and offsets divided by factor (at least 1 s)."""
    expr = re.sub(r"\[([0-9a-z]+)\]", lambda m: f"[{_fmt(seconds(m.group(1)) / factor)}]", expr)
    return re.sub(r"\boffset\s+([0-9a-z]+)", lambda m: f"offset {_fmt(seconds(m.group(1)) / factor)}", expr)


def scaled_rules(factor: float, source: Path = RULES) -> str:
    """The rule file with every `for:` and every range/offset in an expression divided by factor."""
    doc = yaml.safe_load(source.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule["expr"] = scale_expr(rule["expr"], factor)
            if "for" in rule:
                rule["for"] = _fmt(seconds(rule["for"]) / factor)
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


def rules(source: Path = RULES) -> list[dict]:
    """Every rule of the file (recording and alerting), as written."""
    return [r for g in yaml.safe_load(source.read_text())["groups"] for r in g["rules"]]


def dashboard_queries(rate_interval: str = "5m", source: Path = DASHBOARD) -> list[tuple[str, str]]:
    """(panel title, expression) of every dashboard target, Grafana's variables replaced: $instance by
    all nodes, $__rate_interval by rate_interval."""
    out = []
    d = json.loads(source.read_text())
    for p in d["panels"]:
        for t in p.get("targets", []):
            out.append((p["title"], t["expr"].replace("$instance", ".*").replace("$__rate_interval", rate_interval)))
    for a in d.get("annotations", {}).get("list", []):
        if "expr" in a:
            out.append((f"annotation {a['name']}", a["expr"]))
    return out


# ---- exposition and selectors ---------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def parse_exposition(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample of a Prometheus text exposition (Envoy's /stats/prometheus)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = {k: v for k, _op, v in _LABEL.findall(m.group(3) or "")}
        try:
            value = float(m.group(4))
        except ValueError:
            continue
        out.append((m.group(1), labels, value))
    return out


_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "or", "and", "unless", "bool",
             "offset", "inf", "nan"}


def selectors(expr: str) -> tuple[list[tuple[str, list[tuple[str, str, str]]]], set[str]]:
    """The vector selectors of a PromQL expression, as (metric name, [(label, op, value)]), and the label
    names it groups or matches on (by/without/on/ignoring). Function names (an identifier before "(")
    and keywords are not selectors."""
    sels, grouping = [], set()
    # label lists of by (...), on (...) etc. first, then drop them so they are not read as selectors
    for m in re.finditer(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        grouping.update(x.strip() for x in m.group(2).split(",") if x.strip())
    rest = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    rest = re.sub(r'"(?:[^"\\]|\\.)*"(?![^{]*\})', '""', rest)  # string literals outside braces
    rest = re.sub(r"\[[^\]]*\]", "", rest)
    pos = 0
    ident = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
    while pos < len(rest):
        c = rest[pos]
        if c == "{":  # a selector without a name: {__name__=...}
            end = rest.index("}", pos)
            sels.append(("", [(k, op, v) for k, op, v in _LABEL.findall(rest[pos + 1:end])]))
            pos = end + 1
            continue
        m = ident.match(rest, pos)
        if not m or (pos and (rest[pos - 1].isalnum() or rest[pos - 1] in "_.$")):
            pos += 1
            continue
        name, pos = m.group(0), m.end()
        after = rest[pos:].lstrip()
        if name.lower() in _KEYWORDS or after.startswith("("):
            continue
        matchers = []
        if after.startswith("{"):
            start = rest.index("{", pos)
            end = rest.index("}", start)
            matchers = [(k, op, v) for k, op, v in _LABEL.findall(rest[start + 1:end])]
            pos = end + 1
        sels.append((name, matchers))
    return sels, grouping


def _alternatives(regex: str) -> list[str] | None:
    """The words of a regex that is only a|b|c of plain words, else None."""
    parts = regex.split("|")
    return parts if all(re.fullmatch(r"[A-Za-z0-9_\-]+", p) for p in parts) else None


def missing_names(exprs: list[tuple[str, str]], series: list[tuple[str, dict, float]], rule_list: list[dict],
                  extra_names=("ALERTS", "up"), target_labels=("instance", "job")) -> list[str]:
    """What the expressions name that the series do not have: a metric name, a label a selector matches
    or an expression groups on, or a value of a label matcher (every word of an `a|b` regex). A
    recording rule's series stand for the series of the metrics its expressions read, plus its static
    labels. Each problem is one line naming the expression."""
    by_name: dict[str, list[dict]] = {}
    for name, labels, _v in series:
        by_name.setdefault(name, []).append(labels)
    for name, labels in recorded_series(rule_list, by_name).items():
        by_name[name] = labels
    problems = []
    for where, expr in exprs:
        sels, grouping = selectors(expr)
        seen_labels = set(target_labels)
        for name, matchers in sels:
            if name in extra_names:
                seen_labels |= {"alertname", "alertstate"}
                continue
            if name not in by_name:
                problems.append(f"{where}: metric {name} is not exported")
                continue
            label_sets = by_name[name]
            seen_labels |= {k for ls in label_sets for k in ls}
            for k, op, v in matchers:
                if k in target_labels:
                    continue
                values = {ls[k] for ls in label_sets if k in ls}
                if not values:
                    problems.append(f"{where}: {name} has no label {k!r}")
                elif op == "=" and v not in values:
                    problems.append(f"{where}: {name}{{{k}={v!r}}} matches nothing (values seen: {sorted(values)})")
                elif op == "=~":
                    words = _alternatives(v)
                    if words is None and not any(re.fullmatch(v, x) for x in values):
                        problems.append(f"{where}: {name}{{{k}=~{v!r}}} matches nothing (values: {sorted(values)})")
                    for w in words or ():
                        if w not in values:
                            problems.append(f"{where}: {name}{{{k}=~{v!r}}}: no series with {k}={w!r} "
                                            f"(values seen: {sorted(values)})")
        for k in grouping - seen_labels:
            problems.append(f"{where}: groups on label {k!r}, which none of its metrics has")
    return problems


def recorded_series(rule_list: list[dict], by_name: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Recording rule name -> the label sets its series can have: those of the metrics its expression
    reads, kept to its outermost `by (...)` labels, plus the rule's static labels."""
    out: dict[str, list[dict]] = {}
    for r in rule_list:
        if "record" not in r:
            continue
        m = re.match(r"\s*\w+\s+by\s*\(([^)]*)\)", r["expr"])
        keep = {x.strip() for x in m.group(1).split(",")} if m else None
        static = dict(r.get("labels") or {})
        sets = []
        for name, _matchers in selectors(r["expr"])[0]:
            for ls in by_name.get(name, []):
                sets.append({**{k: v for k, v in ls.items() if keep is None or k in keep}, **static})
        out.setdefault(r["record"], []).extend(sets or [static])
    return out


# ---- the process --------------------------------------------------------------------------------------

class Prometheus:
    """Prometheus on 127.0.0.1:<free port>, scraping the targets set with set_targets every second."""

    def __init__(self, workdir: Path | None = None, rule_text: str | None = None, interval: str = "1s"):
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="kpp-prometheus-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.targets_file = self.workdir / "targets.json"
        self.targets: dict[str, str] = {}
        self._write_targets()
        rule_files = []
        if rule_text is not None:
            (self.workdir / "rules.yaml").write_text(rule_text)
            rule_files = [str(self.workdir / "rules.yaml")]
        self.config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
            "rule_files": rule_files,
            "scrape_configs": [{
                "job_name": JOB, "metrics_path": "/stats/prometheus",
                "file_sd_configs": [{"files": [str(self.targets_file)], "refresh_interval": "1s"}]}],
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.log_path = self.workdir / "prometheus.log"
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30.0) -> "Prometheus":
        cmd = [binary("prometheus"), f"--config.file={self.workdir / 'prometheus.yml'}",
               f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
               "--storage.tsdb.retention.time=1d", "--web.enable-lifecycle", "--log.level=info"]
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=self.workdir, start_new_session=True, preexec_fn=_die_with_parent)
        log.close()

        def ready():
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                return get_json(f"{self.url}/api/v1/status/runtimeinfo") is not None
            except OSError:
                return False
        wait_until(ready, timeout, 0.1, message=f"prometheus not ready on {self.url}:\n{self.log_tail()}")
        return self

    def stop(self):
        p = self.process
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def log_tail(self, lines: int = 60) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=lines))
        except FileNotFoundError:
            return ""

    def _write_targets(self):
        groups = [{"targets": [addr], "labels": {"node": name}} for name, addr in sorted(self.targets.items())]
        tmp = self.targets_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        os.replace(tmp, self.targets_file)

    def set_target(self, name: str, admin_port: int | None):
        """Scrape (or, with None, stop scraping) one Envoy's admin endpoint; the `instance` label is
        127.0.0.1:<admin port>, `node` is name."""
        if admin_port is None:
            self.targets.pop(name, None)
        else:
            self.targets[name] = f"127.0.0.1:{admin_port}"
        self._write_targets()

    def instance(self, name: str) -> str:
        return self.targets[name]

    def wait_scraped(self, name: str, timeout: float = 15.0):
        """Until the target's last scrape succeeded."""
        addr = self.targets[name]

        def up():
            ts = get_json(f"{self.url}/api/v1/targets")["data"]["activeTargets"]
            return any(t["labels"].get("instance") == addr and t["health"] == "up" for t in ts)
        wait_until(up, timeout, 0.2, message=f"prometheus never scraped {name} ({addr}):\n{self.log_tail()}")

    def _api(self, path: str, **params) -> dict:
        url = f"{self.url}/api/v1/{path}?" + urllib.parse.urlencode(params)
        r = get_json(url, timeout=10)
        if r.get("status") != "success":
            raise RuntimeError(f"{url}: {r}")
        return r["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        """The instant vector of expr (now, or at a Unix time)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._api("query", **params)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float = 1.0) -> list[dict]:
        return self._api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=str(step))["result"]

    def alerts(self) -> list[dict]:
        """Alerts that are pending or firing now."""
        return self._api("alerts")["alerts"]

    def firing(self, alertname: str, **labels) -> bool:
        return any(a["state"] == "firing" and a["labels"].get("alertname") == alertname
                   and all(a["labels"].get(k) == v for k, v in labels.items()) for a in self.alerts())

    def rule_health(self) -> list[str]:
        """Rules whose last evaluation failed."""
        bad = []
        for g in self._api("rules")["groups"]:
            for r in g["rules"]:
                if r.get("health") not in ("ok", "unknown"):
                    bad.append(f"{r['name']}: {r.get('lastError')}")
        return bad


def wait_alert(prom: Prometheus, alertname: str, firing: bool, timeout: float, since: float, **labels) -> float:
    """Seconds from `since` (monotonic) until the alert is firing (or, firing=False, no longer firing)."""
    wait_until(lambda: prom.firing(alertname, **labels) == firing, timeout, 0.2,
               message=f"{alertname} {labels} {'never fired' if firing else 'did not clear'} within {timeout} s; "
                       f"alerts now: {[(a['labels'], a['state']) for a in prom.alerts()]}")
    return time.monotonic() - since
