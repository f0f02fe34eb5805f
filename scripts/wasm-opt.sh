#!/usr/bin/env bash
# The shipped .wasm: cargo's release build, optimized for size by binaryen's wasm-opt (Debian's
# `binaryen` package; scripts/setup.sh installs it). The features are named one by one: they are
# what rustc 1.95 emits for wasm32-wasip1 (and V8 in Envoy runs); `-all` would also enable
# proposals V8 does not run. Same input + same wasm-opt version = same bytes (tests/e2e/test_release.py).
#
#   bash scripts/wasm-opt.sh <cargo .wasm> <out .wasm>
set -euo pipefail
in="$1" out="$2"
command -v wasm-opt >/dev/null || { echo "wasm-opt missing: run scripts/setup.sh (apt package binaryen)" >&2; exit 1; }
FEATURES=(--enable-bulk-memory --enable-sign-ext --enable-mutable-globals --enable-nontrapping-float-to-int
          --enable-reference-types --enable-multivalue)
tmp="$out.tmp.$$"
wasm-opt -Oz --strip-debug --strip-producers "${FEATURES[@]}" "$in" -o "$tmp"
mv -f "$tmp" "$out"
