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
# No inlining: with wasm-opt's default inlining the module is 2 % smaller but V8 keeps about 13 MiB
# more per Envoy (measured with bench/envoy_bench.py's scenario (b): 121 MiB RSS with -Oz, 108 MiB
# with -Oz and inlining off, 106 MiB with cargo's output; 2026-12-02).
tmp="$out.tmp.$$"
wasm-opt -Oz -fimfs=0 --one-caller-inline-max-function-size=0 --strip-debug --strip-producers \
    "${FEATURES[@]}" "$in" -o "$tmp"
mv -f "$tmp" "$out"
