#!/usr/bin/env bash
# The container runtime of the real test node (tests/node, python/kpp/testing/node.py), built from the
# registries this project can reach, into the same cache as the Kubernetes binaries:
#
#   $KPP_K8S_CACHE/node/containerd-<v>/{containerd,containerd-shim-runc-v2,ctr}
#        github.com/containerd/containerd/v2 <v> from the Go module proxy (image volumes need >= 2.1)
#   $KPP_K8S_CACHE/node/cni-<v>/{bridge,host-local,loopback,portmap}
#        the reference CNI plugins (github.com/containernetworking/plugins <v>): the pod network that
#        kubeadm's upgrade health-check Job (not hostNetwork) needs, and a Ready node
#   $KPP_K8S_CACHE/node/pause-<v>/pause
#        kubeadm's sandbox ("pause") binary: build/pause/linux/pause.c of k8s.io/kubernetes, compiled
#        static with upstream's CFLAGS (build/pause/Makefile)
#   $KPP_K8S_CACHE/node/envoy-userland-bookworm.tar
#        the userland of the proxy's Envoy image: Debian bookworm minbase (debootstrap), as the
#        official envoyproxy/envoy image is Ubuntu with its base userland (docs/deploy.md "The test node")
#
# runc is Debian's (apt, `runc`). Each piece is keyed by version and reused when present.
#
#   scripts/node/build.sh            # all of the above
#   scripts/node/build.sh --path containerd|cni|pause|userland
set -euo pipefail

CACHE="${KPP_K8S_CACHE:-$HOME/.cache/kube-peer-proxy}/node"
CONTAINERD_VERSION="v2.2.9"
CNI_VERSION="v1.9.1"
PAUSE_VERSION="3.10.2"          # kubeadm v1.35/v1.36 constants.PauseVersion
PAUSE_SOURCE_K8S="v1.36.3"      # the k8s.io/kubernetes module whose build/pause/linux/pause.c is compiled
DEBIAN_SUITE="bookworm"
log() { echo "node-build: $*" >&2; }

containerd_dir() { echo "$CACHE/containerd-$CONTAINERD_VERSION"; }
cni_dir() { echo "$CACHE/cni-$CNI_VERSION"; }
pause_bin() { echo "$CACHE/pause-$PAUSE_VERSION/pause"; }
userland_tar() { echo "$CACHE/envoy-userland-$DEBIAN_SUITE.tar"; }

if [[ "${1:-}" == "--path" ]]; then
    case "${2:-}" in
        containerd) p="$(containerd_dir)/containerd" ;;
        pause) p="$(pause_bin)" ;;
        cni) p="$(cni_dir)" ;;
        userland) p="$(userland_tar)" ;;
        *) echo "usage: $0 --path containerd|cni|pause|userland" >&2; exit 2 ;;
    esac
    echo "$p"; [[ -e "$p" ]]; exit
fi

mkdir -p "$CACHE"
GO_BIN="$(bash "$(dirname "${BASH_SOURCE[0]}")/../go-toolchain.sh")"
export PATH="$(dirname "$GO_BIN"):$PATH" GOTOOLCHAIN=local

apt_need=()
command -v runc >/dev/null || [[ -x /usr/sbin/runc ]] || apt_need+=(runc)
command -v debootstrap >/dev/null || [[ -x /usr/sbin/debootstrap ]] || apt_need+=(debootstrap)
command -v gcc >/dev/null || apt_need+=(gcc libc6-dev)
if (( ${#apt_need[@]} )); then
    log "apt-get install ${apt_need[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${apt_need[@]}" >&2
fi

d="$(containerd_dir)"
if [[ ! -x "$d/containerd" || ! -x "$d/containerd-shim-runc-v2" || ! -x "$d/ctr" ]]; then
    t0=$SECONDS
    log "containerd $CONTAINERD_VERSION: go install (about 2 min cold)"
    # CGO off: the btrfs, devmapper and zfs snapshotters need cgo and are not used (overlayfs is)
    GOBIN="$d.tmp" CGO_ENABLED=0 GOFLAGS= go install -trimpath -ldflags '-s -w' -tags 'no_btrfs no_devmapper no_zfs' \
        "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" >&2
    rm -rf "$d"; mv "$d.tmp" "$d"
    "$d/containerd" --version >&2
    log "containerd: done in $((SECONDS - t0)) s -> $d"
fi

c="$(cni_dir)"
if [[ ! -x "$c/bridge" || ! -x "$c/host-local" || ! -x "$c/loopback" || ! -x "$c/portmap" ]]; then
    log "CNI plugins $CNI_VERSION: go install"
    m=github.com/containernetworking/plugins/plugins
    GOBIN="$c.tmp" CGO_ENABLED=0 GOFLAGS= go install -trimpath -ldflags '-s -w' "$m/main/bridge@$CNI_VERSION" \
        "$m/main/loopback@$CNI_VERSION" "$m/ipam/host-local@$CNI_VERSION" "$m/meta/portmap@$CNI_VERSION" >&2
    rm -rf "$c"; mv "$c.tmp" "$c"
fi

p="$(pause_bin)"
if [[ ! -x "$p" ]]; then
    src="$(cd "$CACHE" && GOFLAGS= go mod download -json "k8s.io/kubernetes@$PAUSE_SOURCE_K8S" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/build/pause/linux/pause.c"
    mkdir -p "$(dirname "$p")"
    gcc -Os -Wall -Werror -static "-DVERSION=v$PAUSE_VERSION-kpp" -o "$p.tmp" "$src"
    mv "$p.tmp" "$p"
    "$p" -v >&2
fi

u="$(userland_tar)"
if [[ ! -f "$u" ]]; then
    t0=$SECONDS
    root="$CACHE/work/userland-$DEBIAN_SUITE"
    rm -rf "$root"; mkdir -p "$root"
    log "debootstrap --variant=minbase $DEBIAN_SUITE (about 1-2 min)"
    debootstrap --variant=minbase "$DEBIAN_SUITE" "$root" http://deb.debian.org/debian >&2
    rm -rf "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/*
    tar --numeric-owner -C "$root" -cf "$u.tmp" .
    mv "$u.tmp" "$u"; rm -rf "$root"
    log "userland: done in $((SECONDS - t0)) s -> $u ($(du -h "$u" | cut -f1))"
fi
