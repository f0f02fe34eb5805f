#!/usr/bin/env bash
# Variants of bench/null/least.wat with one part removed, for `scripts/k8s/hop.py --module` (what each
# of the filter's VM entries and host calls costs on the hop; docs/benchmarks.md, sixth round):
#   nobody (no response-body entry), nodelete (no delete entry), nostatus (no `:status` read),
#   nopairs (no header-map read), reqonly (no response phase: no response-headers, body or delete entry);
# and two with work added, the same loop of 20 000 iterations: heavydelete (in the delete entry, which
# Envoy calls as the stream ends) and heavyreq (in the request-headers entry), to see whether the end of
# a stream is on the client's latency.
#
#   bash bench/null/least_variants.sh      -> target/bench-noop/least-<variant>.wasm, and prints the
#                                             hop.py arguments that run them
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
OUT="$(cd ../.. && pwd)/target/bench-noop"
mkdir -p "$OUT"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
sed '/"proxy_on_response_body"/d' least.wat > "$tmp/nobody.wat"
sed '/"proxy_on_delete"/d' least.wat > "$tmp/nodelete.wat"
sed '/(call \$value /d' least.wat > "$tmp/nostatus.wat"
sed '/(call \$pairs /d' least.wat > "$tmp/nopairs.wat"
# The response-headers function is three lines: its export line, the `:status` read, its result.
sed '/"proxy_on_response_body"/d; /"proxy_on_delete"/d; /"proxy_on_response_headers"/,+2d' least.wat > "$tmp/reqonly.wat"
loop='(local $i i32) (local.set $i (i32.const 20000)) (loop $l (local.set $i (i32.sub (local.get $i) (i32.const 1))) (br_if $l (local.get $i)))'
sed "s/^  (func (export \"proxy_on_delete\") (param i32))\$/  (func (export \"proxy_on_delete\") (param i32) $loop)/" least.wat > "$tmp/heavydelete.wat"
sed "s/^  (func (export \"proxy_on_request_headers\") (param i32 i32 i32) (result i32)\$/&\n    $loop/" least.wat > "$tmp/heavyreq.wat"
args=()
for v in nobody nodelete nostatus nopairs reqonly heavydelete heavyreq; do
    if cmp -s least.wat "$tmp/$v.wat"; then
        echo "least_variants: $v removed nothing (least.wat changed?)" >&2
        exit 1
    fi
    wasm-as "$tmp/$v.wat" -o "$OUT/least-$v.wasm"
    args+=(--module "$v=$OUT/least-$v.wasm")
done
echo "${args[@]}"
