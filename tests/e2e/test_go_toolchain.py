"""scripts/setup.sh on a machine without a new enough Go or without rustup (README "Prerequisites").

* scripts/go-toolchain.sh, starting from Debian 12's own Go (golang-1.19-go, fetched with `apt-get
  download` and unpacked, so this machine's packages are untouched) with the machine's go hidden from
  PATH and an empty HOME and cache: it fetches go1.26.8 as the Go module proxy's toolchain module, and the
  result runs (`go version`, and it builds a program). The second run reuses it without a download. The
  control: when the old go is enough (KPP_GO_MIN=1.19.0) the script keeps it, so the version check is what
  decides.
* setup.sh without rustup on PATH stops at once and says what to install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from kpp.testing import harness

ROOT = harness.ROOT
DEB_CACHE = Path(os.environ.get("KPP_K8S_CACHE", Path.home() / ".cache" / "kube-peer-proxy")) / "test-debs" / "go-1.19"
BASE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def run(cmd, env, timeout=600, check=True, cwd=None):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


@pytest.fixture(scope="module")
def debian_go(tmp_path_factory) -> Path:
    """A bin directory whose `go` is Debian 12's golang-1.19-go, unpacked (not installed)."""
    if not any(DEB_CACHE.glob("golang-1.19-go_*.deb")):
        DEB_CACHE.mkdir(parents=True, exist_ok=True)
        run(["apt-get", "download", "golang-1.19-go", "golang-1.19-src"], env=dict(os.environ), cwd=DEB_CACHE)
    root = tmp_path_factory.mktemp("debian-go")
    for deb in sorted(DEB_CACHE.glob("*.deb")):
        run(["dpkg-deb", "-x", str(deb), str(root / "root")], env=dict(os.environ))
    goroot = root / "root" / "usr" / "lib" / "go-1.19"
    bindir = root / "bin"
    bindir.mkdir()
    # dpkg -x keeps the package's absolute links (src -> /usr/share/go-1.19/src): point GOROOT at the copy.
    (bindir / "go").write_text(f"#!/bin/sh\nGOROOT={goroot} exec {goroot}/bin/go \"$@\"\n")
    (bindir / "go").chmod(0o755)
    return bindir


def clean_env(tmp: Path, path: str, **extra) -> dict[str, str]:
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    return {"PATH": path, "HOME": str(home), "KPP_K8S_CACHE": str(tmp / "cache"), "TMPDIR": str(tmp),
            "GOPATH": str(tmp / "gopath"), "GOCACHE": str(tmp / "gocache"), **extra}


def test_from_debian_go_it_installs_the_module_proxy_toolchain(debian_go, tmp_path):
    env = clean_env(tmp_path, f"{debian_go}:{BASE_PATH}")
    assert shutil.which("go", path=BASE_PATH) is None, "a go in /usr/bin would not be hidden"
    old = run(["go", "env", "GOVERSION"], env).stdout.strip()
    assert old.startswith("go1.19"), old
    r = run(["bash", str(ROOT / "scripts" / "go-toolchain.sh")], env)
    go = Path(r.stdout.strip())
    assert go == tmp_path / "cache" / "tools" / "go1.26.8" / "bin" / "go", r.stdout
    assert "go mod download golang.org/toolchain@v0.0.1-go1.26.8.linux-amd64" in r.stderr, r.stderr
    assert run([str(go), "version"], env).stdout.startswith("go version go1.26.8 ")
    hello = tmp_path / "hello"
    hello.mkdir()
    (hello / "go.mod").write_text("module hello\n\ngo 1.26.0\n")
    (hello / "main.go").write_text('package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("built") }\n')
    assert run([str(go), "run", "."], {**env, "GOTOOLCHAIN": "local"}, cwd=hello).stdout == "built\n"
    again = run(["bash", str(ROOT / "scripts" / "go-toolchain.sh")], env)
    assert again.stdout.strip() == str(go) and "go mod download" not in again.stderr, again.stderr


def test_control_an_old_go_that_is_enough_is_kept(debian_go, tmp_path):
    env = clean_env(tmp_path, f"{debian_go}:{BASE_PATH}", KPP_GO_MIN="1.19.0")
    r = run(["bash", str(ROOT / "scripts" / "go-toolchain.sh")], env)
    assert r.stdout.strip() == str(debian_go / "go") and not (tmp_path / "cache" / "tools").exists()


def test_setup_without_rustup_stops_and_names_the_prerequisite(tmp_path):
    assert shutil.which("rustup", path=BASE_PATH) is None
    r = run(["bash", str(ROOT / "scripts" / "setup.sh")], clean_env(tmp_path, BASE_PATH), check=False, timeout=60)
    assert r.returncode == 1 and "rustup is missing" in r.stderr and "https://rustup.rs" in r.stderr, r
