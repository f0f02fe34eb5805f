#!/usr/bin/env bash
# Builds real control-plane binaries from the Go module proxy into a cache outside the repo:
#
#   $KPP_K8S_CACHE/k8s/<version>/kube-apiserver   from k8s.io/kubernetes <version>
#   $KPP_K8S_CACHE/k8s/<version>/kube-controller-manager, kubeadm   (same module, same build dir: most
#                                                   packages are shared and compiled once)
#   $KPP_K8S_CACHE/etcd/<version>/etcd             from go.etcd.io/etcd/server/v3 <version>
#
# (KPP_K8S_CACHE defaults to $HOME/.cache/kube-peer-proxy.) Each binary is keyed by version and
# reused when present; nothing is written inside the repository. kube-apiserver is built from a
# throw-away go.mod that requires k8s.io/kubernetes <version> and replaces every k8s.io/* staging
# module (read from that version's own go.mod) with its matching v0.<minor>.<patch> release.
#
#   scripts/k8s/build.sh                      # etcd + kube-apiserver v1.36.3 (what `make e2e-k8s` needs)
#   scripts/k8s/build.sh kube-apiserver v1.35.4
#   scripts/k8s/build.sh kube-controller-manager v1.36.3
#   scripts/k8s/build.sh kubeadm v1.36.3
#   scripts/k8s/build.sh kubelet v1.36.3               # the real node (tests/node): same module, CGO off
#   scripts/k8s/build.sh etcd v3.6.8
#   scripts/k8s/build.sh --path kube-apiserver v1.36.3   # print the cached path (exit 1 if absent)
set -euo pipefail

CACHE="${KPP_K8S_CACHE:-$HOME/.cache/kube-peer-proxy}"
DEFAULT_K8S="v1.36.3"
# The etcd that k8s.io/kubernetes v1.36.3 itself requires (shares its module cache). Debian's etcd-server
# 3.4.23 was tried: watches without a resourceVersion fail on kube-apiserver v1.36.3 (see README.md here).
DEFAULT_ETCD="v3.6.8"
log() { echo "k8s-build: $*" >&2; }

path_of() {  # component version
    case "$1" in
        kube-apiserver|kube-controller-manager|kube-scheduler|kubeadm|kubelet) echo "$CACHE/k8s/$2/$1" ;;
        etcd) echo "$CACHE/etcd/$2/etcd" ;;
        *) echo "unknown component $1" >&2; return 2 ;;
    esac
}

# Go's own caches stay where they are ($GOMODCACHE, $GOCACHE); the module proxy is the only source.
export CGO_ENABLED=0 GOFLAGS=-mod=mod GOTOOLCHAIN=local
# A go at least as new as k8s.io/kubernetes v1.36.3's go.mod asks for (GOTOOLCHAIN=local never switches):
# the one on PATH, else the module proxy's toolchain that scripts/go-toolchain.sh installs.
if [[ "${1:-}" != "--path" ]]; then
    GO_BIN="$(bash "$(dirname "${BASH_SOURCE[0]}")/../go-toolchain.sh")"
    export PATH="$(dirname "$GO_BIN"):$PATH"
fi

# An empty module for a staging module whose v0.<minor>.<patch> the module proxy refuses (v1.31.14's
# k8s.io/kube-scheduler, v1.32.13's k8s.io/endpointslice, v1.29.6's k8s.io/legacy-cloud-providers: "403 This
# module version is not available"). Go needs every required module's go.mod, not its code: a binary that
# imports a package from a stub does not build, so a stub can never stand in for code that runs.
stub_module() {  # work module
    mkdir -p "$1/stub/$2"
    printf 'module %s\n\ngo 1.21\n' "$2" > "$1/stub/$2/go.mod"
}

