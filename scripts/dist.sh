#!/usr/bin/env bash
# `make dist`: the release artifacts, from the .wasm that `make build` made (docs/install.md).
#
#   dist/kube_peer_proxy-<version>.wasm         the filter (reproducible: tests/e2e/test_release.py)
#   dist/kube_peer_proxy-<version>.wasm.sha256  sha256sum format; what Envoy's code.remote needs
#   dist/bootstrap/*.yaml                       kpp.render output for placeholder nodes
#   dist/static-pod.yaml                        deploy/static-pod.yaml (the .wasm as a hostPath file)
#   dist/static-pod-image-volume.yaml           the same pod, .wasm from the OCI image (image volume)
#   dist/rbac.yaml                              deploy/rbac.yaml
#   dist/oci/                                   OCI image layout, tag <version>: the Wasm image "compat"
#                                               variant (one tar+gzip layer with plugin.wasm, manifest
#                                               annotation module.wasm.image/variant=compat), as an
#                                               index for linux/amd64 and linux/arm64 (one shared layer)
#   dist/oci-digests.txt                        the index digest (Kubernetes image volumes, crane, skopeo)
#                                               and each platform's manifest digest (Istio's and Envoy
#                                               Gateway's sha256: they resolve linux/amd64)
#   dist/SHA256SUMS                             of every file above except the OCI layout's own blobs
#
# The version is Cargo.toml's. Environment: DIST_DIR (default dist), KPP_IMAGE_REPO (the repository
# written into the image-volume manifest, default registry.example.com/kube-peer-proxy), KPP_WASM (the
# .wasm to package, default make build's).
# Tools: buildah (the image), the .venv python (PyYAML; kpp from python/ on its path); scripts/setup.sh
# installs them.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
OUT="$(realpath -m "${DIST_DIR:-$ROOT/dist}")"
# The .wasm `make build` wrote (it honours CARGO_TARGET_DIR); KPP_WASM names another, e.g. the build of the
# current tree that tests/e2e/test_install_doc.py makes without touching target/kube_peer_proxy.wasm.
WASM="$(realpath -m "${KPP_WASM:-${CARGO_TARGET_DIR:-$ROOT/target}/kube_peer_proxy.wasm}")"
IMAGE_REPO="${KPP_IMAGE_REPO:-registry.example.com/kube-peer-proxy}"
PY="$ROOT/.venv/bin/python"
log() { echo "dist: $*"; }
die() { echo "dist: $*" >&2; exit 1; }

[[ -x "$PY" ]] || die "$PY missing: run scripts/setup.sh"
command -v buildah >/dev/null || die "buildah missing: run scripts/setup.sh"
[[ -f "$WASM" ]] || die "$WASM missing: run make build (make dist does)"
VERSION="$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["package"]["version"])' \
    "$ROOT/Cargo.toml")"
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$ ]] || die "odd version in Cargo.toml: $VERSION"
NAME="kube_peer_proxy-$VERSION.wasm"

rm -rf "$OUT"
mkdir -p "$OUT/bootstrap"

# ---- the .wasm and its sha256 -------------------------------------------------------------------
install -m 0644 "$WASM" "$OUT/$NAME"
(cd "$OUT" && sha256sum "$NAME" > "$NAME.sha256")
WASM_SHA="$(cut -d' ' -f1 "$OUT/$NAME.sha256")"
log "$NAME sha256 $WASM_SHA"

# ---- bootstraps: placeholder nodes (docs/deploy.md renders the real ones) --------------------------
# kubeadm profile on cp-1 (192.0.2.0/24 is documentation-only, RFC 5737) with peers cp-2 and cp-3,
# the same in lease mode, and the same with the .wasm from the image volume; and a plain loopback
# one (the demo's layout: run `envoy -c bootstrap/plain.yaml` in dist/ next to the .wasm).
HOSTPATH_WASM=/etc/kubernetes/kube-peer-proxy/kube_peer_proxy.wasm
IMAGE_WASM="$("$PY" -c 'from kpp import image_volume; print(image_volume.WASM_PATH)')"
kubeadm=(--kubeadm /etc/kubernetes/pki --node cp-1 --node-ip 192.0.2.11 --apiserver 127.0.0.1:6443)
peers=(--peer cp-2=192.0.2.12 --peer cp-3=192.0.2.13)
"$PY" -m kpp.render "${kubeadm[@]}" "${peers[@]}" --wasm "$HOSTPATH_WASM" > "$OUT/bootstrap/kubeadm-cp-1.yaml"
"$PY" -m kpp.render "${kubeadm[@]}" --lease-local-hostname cp-1 --wasm "$HOSTPATH_WASM" \
    > "$OUT/bootstrap/kubeadm-cp-1-leases.yaml"
