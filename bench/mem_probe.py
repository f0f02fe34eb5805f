#!/usr/bin/env python3
"""Where the discovery service's memory goes, in a wasm32 VM like Envoy's (`make bench`).

    .venv/bin/python bench/mem_probe.py [--out target/bench/mem.md]

Builds examples/mem_probe.rs for wasm32-wasip1 and runs it under wasmtime (the `wasmtime` package
from PyPI) on the fixtures' documents and on the large table of bench/envoy_bench.py (the fixtures
plus 20 000 synthetic CRD resources per server: local a, peers b and c). The probe drives one
discovery round through the real `Syncer` with every heap allocation counted, step by step, and
reports the VM's linear memory: Envoy keeps a VM's linear memory resident once it has grown (wasm
memory never shrinks), so the peak of a round is what the main thread's VM costs for good.
The per-step lines say which step sets the peak (a document's parse, or the build and publish).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import wasmtime

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "k8s-discovery"
OLD = FIXTURES / "aggregated_v2.k8s-1.33.json"
NEW = FIXTURES / "aggregated_v2.k8s-1.37-dev-fork.json"
BIG = ("400", "2", "25")  # the large table of bench/envoy_bench.py (BIG there)
PROBE = ROOT / "target" / "wasm32-wasip1" / "release" / "examples" / "mem_probe.wasm"
CORE_BENCH = ROOT / "target" / "release" / "examples" / "core_bench"


def build() -> None:
    for args in (["--target", "wasm32-wasip1", "--example", "mem_probe"], ["--example", "core_bench"]):
        subprocess.run(["cargo", "build", "-q", "--release", *args], cwd=ROOT, check=True)


def run_probe(workdir: Path, docs: list[str]) -> tuple[dict, list[str]]:
    """(the probe's JSON line, its per-step lines): one round over `docs` (local first)."""
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    module = wasmtime.Module.from_file(engine, str(PROBE))
    # The crate's proxy-wasm imports are never called by the pure core the probe drives.
    linker.define_unknown_imports_as_traps(module)
    out, err = workdir / "stdout", workdir / "stderr"
    wasi = wasmtime.WasiConfig()
    wasi.argv = ["mem_probe", *docs]
    wasi.env = [("MEM_PROBE_STEPS", "1")]
    wasi.preopen_dir(str(workdir), ".")
    wasi.stdout_file = str(out)
    wasi.stderr_file = str(err)
    store.set_wasi(wasi)
    instance = linker.instantiate(store, module)
    try:
        instance.exports(store)["_start"](store)
    except wasmtime.ExitTrap as e:
        if e.code != 0:
            raise SystemExit(f"mem_probe failed ({e.code}): {err.read_text()}")
    return json.loads(out.read_text()), err.read_text().splitlines()


def report(cases: list[tuple[str, dict, list[str]]]) -> str:
    w = []
    w.append("**The discovery service's VM** (`bench/mem_probe.py`: one discovery round of the real "
             "`Syncer` in a wasm32 VM under wasmtime, documents read in pieces as the service reads "
             "Envoy's buffer, every allocation counted). Linear memory is what the main thread's VM "
             "keeps resident; counted bytes are what the allocator was asked for (the difference is "
             "its per-block overhead and fragmentation):")
    w.append("")
    w.append("| documents | input | linear memory grown, MiB | peak counted, MiB | held after the round, MiB "
             "| merged documents | table keys |")
    w.append("|---|---:|---:|---:|---:|---:|---:|")
    for name, r, _ in cases:
        w.append(f"| {name} | {r['input_bytes'] / 1048576:.1f} MiB | {r['linear_memory_growth_mib']} | "
                 f"{r['publish_peak_mib']} | {r['retained_mib']} | {r['documents_bytes'] / 1048576:.1f} MiB | "
                 f"{r['keys']:,} |")
    for name, _, steps in cases:
        if name.startswith("large"):
            w.append("")
            w.append(f"Steps of the round, {name} (each answer as it arrives; `live` and `peak` over the "
                     "probe's own copies of the documents):")
            w.append("")
            w.append("```")
            w.extend(steps)
            w.append("```")
    return "\n".join(w) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="write the markdown report here too")
    a = p.parse_args(argv)
    build()
    with tempfile.TemporaryDirectory(prefix="kpp-mem-") as d:
        work = Path(d)
        for base, name in ((OLD, "big-old.json"), (NEW, "big-new.json")):
            with open(work / name, "wb") as f:
                subprocess.run([str(CORE_BENCH), "synth", str(base), *BIG], stdout=f, check=True)
        for src, name in ((OLD, "old.json"), (NEW, "new.json")):
            (work / name).write_bytes(src.read_bytes())
        cases = []
        for name, docs in (("fixtures (a 1.33, b and c 1.37-dev)", ["old.json", "new.json", "new.json"]),
                           ("large (+20 000 CRD resources per server)",
                            ["big-old.json", "big-new.json", "big-new.json"])):
            r, steps = run_probe(work, docs)
            cases.append((name, r, steps))
    text = report(cases)
    sys.stdout.write(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
