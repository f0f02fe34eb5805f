"""docs/install.md quotes the release's sha256, size and OCI digests of one build, recorded in the page
(scripts/install_doc.py; `make dist` rewrites them). Here: the page quotes no value outside that record
(it once quoted two different .wasm sha256s and a size of another build), and while the build inputs are
the recorded commit's, the record is exactly what scripts/dist.sh builds now. The controls show each
check failing on a page with the old mistakes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from kpp.testing import harness

ROOT = harness.ROOT
DOC = ROOT / "docs" / "install.md"
TOOL = ROOT / "scripts" / "install_doc.py"


def check(dist, doc) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "check", str(dist), str(doc)], capture_output=True,
                          text=True, timeout=60)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("install-doc") / "dist"
    subprocess.run(["bash", str(ROOT / "scripts" / "dist.sh")], env={**os.environ, "DIST_DIR": str(out)},
                   check=True, capture_output=True, timeout=300)
    return out


def test_install_md_quotes_one_build_and_it_is_make_dist_s(dist):
    r = check(dist, DOC)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stderr


def test_controls_a_stray_digest_a_wrong_size_and_a_stale_record_fail(dist, tmp_path):
    text = DOC.read_text()
    spec = importlib.util.spec_from_file_location("install_doc", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    rec = tool.record(text)
    # A second sha256 for the .wasm (the old page's rebuild block quoted another build's).
    stray = tmp_path / "stray.md"
    stray.write_text(text.replace(f"{rec['wasm_sha256']}  dist/", "d8c3c709a3514e11729e95ce75c36152f4700ad1b56156ef3d8ce9c224be0476  dist/", 1))
    assert stray.read_text() != text
    r = check(dist, stray)
    assert r.returncode == 1 and "is quoted but is not a recorded value" in r.stderr, r.stderr
    # A size that is not the record's.
    size = tmp_path / "size.md"
    size.write_text(text.replace("bytes at this commit)", "1 bytes at this commit)", 1))
    r = check(dist, size)
    assert r.returncode == 1 and "size" in r.stderr, r.stderr
    # A record of another build, quoted consistently: only the comparison with the build catches it (the
    # check makes it whenever the build inputs are still the recorded commit's).
    fake = {**rec, "wasm_sha256": "0" * 64}
    body = text.replace(rec["wasm_sha256"], fake["wasm_sha256"])
    assert tool.record(body) == fake and not tool.problems(body)
    real = tool.dist_values(dist)
    assert any("wasm_sha256" in e for e in tool.mismatches(fake, real))
