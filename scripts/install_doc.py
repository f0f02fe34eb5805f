#!/usr/bin/env python3
"""The release values docs/install.md quotes (the .wasm's sha256 and size, the OCI digests), from one source.

docs/install.md carries one record line, an HTML comment:

    <!-- make dist values: inputs=<sha256> wasm_sha256=<hex> wasm_size=<bytes> index=<hex> amd64=<hex> arm64=<hex> -->

`make dist` runs `install_doc.py write dist docs/install.md`: every occurrence of the recorded values in the
page is replaced by the new build's, and the record names the build inputs they were built from (`inputs`, the
sha256 of the files under INPUTS as they were in the working tree: `install_doc.py inputs` prints the current
tree's; a commit could not name itself). `install_doc.py check DIST DOC` (tests/e2e/test_install_doc.py, which
builds the current tree into DIST) fails when the page quotes a sha256 or size that is not in the record, and
always when the record is not what DIST holds: after any change that changes the build, `make dist` must
rewrite the page.

    install_doc.py write|check DIST_DIR DOC
    install_doc.py inputs
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
KEYS = ("inputs", "wasm_sha256", "wasm_size", "index", "amd64", "arm64")
# How the page states the .wasm's size (docs/install.md's file table).
SIZE = re.compile(r"\(([0-9][0-9 ]*) bytes in the recorded build\)")


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


def inputs_hash() -> str:
    """sha256 of the build inputs in the working tree: every file under INPUTS that git tracks or would
    track (untracked files that are not ignored count: a new module in src/ is built), by path and content."""
    paths = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *INPUTS],
                           cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    h = hashlib.sha256()
    for rel in sorted({p for p in paths if p}):
        f = ROOT / rel.decode()
        if f.is_file():  # a tracked file deleted in the working tree is not an input any more
            h.update(rel + b"\0" + hashlib.sha256(f.read_bytes()).hexdigest().encode() + b"\n")
    return h.hexdigest()


def problems(doc: str) -> list[str]:
    """What the page quotes that its record does not hold."""
    rec = record(doc)
    body = doc.replace(RECORD.search(doc).group(0), "")  # what a reader sees (the inputs hash is no value)
    known = {rec[k] for k in KEYS[1:] if k != "wasm_size"}
    out = [f"{h} is quoted but is not a recorded value" for h in sorted(set(re.findall(r"\b[0-9a-f]{64}\b", body)))
           if h not in known]
    for size in SIZE.findall(body):
        if size.replace(" ", "") != rec["wasm_size"]:
            out.append(f"size {size} is quoted, the record says {rec['wasm_size']}")
    if rec["wasm_sha256"] not in body:
        out.append("the recorded .wasm sha256 is not quoted anywhere")
    return out


def mismatches(rec: dict[str, str], built: dict[str, str]) -> list[str]:
    return [f"{k}: the page says {rec[k]}, make dist built {built[k]}" for k in KEYS[1:] if rec[k] != built[k]]


def rewritten(doc: str, new: dict[str, str]) -> str:
    """The page with its recorded values replaced by `new` (every key of KEYS) wherever it quotes them."""
    old = record(doc)
    for k in ("wasm_sha256", "index", "amd64", "arm64"):
        doc = doc.replace(old[k], new[k])
    doc = SIZE.sub(f"({grouped(int(new['wasm_size']))} bytes in the recorded build)", doc)
    line = "<!-- make dist values: " + " ".join(f"{k}={new[k]}" for k in KEYS) + " -->"
    return RECORD.sub(line, doc)


def write(dist: Path, path: Path) -> None:
    new = {**dist_values(dist), "inputs": inputs_hash()}
    path.write_text(rewritten(path.read_text(), new))
    print(f"install_doc: {path} now quotes the dist built from inputs {new['inputs']}")


def check(dist: Path, path: Path) -> int:
    """Always compares the page with DIST (no condition on commits or inputs): 1 on any difference."""
    doc = path.read_text()
    errors = problems(doc) + mismatches(record(doc), dist_values(dist))
    if errors:
        rec, now = record(doc)["inputs"], inputs_hash()
        errors.append(f"the page was written from build inputs {rec}; this tree's are {now}"
                      + ("" if rec == now else " (they changed since)") + ": run make dist to rewrite it")
    for e in errors:
        print(f"install_doc: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["inputs"]:
        print(inputs_hash())
        sys.exit(0)
    if len(sys.argv) != 4 or sys.argv[1] not in ("write", "check"):
        raise SystemExit(__doc__)
    mode, dist_dir, doc_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if mode == "write":
        write(dist_dir, doc_path)
    else:
        sys.exit(check(dist_dir, doc_path))
