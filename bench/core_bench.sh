#!/usr/bin/env bash
# Instruction counts of the pure core (examples/core_bench.rs) under valgrind's callgrind.
#
#   bash bench/core_bench.sh            > markdown table on stdout, progress on stderr
#   bash bench/core_bench.sh 'decide/'  only workloads whose name contains 'decide/'
#
# Each workload runs twice, `lo` and `hi` iterations after the same set-up; one operation costs
# (Ir(hi) - Ir(lo)) / (hi - lo). Instruction counts are deterministic (same binary, same input, same
# count), unlike times, so they do not depend on what else the machine is doing. They are counts of
# the native x86-64 build (release profile: opt-level "s", LTO), not of the .wasm under V8, so they
# compare operations with each other; Envoy's CPU per request is bench/envoy_bench.py's business.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

FILTER="${1:-}"

if ! command -v valgrind >/dev/null; then
    echo "core_bench: installing valgrind" >&2
    apt-get update >&2 && apt-get install -y valgrind >&2
fi

cargo build --release --example core_bench >&2
BIN=target/release/examples/core_bench

# 1234567 -> 1,234,567
group() { sed ':a;s/\B[0-9]\{3\}\>/,&/;ta' <<<"$1"; }
signed() { if (($1 >= 0)); then echo "+$(group "$1")"; else echo "-$(group "${1#-}")"; fi; }

# Total instructions of one run (callgrind's "Collected" line); the run's notes go to $2.
instructions() {
    local workload="$1" n="$2" notes="$3" log
    log="$(mktemp)"
    valgrind --tool=callgrind --callgrind-out-file=/dev/null --log-file="$log" \
        "$BIN" run "$workload" "$n" >"$notes"
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$log"
    rm -f "$log"
}

notes="$(mktemp)"
trap 'rm -f "$notes"' EXIT
declare -A PER
ROWS_REQUEST=() ROWS_SNAPSHOT=()
while IFS=$'\t' read -r name unit lo hi; do
    [[ -n "$FILTER" && "$name" != *"$FILTER"* ]] && continue
    echo "core_bench: $name ($lo and $hi iterations)" >&2
    ir_lo="$(instructions "$name" "$lo" "$notes")"
    ir_hi="$(instructions "$name" "$hi" "$notes")"
    note="$(sed -n 's/^note: //p' "$notes" | paste -sd ';' - | sed 's/;/; /g; s/|/\\|/g')"
    per="$(( (ir_hi - ir_lo) / (hi - lo) ))"
    PER[$name]="$per"
    row="$(printf '| `%s` | %s | %s | %s | %s→%s |' "$name" "$unit" "$(group "$per")" "$note" "$lo" "$hi")"
    case "$name" in
        decide*|parse/*|accept/*) ROWS_REQUEST+=("$row") ;;
        *) ROWS_SNAPSHOT+=("$row") ;;
    esac
done < <("$BIN" list)

header() {
    echo "| workload | unit | instructions per unit | input → outcome | iterations (lo→hi) |"
    echo "|---|---|---:|---|---|"
}
if ((${#ROWS_REQUEST[@]})); then
    echo "Request path (what the filter runs per request, minus the host calls):"
    echo
    header
    printf '%s\n' "${ROWS_REQUEST[@]}"
    echo
    for req in local-get peer-get; do
        small="${PER[decide/$req]:-}" big="${PER[decide-big/$req]:-}"
        if [[ -n "$small" && -n "$big" ]]; then
            echo "- \`decide\` of \`$req\` with the large table vs the fixtures' table:" \
                "$(group "$big") vs $(group "$small") instructions ($(signed $((big - small))))."
        fi
    done
    echo
fi
if ((${#ROWS_SNAPSHOT[@]})); then
    echo "Snapshot side (the discovery service per round; a filter VM per new generation):"
    echo
    header
    printf '%s\n' "${ROWS_SNAPSHOT[@]}"
    echo
fi
echo "Command: \`bash bench/core_bench.sh\` (valgrind --tool=callgrind on" \
    "\`target/release/examples/core_bench run <workload> <n>\`, built by" \
    "\`cargo build --release --example core_bench\`)."

# Peak heap of the discovery service building a snapshot (valgrind massif, native build): the wasm
# VM's linear memory never shrinks, so this peak is what the service VM keeps resident.
big="$(mktemp -d)"
trap 'rm -f "$notes"; rm -rf "$big"' EXIT
F=tests/fixtures/k8s-discovery
"$BIN" synth "$F/aggregated_v2.k8s-1.33.json" 400 2 25 > "$big/old.json"
"$BIN" synth "$F/aggregated_v2.k8s-1.37-dev-fork.json" 400 2 25 > "$big/new.json"
peak() {  # peak heap (useful + allocator overhead) in MB, minus the inputs the tool itself holds
    valgrind --tool=massif --massif-out-file="$big/massif.out" "$BIN" snapshot "$@" >/dev/null 2>&1
    local inputs=0 f
    for f in "$@"; do inputs=$((inputs + $(stat -c %s "$f"))); done
    awk -v inputs="$inputs" -F= '/^mem_heap_B=/{h=$2} /^mem_heap_extra_B=/{t=h+$2; if (t>m) m=t} END {printf "%.1f", (m-inputs)/1e6}' "$big/massif.out"
}
echo
echo "Discovery service memory: peak heap of \`core_bench snapshot\` (one discovery round of three servers"
echo "and the snapshot build, as the service runs it) under \`valgrind --tool=massif\`, minus the input"
echo "documents the tool itself holds: fixtures $(peak "$F/aggregated_v2.k8s-1.33.json" "$F/aggregated_v2.k8s-1.37-dev-fork.json" "$F/aggregated_v2.k8s-1.37-dev-fork.json") MB;"
echo "large table (+20 000 resources per server) $(peak "$big/old.json" "$big/new.json" "$big/new.json") MB."
echo "Native x86-64 (8-byte pointers, glibc malloc): the wasm VM's own numbers are in the per-VM table above."
