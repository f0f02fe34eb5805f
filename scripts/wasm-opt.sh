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
#
# Exports: the Rust SDK exports every proxy-wasm callback, and Envoy calls each exported one, so a
# request would enter the VM for `proxy_on_log`, `proxy_on_done` and every request-body chunk although
# the module does nothing there (each VM entry costs Envoy about 1 800 instructions: docs/benchmarks.md).
# binaryen's wasm-metadce keeps only the exports below (the ABI's own, and the callbacks src/wasm
# implements) and drops the rest; tests/e2e/test_wasm_exports.py checks the list against src/wasm.
KEEP=(memory _initialize proxy_abi_version_0_2_1 proxy_on_memory_allocate proxy_on_vm_start
      proxy_on_configure proxy_on_tick proxy_on_context_create proxy_on_delete proxy_on_http_call_response
      proxy_on_request_headers proxy_on_response_headers proxy_on_response_body)
tmp="$out.tmp.$$"
graph="$out.graph.$$"
trap 'rm -f "$tmp" "$tmp.dce" "$graph"' EXIT
{
    printf '[{"name":"outside","root":true,"reaches":['
    sep=""; for e in "${KEEP[@]}"; do printf '%s"e-%s"' "$sep" "$e"; sep=","; done
    printf ']}'
    for e in "${KEEP[@]}"; do printf ',{"name":"e-%s","export":"%s"}' "$e" "$e"; done
    printf ']\n'
} > "$graph"
wasm-metadce "${FEATURES[@]}" -f "$graph" "$in" -o "$tmp.dce" >/dev/null
wasm-opt -Oz -fimfs=0 --one-caller-inline-max-function-size=0 --strip-debug --strip-producers \
    "${FEATURES[@]}" "$tmp.dce" -o "$tmp"
mv -f "$tmp" "$out"
