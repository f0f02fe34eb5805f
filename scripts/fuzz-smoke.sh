#!/usr/bin/env bash
# Bounded fuzz smoke for `make test`: each of the 8 targets runs on the committed corpus (read-only; new
# inputs go to a temporary directory) for FUZZ_SMOKE_SECONDS (default 15 s), so 120 s of fuzzing in all,
# after `cargo fuzz build`. Installs the nightly toolchain and cargo-fuzz if missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SECONDS_EACH="${FUZZ_SMOKE_SECONDS:-15}"
CARGO_FUZZ_VERSION="0.13.2"

if ! rustup toolchain list | grep -q '^nightly'; then
    echo "fuzz-smoke: rustup toolchain install nightly --profile minimal"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
    echo "fuzz-smoke: cargo install cargo-fuzz@$CARGO_FUZZ_VERSION"
    cargo install --locked "cargo-fuzz@$CARGO_FUZZ_VERSION"
fi
cargo +nightly fuzz build
targets=(request_info discovery config leases endpoint_slice not_found identity buckets header_map openapi_index)
for target in "${targets[@]}"; do
    out="$(mktemp -d)"
    echo "fuzz-smoke: $target for ${SECONDS_EACH}s"
    cargo +nightly fuzz run "$target" "$out" "fuzz/corpus/$target" -- \
        -max_total_time="$SECONDS_EACH" -max_len=262144 -rss_limit_mb=2048 2>&1 | tail -n 3
    rm -rf "$out"
done
echo "fuzz-smoke: ${#targets[@]} targets × ${SECONDS_EACH}s = $(( ${#targets[@]} * SECONDS_EACH ))s of fuzzing, no crash"