"$PY" -m kpp.render "${kubeadm[@]}" "${peers[@]}" --wasm "$IMAGE_WASM" \
    > "$OUT/bootstrap/kubeadm-cp-1-image-volume.yaml"
# The kubeadm bootstraps' TLS secrets as --write-sds writes them on a node (they name /etc/kubernetes/pki):
# install them in /etc/kubernetes/kube-peer-proxy/sds/ (docs/deploy.md "Certificate renewal").
"$PY" -c 'import sys; from kpp import render; render.write_kubeadm_sds(sys.argv[1], "/etc/kubernetes/pki")' \
    "$OUT/sds"
"$PY" -m kpp.render --node a --listen 18441 --admin 19441 --local 127.0.0.1:16441 \
    --peer b=127.0.0.1:16442 --peer c=127.0.0.1:16443 --wasm "$NAME" > "$OUT/bootstrap/plain.yaml"

# ---- manifests ------------------------------------------------------------------------------------
install -m 0644 deploy/static-pod.yaml "$OUT/static-pod.yaml"
install -m 0644 deploy/rbac.yaml "$OUT/rbac.yaml"

# ---- the OCI image (buildah) ----------------------------------------------------------------------
# Deterministic: file time and created time 0, no history, no builder label, so the same .wasm gives
# the same digests. Storage is a throw-away vfs root, nothing is left in /var/lib/containers.
store="$(mktemp -d "${TMPDIR:-/tmp}/kpp-buildah.XXXXXX")"
trap 'buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs rm --all >/dev/null 2>&1 || true; rm -rf "$store"' EXIT
bah() { buildah --root "$store/root" --runroot "$store/run" --storage-driver vfs "$@"; }
install -m 0644 "$WASM" "$store/plugin.wasm"
list="localhost/kube-peer-proxy:$VERSION"
bah manifest create "$list" >/dev/null
for arch in amd64 arm64; do
    ctr="$(bah from --name "kpp-$arch" scratch)"
    bah config --os linux --arch "$arch" \
        --annotation module.wasm.image/variant=compat \
        --annotation org.opencontainers.image.title=kube-peer-proxy \
        --annotation "org.opencontainers.image.version=$VERSION" \
        --annotation org.opencontainers.image.licenses=Apache-2.0 \
        "$ctr"
    # One `buildah copy`, hence exactly one layer (the compat spec), plugin.wasm at the root.
    bah copy --chmod 0644 "$ctr" "$store/plugin.wasm" /plugin.wasm >/dev/null
    bah commit --quiet --timestamp 0 --omit-history --identity-label=false --disable-compression=false \
        "$ctr" "localhost/kube-peer-proxy:$VERSION-$arch" >/dev/null
    bah manifest add "$list" "containers-storage:localhost/kube-peer-proxy:$VERSION-$arch" >/dev/null
done
bah manifest push --quiet --all --format oci "$list" "oci:$OUT/oci:$VERSION"
# Digests, read back from the layout (index.json -> the image index -> one manifest per platform).
"$PY" - "$OUT/oci" "$VERSION" "$IMAGE_REPO" > "$OUT/oci-digests.txt" <<'PY'
import json, pathlib, sys
layout, tag, repo = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
blob = lambda d: json.loads((layout / "blobs" / d.replace(":", "/", 1)).read_text())
(top,) = [m for m in json.loads((layout / "index.json").read_text())["manifests"]
          if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
print(f"{top['digest']}  {repo}:{tag}  image index (Kubernetes image volumes, crane, skopeo)")
for m in blob(top["digest"])["manifests"]:
    p = m["platform"]
    plat = f"{p['os']}/{p['architecture']}"
    use = " (the sha256 for Istio and Envoy Gateway, which resolve linux/amd64)" if plat == "linux/amd64" else ""
    print(f"{m['digest']}  {repo}:{tag}  {plat} image manifest{use}")
PY
OCI_DIGEST="$(head -n1 "$OUT/oci-digests.txt" | cut -d' ' -f1)"
log "OCI image $IMAGE_REPO:$VERSION index digest $OCI_DIGEST (dist/oci, tag $VERSION)"

# ---- the image-volume static pod, derived from deploy/static-pod.yaml -------------------------------
"$PY" -m kpp.image_volume --reference "$IMAGE_REPO:$VERSION@$OCI_DIGEST" \
    > "$OUT/static-pod-image-volume.yaml"

(cd "$OUT" && find . -path ./oci -prune -o -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort \
    | xargs sha256sum > SHA256SUMS)
log "wrote $OUT:"
(cd "$OUT" && find . -type f ! -path './oci/*' -printf '  %-40P %8s bytes\n' | LC_ALL=C sort)
echo "  oci/                                     $(du -sb "$OUT/oci" | cut -f1) bytes"
