#!/usr/bin/env python3
"""The release values docs/install.md quotes (the .wasm's sha256 and size, the OCI digests), from one source.

docs/install.md carries one record line, an HTML comment:

    <!-- make dist values: commit=<git commit> wasm_sha256=<hex> wasm_size=<bytes> index=<hex> amd64=<hex> arm64=<hex> -->

`make dist` runs `install_doc.py write dist docs/install.md`: every occurrence of the recorded values in the
page is replaced by the new build's, and the record names the commit they were built from (`-dirty` when the
build inputs had uncommitted changes). `install_doc.py check DIST DOC` (tests/e2e/test_install_doc.py) fails
when the page quotes a sha256 or size that is not in the record, or, when the build inputs (INPUTS) are the
same as at the recorded commit, when the record is not what DIST holds.

    install_doc.py write|check DIST_DIR DOC
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the .wasm and the OCI image are built from (scripts/dist.sh, make build).
INPUTS = ["src", "Cargo.toml", "Cargo.lock", "rust-toolchain.toml", "scripts/wasm-opt.sh", "scripts/dist.sh",
          "Makefile"]
RECORD = re.compile(r"<!-- make dist values: (.*?) -->")
KEYS = ("commit", "wasm_sha256", "wasm_size", "index", "amd64", "arm64")


def grouped(n: int) -> str:
    """582357 -> "582 357", as the page writes sizes."""
    return f"{n:,}".replace(",", " ")


def dist_values(dist: Path) -> dict[str, str]:
    (wasm,) = sorted(dist.glob("kube_peer_proxy-*.wasm"))
    data = wasm.read_bytes()
    out = {"wasm_sha256": hashlib.sha256(data).hexdigest(), "wasm_size": str(len(data))}
    for line in (dist / "oci-digests.txt").read_text().splitlines():
        digest, _ref, what = line.split("  ", 2)
        key = "index" if what.startswith("image index") else what.split()[0].split("/")[1]
        out[key] = digest.removeprefix("sha256:")
    return out


def record(doc: str) -> dict[str, str]:
    found = RECORD.findall(doc)
    if len(found) != 1:
        raise SystemExit(f"install_doc: expected one '<!-- make dist values: ... -->' line, found {len(found)}")
    values = dict(kv.split("=", 1) for kv in found[0].split())
    if tuple(values) != KEYS:
        raise SystemExit(f"install_doc: the record has {tuple(values)}, expected {KEYS}")
    return values


def inputs_changed_since(commit: str) -> bool:
    """Whether the build inputs in the working tree differ from `commit`'s."""
    if commit.endswith("-dirty"):
        return True
    r = subprocess.run(["git", "diff", "--quiet", commit, "--", *INPUTS], cwd=ROOT, stderr=subprocess.DEVNULL)
    return r.returncode != 0


def problems(doc: str) -> list[str]:
    """What the page quotes that its record does not hold."""
    rec = record(doc)
    known = {rec[k] for k in KEYS[1:] if k != "wasm_size"}
    out = [f"{h} is quoted but is not a recorded value" for h in sorted(set(re.findall(r"\b[0-9a-f]{64}\b", doc)))
           if h not in known]
    for size in re.findall(r"\(([0-9][0-9 ]*) bytes at this commit\)", doc):
        if size.replace(" ", "") != rec["wasm_size"]:
            out.append(f"size {size} is quoted, the record says {rec['wasm_size']}")
    if rec["wasm_sha256"] not in doc.replace(RECORD.search(doc).group(0), ""):
        out.append("the recorded .wasm sha256 is not quoted anywhere")
    return out


def mismatches(rec: dict[str, str], built: dict[str, str]) -> list[str]:
    return [f"{k}: the page says {rec[k]}, make dist built {built[k]}" for k in KEYS[1:] if rec[k] != built[k]]


def write(dist: Path, path: Path) -> None:
    doc = path.read_text()
    old, new = record(doc), dist_values(dist)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", *INPUTS], cwd=ROOT).returncode != 0
    new["commit"] = head + ("-dirty" if dirty else "")
    for k in ("wasm_sha256", "index", "amd64", "arm64"):
        doc = doc.replace(old[k], new[k])
    doc = re.sub(r"\([0-9][0-9 ]* bytes at this commit\)", f"({grouped(int(new['wasm_size']))} bytes at this commit)",
                 doc)
    line = "<!-- make dist values: " + " ".join(f"{k}={new[k]}" for k in KEYS) + " -->"
    doc = RECORD.sub(line, doc)
    path.write_text(doc)
    print(f"install_doc: {path} now quotes the dist of {new['commit']}")


def check(dist: Path, path: Path) -> int:
    doc = path.read_text()
    errors = problems(doc)
    rec = record(doc)
    if inputs_changed_since(rec["commit"]):
        print(f"install_doc: the build inputs changed since {rec['commit']}: the page's values are that commit's "
              "(make dist rewrites them); checked for consistency only")
    else:
        errors += mismatches(rec, dist_values(dist))
    for e in errors:
        print(f"install_doc: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("write", "check"):
        raise SystemExit(__doc__)
    mode, dist_dir, doc_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if mode == "write":
        write(dist_dir, doc_path)
    else:
        sys.exit(check(dist_dir, doc_path))
