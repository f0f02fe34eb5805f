#!/usr/bin/env bash
# Prints the path of a `go` new enough for everything scripts/setup.sh and scripts/k8s/build.sh build,
# installing one when there is none:
#
#   1. the `go` on PATH, if it is at least GO_MIN;
#   2. else $KPP_K8S_CACHE/tools/go$GO_VERSION/bin/go, if installed before;
#   3. else the Go module proxy's toolchain module golang.org/toolchain@v0.0.1-go$GO_VERSION.<os>-<arch>
#      (what GOTOOLCHAIN switching downloads), fetched with `go mod download` by whatever go is on PATH,
#      Debian's golang-go (1.19 on Debian 12, installed with apt-get when there is no go at all) being
#      enough, checked against the checksum database like any module, and unpacked with its file modes
#      (the module cache's copy is read-only and not executable).
#
# GO_MIN: k8s.io/kubernetes v1.36.3's go.mod says `go 1.26.0` (v1.35.4: 1.25.0; etcd server v3.6.8:
# 1.24.0), and build.sh builds with GOTOOLCHAIN=local, so an older go fails there. GO_VERSION: the
# toolchain installed when none is found (the one this repository's builds were measured with).
#
#   GO="$(bash scripts/go-toolchain.sh)"      # logs on stderr, the path on stdout
set -euo pipefail
GO_MIN="${KPP_GO_MIN:-1.26.0}"
GO_VERSION="${KPP_GO_VERSION:-1.26.8}"
CACHE="${KPP_K8S_CACHE:-$HOME/.cache/kube-peer-proxy}"
DEST="$CACHE/tools/go$GO_VERSION"
log() { echo "go-toolchain: $*" >&2; }

# "1.26.8" from `go1.26.8` (also `go1.26rc1` -> 1.26rc1, sorted before 1.26.0 by sort -V's rules only
# roughly; release versions are what matter here).
version_of() { "$1" env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9][0-9.a-z]*\).*/\1/p'; }
at_least() { [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]; }

if command -v go >/dev/null; then
    have="$(version_of go)"
    if [[ -n "$have" ]] && at_least "$have" "$GO_MIN"; then
        command -v go
        exit 0
    fi
    log "go on PATH is ${have:-unknown}, older than $GO_MIN"
fi
if [[ -x "$DEST/bin/go" && "$(version_of "$DEST/bin/go")" == "$GO_VERSION" ]]; then
    echo "$DEST/bin/go"
    exit 0
fi

if ! command -v go >/dev/null; then
    command -v apt-get >/dev/null || { log "no go and no apt-get: install Go >= $GO_MIN (https://go.dev/dl) and retry"; exit 1; }
    sudo=()
    [[ $EUID -eq 0 ]] || sudo=(sudo)
    log "apt-get install golang-go (a bootstrap go to fetch go$GO_VERSION with)"
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends golang-go >&2
fi
bootstrap="$(command -v go)"
case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64|arm64) arch=arm64 ;;
    *) log "unsupported machine $(uname -m)"; exit 1 ;;
esac
os="$(uname -s | tr '[:upper:]' '[:lower:]')"
module="golang.org/toolchain@v0.0.1-go$GO_VERSION.$os-$arch"
log "go mod download $module (with $bootstrap, $(version_of "$bootstrap"))"
work="$(mktemp -d "${TMPDIR:-/tmp}/kpp-go-toolchain.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# Outside any module; GOTOOLCHAIN=local: the bootstrap go must not try to switch by itself (1.21+ would).
zip="$(cd "$work" && GOFLAGS=-mod=mod GOTOOLCHAIN=local "$bootstrap" mod download -json "$module" \
    | sed -n 's/^[[:space:]]*"Zip": "\(.*\)",$/\1/p')"
[[ -f "$zip" ]] || { log "go mod download gave no zip for $module"; exit 1; }
mkdir -p "$CACHE/tools"
rm -rf "$DEST.tmp"
python3 - "$zip" "$DEST.tmp" "${module%%@*}@${module#*@}" <<'PY'
import os, sys, zipfile
zip_path, dest, prefix = sys.argv[1], sys.argv[2], sys.argv[3] + "/"
with zipfile.ZipFile(zip_path) as z:
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        rel = info.filename[len(prefix):]
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out, "wb") as dst:
            dst.write(src.read())
        mode = (info.external_attr >> 16) & 0o777
        os.chmod(out, mode or 0o644)
PY
got="$(version_of "$DEST.tmp/bin/go")"
[[ "$got" == "$GO_VERSION" ]] || { log "unpacked go reports '$got', expected $GO_VERSION"; exit 1; }
rm -rf "$DEST"
mv "$DEST.tmp" "$DEST"
log "go$GO_VERSION installed at $DEST"
echo "$DEST/bin/go"
