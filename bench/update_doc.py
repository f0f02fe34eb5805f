#!/usr/bin/env python3
"""Writes the generated sections of docs/benchmarks.md (stdlib only).

    python3 bench/update_doc.py docs/benchmarks.md <core.md> <envoy.md> <size.md>

The document keeps its hand-written text; only the text between `<!-- generated:NAME -->` and
`<!-- /generated:NAME -->` is replaced: `machine` (facts about this run), `envoy`, `core` and `size` (the
reports of bench/envoy_bench.py, bench/core_bench.sh and bench/size.sh), `mem` from target/bench/mem.md
(bench/mem_probe.py), `req` from target/bench/req.md (bench/req_probe.py) and `hop` from
target/hop/results.md (scripts/k8s/hop.py) when those files exist.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The Makefile's BENCH_ARGS (passed to envoy_bench.py), to quote the exact command.
BENCH_ARGS = os.environ.get("BENCH_ARGS", "")
# The Makefile's REQ_ARGS (passed to req_probe.py).
REQ_ARGS = os.environ.get("REQ_ARGS", "")


def sh(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return "?"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def envoy_version() -> str:
    found = sorted(ROOT.glob(".venv/lib/python*/site-packages/envoy/_bin/envoy"))
    if not found:
        return "?"
    m = re.search(r"version: (\S+)", sh(str(found[-1]), "--version"))
    return m.group(1) if m else "?"


def machine() -> str:
    commit = sh("git", "rev-parse", "--short", "HEAD")
    dirty = " (with uncommitted changes)" if sh("git", "status", "--porcelain", "--untracked-files=no") else ""
    mem = "?"
    try:
        kib = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text()).group(1))
        mem = f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, AttributeError):
        pass
    rows = [
        ("date", datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")),
        ("commit", f"`{commit}`{dirty}"),
        ("`nproc`", sh("nproc")),
        ("CPU", cpu_model()),
        ("memory", mem),
        ("`uname -r`", sh("uname", "-r")),
        ("load average when the doc was written (1/5/15 min)",
         " / ".join(Path("/proc/loadavg").read_text().split()[:3])),
        ("Envoy", f"`{envoy_version()}`"),
        ("rustc", f"`{sh('rustc', '--version')}`"),
        ("valgrind", f"`{sh('valgrind', '--version')}`"),
        ("wrk", f"`{(sh('wrk', '-v') or '?').splitlines()[0].split(' Copyright')[0]}`"),
        ("h2load", f"`{(sh('h2load', '--version') or '?').splitlines()[0]}`"),
        ("wasm-opt", f"`{sh('wasm-opt', '--version')}`"),
    ]
    out = ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    out += ["", "Commands (all run by `make bench`):", "", "```",
            "make build",
            "bash bench/size.sh > target/bench/size.md",
            "bash bench/core_bench.sh > target/bench/core.md",
            f".venv/bin/python bench/envoy_bench.py --out target/bench/envoy.md {BENCH_ARGS}".rstrip(),
            ".venv/bin/python bench/mem_probe.py --out target/bench/mem.md",
            f".venv/bin/python bench/req_probe.py --out target/bench/req.md {REQ_ARGS}".rstrip(),
            ".venv/bin/python bench/update_doc.py docs/benchmarks.md target/bench/core.md target/bench/envoy.md "
            "target/bench/size.md",
            "```"]
    return "\n".join(out) + "\n"


def replace(doc: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.S)
    if not pattern.search(doc):
        raise SystemExit(f"update_doc: no <!-- generated:{name} --> section in the document")
    return pattern.sub(lambda m: m.group(1) + body.rstrip("\n") + "\n" + m.group(2), doc)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    doc_path, core, envoy, size = (Path(a) for a in argv)
    doc = doc_path.read_text()
    doc = replace(doc, "machine", machine())
    doc = replace(doc, "envoy", envoy.read_text())
    doc = replace(doc, "core", core.read_text())
    doc = replace(doc, "size", size.read_text())
    req = ROOT / "target" / "bench" / "req.md"  # bench/req_probe.py (`make bench`)
    if req.is_file() and "<!-- generated:req -->" in doc:
        doc = replace(doc, "req", req.read_text())
    mem = ROOT / "target" / "bench" / "mem.md"  # bench/mem_probe.py (`make bench`)
    if mem.is_file() and "<!-- generated:mem -->" in doc:
        doc = replace(doc, "mem", mem.read_text())
    hop = ROOT / "target" / "hop" / "results.md"  # scripts/k8s/hop.py (`make hop`), when it has run
    if hop.is_file() and "<!-- generated:hop -->" in doc:
        doc = replace(doc, "hop", hop.read_text())
    doc_path.write_text(doc)
    print(f"update_doc: wrote {doc_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
