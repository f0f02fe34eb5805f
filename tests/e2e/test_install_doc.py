"""docs/install.md quotes the release's sha256, size and OCI digests of one build, recorded in the page
(scripts/install_doc.py; `make dist` rewrites them). Here the current tree is built (`make build` into a
file of this test's own, then scripts/dist.sh), and the page must quote exactly that build: no value
outside its record (it once quoted two different .wasm sha256s and a size of another build), and a record
that is what the build gives now, always (it used to be compared only while the build inputs were those
of the recorded commit, so the page went stale silently). After any change to the build's inputs,
`make dist` rewrites the page. The controls show each check failing: a stray digest, a wrong size, a
record of another build, and a whole page consistently quoting a previous build."""

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
# A real previous build: the values docs/install.md quoted from 2c7d41e until the page was rewritten
# from the current tree (the .wasm of that commit, its image index and platform manifests).
PREVIOUS = {"wasm_sha256": "4b292aaecb39f1e11b43a81a3e26ce4734106a54276cbecfb4be0238a2547c08",
            "wasm_size": "521117",
            "index": "10c4306d80c38d4fddf0e560cba6e6aa73b1536e4f1f3073c2392b2f495a6e64",
            "amd64": "4b1fa0c60ad5ec250a327f8b36418e87a555c73ebd83b1681db916acd90a68ba",
            "arm64": "96076602a0492584e36e66247054bc3f20a9e86283f84d154cc19171bfcea886"}


def check(dist, doc) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), "check", str(dist), str(doc)], capture_output=True,
                          text=True, timeout=60)


def load_tool():
    spec = importlib.util.spec_from_file_location("install_doc", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """scripts/dist.sh on the .wasm the current tree builds. `make build` (setup skipped: the tools are
    there when tests run) writes it to this test's own file, so target/kube_peer_proxy.wasm, which
    other tests load, is never rewritten; cargo's build is incremental, so an up-to-date tree costs
    seconds."""
    d = tmp_path_factory.mktemp("install-doc")
    wasm, out = d / "kube_peer_proxy.wasm", d / "dist"
    built = subprocess.run(["make", "-s", "-o", "setup", "build", f"WASM={wasm}"], cwd=ROOT, capture_output=True,
                           text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    subprocess.run(["bash", str(ROOT / "scripts" / "dist.sh")],
                   env={**os.environ, "DIST_DIR": str(out), "KPP_WASM": str(wasm)},
                   check=True, capture_output=True, timeout=300)
    return out


def test_install_md_quotes_one_build_and_it_is_make_dist_s(dist):
    r = check(dist, DOC)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stderr


def test_controls_a_stray_digest_a_wrong_size_and_a_stale_record_fail(dist, tmp_path):
    text = DOC.read_text()
    tool = load_tool()
    rec = tool.record(text)
    # A second sha256 for the .wasm (the old page's rebuild block quoted another build's).
    stray = tmp_path / "stray.md"
    stray.write_text(text.replace(f"{rec['wasm_sha256']}  dist/", "d8c3c709a3514e11729e95ce75c36152f4700ad1b56156ef3d8ce9c224be0476  dist/", 1))
    assert stray.read_text() != text
    r = check(dist, stray)
    assert r.returncode == 1 and "is quoted but is not a recorded value" in r.stderr, r.stderr
    # A size that is not the record's.
    size = tmp_path / "size.md"
    size.write_text(text.replace("bytes in the recorded build)", "1 bytes in the recorded build)", 1))
    assert size.read_text() != text
    r = check(dist, size)
    assert r.returncode == 1 and "size" in r.stderr, r.stderr
    # A record of another build, quoted consistently: only the comparison with the build catches it (the
    # check makes it always).
    fake = {**rec, "wasm_sha256": "0" * 64}
    body = text.replace(rec["wasm_sha256"], fake["wasm_sha256"])
    assert tool.record(body) == fake and not tool.problems(body)
    real = tool.dist_values(dist)
    assert any("wasm_sha256" in e for e in tool.mismatches(fake, real))
    stale = tmp_path / "stale.md"
    stale.write_text(body)
    r = check(dist, stale)
    assert r.returncode == 1 and "wasm_sha256: the page says " + "0" * 64 in r.stderr, r.stderr


def test_control_a_page_quoting_a_previous_build_fails(dist, tmp_path):
    """The page as `make dist` wrote it for a previous build (every value that build's, the record and the
    text agreeing, the current build inputs' hash even): the old check passed such a page once the
    inputs had changed; this one fails on every value."""
    tool = load_tool()
    text = DOC.read_text()
    built = tool.dist_values(dist)
    assert all(PREVIOUS[k] != built[k] for k in PREVIOUS), "the current tree builds the previous build's bytes"
    page = tool.rewritten(text, {**PREVIOUS, "inputs": tool.inputs_hash()})
    assert page != text and PREVIOUS["wasm_sha256"] in page and "521 117 bytes" in page
    assert not tool.problems(page), "the previous build's page is consistent: only the comparison catches it"
    previous = tmp_path / "previous.md"
    previous.write_text(page)
    r = check(dist, previous)
    print(r.stderr)
    assert r.returncode == 1, r.stderr
    for k in PREVIOUS:
        assert f"{k}: the page says {PREVIOUS[k]}, make dist built {built[k]}" in r.stderr, r.stderr