build_apiserver() {  # version [component]: any cmd/<component> of k8s.io/kubernetes
    local version="$1" component="${2:-kube-apiserver}" out work minor patch staging_ver modfile
    out="$(path_of "$component" "$version")"
    if [[ -x "$out" ]]; then log "$component $version cached at $out"; return 0; fi
    [[ "$version" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { log "bad version $version"; return 2; }
    minor="${BASH_REMATCH[1]}"; patch="${BASH_REMATCH[2]}"
    staging_ver="v0.$minor.$patch"
    # One work dir per version for every component: the module graph and Go's build cache are shared.
    work="$CACHE/work/kubernetes-$version"
    local t0=$SECONDS
    if [[ ! -f "$work/go.sum" ]]; then
    rm -rf "$work"; mkdir -p "$work"
    log "$component $version: resolving k8s.io/kubernetes@$version (staging modules -> $staging_ver)"
    modfile="$(cd "$work" && go mod download -json "k8s.io/kubernetes@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
    local gover
    gover="$(awk '$1=="go"{print $2; exit}' "$modfile")"
    {
        echo "module kpp.local/build-kube-apiserver"
        echo
        echo "go $gover"
        awk '$1=="godebug"{print; exit}' "$modfile"
        echo
        echo "require k8s.io/kubernetes $version"
        echo
        echo "replace ("
        # every `k8s.io/X => ./staging/src/k8s.io/X` of the upstream go.mod: its v0.<minor>.<patch> release
        # when the module proxy serves it, else an empty local module (stub_module)
        sed -nE 's#^[[:space:]]*(k8s\.io/[A-Za-z0-9._-]+)[[:space:]]+=>[[:space:]]+\./staging/src/.*#\1#p' "$modfile" \
            | sort -u | while read -r m; do
                if (cd "$CACHE" && GOFLAGS= go mod download "$m@$staging_ver") 2>>"$work/refused.log"; then
                    echo "	$m => $m $staging_ver"
                else
                    stub_module "$work" "$m"; echo "	$m => ./stub/$m"
                fi
            done
        echo ")"
    } > "$work/go.mod"
    if [[ -d "$work/stub" ]]; then
        log "$component $version: refused by the module proxy, replaced by empty modules: $(cd "$work/stub" && find . -name go.mod -printf '%h ' | sed 's#\./##g')"
    fi
    cat > "$work/tools.go" <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
    log "$component $version: $(grep -c '=>' "$work/go.mod") staging replaces; go mod tidy"
    # tidy looks at every build tag's imports, so with a stub it reports the packages only other tags or
    # other binaries import (-e); a stub a built package imports still fails `go build` below.
    (cd "$work" && if [[ -d stub ]]; then go mod tidy -e; else go mod tidy; fi)
    fi
    # v1.29's in-tree cloud providers import k8s.io/legacy-cloud-providers (refused for v0.29.6);
    # `providerless` leaves them out, as upstream's own providerless builds do (no-op from v1.30 on).
    local tags=()
    if [[ -d "$work/stub/k8s.io/legacy-cloud-providers" ]]; then tags=(-tags providerless); fi
    local ldpkg="k8s.io/component-base/version" date
    date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    local ld="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ld+=" -X '$pkg.gitVersion=$version' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$minor'"
        ld+=" -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=$date' -X '$pkg.gitCommit=module-proxy-$version'"
    done
    log "$component $version: go build (cold: kube-apiserver ~7-10 min on 2 cores; the others reuse most of it)"
    mkdir -p "$(dirname "$out")"
    (cd "$work" && go build "${tags[@]}" -trimpath -ldflags "$ld" -o "$out.tmp" "k8s.io/kubernetes/cmd/$component")
    if [[ "$component" == kubeadm ]]; then "$out.tmp" version -o short >&2; else "$out.tmp" --version >&2; fi
    mv "$out.tmp" "$out"
    cp "$work/go.mod" "$work/go.sum" "$(dirname "$out")/"
    if [[ -d "$work/stub" ]]; then (cd "$work/stub" && find . -name go.mod -printf '%h\n' | sed 's#^\./##') > "$(dirname "$out")/stubbed-modules.txt"; fi
    log "$component $version: done in $((SECONDS - t0)) s -> $out"
}

build_etcd() {
    local version="$1" out work
    out="$(path_of etcd "$version")"
    if [[ -x "$out" ]]; then log "etcd $version cached at $out"; return 0; fi
    work="$CACHE/work/etcd-$version"
    rm -rf "$work"; mkdir -p "$work"
    local t0=$SECONDS
    cat > "$work/go.mod" <<MOD
module kpp.local/build-etcd

go 1.24

require go.etcd.io/etcd/server/v3 $version
MOD
    cat > "$work/main.go" <<'GO'
// etcd's own main (go.etcd.io/etcd/v3 is just this around etcdmain).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
    log "etcd $version: go mod tidy + go build"
    (cd "$work" && go mod tidy && go build -trimpath -ldflags "-s -w" -o "$out.tmp" .)
    mkdir -p "$(dirname "$out")"
    "$out.tmp" --version >&2
    mv "$out.tmp" "$out"
    log "etcd $version: done in $((SECONDS - t0)) s -> $out"
}

if [[ "${1:-}" == "--path" ]]; then
    p="$(path_of "$2" "$3")"; echo "$p"; [[ -x "$p" ]]; exit
fi
mkdir -p "$CACHE"
case "${1:-all}" in
    all) build_etcd "$DEFAULT_ETCD"; build_apiserver "$DEFAULT_K8S" ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubeadm|kubelet) build_apiserver "${2:-$DEFAULT_K8S}" "$1" ;;
    etcd) build_etcd "${2:-$DEFAULT_ETCD}" ;;
    *) echo "usage: $0 [all | kube-apiserver|kube-controller-manager|kube-scheduler|kubeadm|kubelet VERSION | etcd VERSION | --path COMPONENT VERSION]" >&2; exit 2 ;;
esac
