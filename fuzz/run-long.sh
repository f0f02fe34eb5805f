#!/usr/bin/env bash
# Long fuzz runs (≥ 10 min per target). Results in fuzz/long-run-<target>.log.
set -u
cd "$(dirname "$0")/.."
for t in request_info discovery config; do
  cargo +nightly fuzz run "$t" "fuzz/corpus/$t" -- -max_total_time="${FUZZ_SECONDS:-600}" -max_len=262144 -rss_limit_mb=2048 \
    > "fuzz/long-run-$t.log" 2>&1
  echo "$t exit $?" >> fuzz/long-run-summary.log
done
