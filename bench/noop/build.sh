#!/usr/bin/env bash
# The wasm floor of `make bench` and `make hop` (bench/noop), built exactly like the product's .wasm:
# cargo's release build with the same profile (opt-level s, LTO, one codegen unit, panic=abort,
# stripped), then the same scripts/wasm-opt.sh. `make lint` (so `make test`) runs it with --lint, which
# first checks it with rustfmt and clippy (wasm target, -D warnings) like the product.
#
#   bash bench/noop/build.sh [--lint]     -> target/bench-noop/kpp_bench_noop.wasm, target/bench-noop/null.wasm,
#                                            target/bench-noop/least.wasm
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
ROOT="$(cd ../.. && pwd)"
TARGET_DIR="$ROOT/target/bench-noop"
if [[ "${1:-}" == "--lint" ]]; then
    cargo fmt --check
    cargo clippy --release --target wasm32-wasip1 --target-dir "$TARGET_DIR" -- -D warnings
fi
cargo build --release --target wasm32-wasip1 --target-dir "$TARGET_DIR"
bash "$ROOT/scripts/wasm-opt.sh" "$TARGET_DIR/wasm32-wasip1/release/kpp_bench_noop.wasm" "$TARGET_DIR/kpp_bench_noop.wasm"
# The null filter of `make hop` (bench/null/null.wat): the proxy-wasm ABI with nothing in it.
wasm-as "$ROOT/bench/null/null.wat" -o "$TARGET_DIR/null.wasm"
# The least this filter's job costs on the ABI (bench/null/least.wat): its VM entries and host calls, no code.
wasm-as "$ROOT/bench/null/least.wat" -o "$TARGET_DIR/least.wasm"
