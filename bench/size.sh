#!/usr/bin/env bash
# The .wasm's size, before and after wasm-opt, and by crate (twiggy on a build that keeps function
# names; the shipped build strips them, which is why its total is smaller than the names' sum).
#
#   bash bench/size.sh > target/bench/size.md     (make bench runs it)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
TWIGGY_VERSION=0.8.0
TWIGGY=.tools/twiggy/bin/twiggy
if [[ ! -x "$TWIGGY" ]]; then
    echo "size: cargo install twiggy@$TWIGGY_VERSION (about 2 min)" >&2
    cargo install twiggy --version "$TWIGGY_VERSION" --locked --root .tools/twiggy >&2
fi
# The same build as make build, but keeping the name section (strip = false), in its own target dir.
CARGO_PROFILE_RELEASE_STRIP=false cargo build --release --target wasm32-wasip1 --target-dir target/size >&2
named=target/size/named.wasm
wasm-opt -Oz -fimfs=0 --one-caller-inline-max-function-size=0 -g --strip-dwarf --enable-bulk-memory --enable-sign-ext --enable-mutable-globals \
    --enable-nontrapping-float-to-int --enable-reference-types --enable-multivalue \
    target/size/wasm32-wasip1/release/kube_peer_proxy.wasm -o "$named"
"$TWIGGY" top -n 1000000 -f csv "$named" > target/size/top.csv
# The floor: bench/noop (proxy-wasm, std, a HashMap and a format!), built and optimized the same way.
bash bench/noop/build.sh >&2
cp target/bench-noop/kpp_bench_noop.wasm target/size/noop.opt.wasm
.venv/bin/python - <<'PY'
import collections, csv, re
from pathlib import Path

rows = list(csv.DictReader(open("target/size/top.csv")))
by, top = collections.Counter(), collections.defaultdict(list)
for r in rows:
    name, size = r["Name"], int(r["ShallowSize"])
    if name.startswith(("custom section", '"')):
        continue  # the name section itself: not shipped
    if name.startswith("data segment"):
        crate = "(data: string constants, tables)"
    else:
        # A generic function counts for the crate whose path it starts with (a serde_json
        # instantiation for one of our types counts as serde_json).
        m = re.match(r"^<?(?:&mut |&)?([A-Za-z_][A-Za-z0-9_]*)(?:\[[0-9a-f]+\])?::", name)
        crate = m.group(1) if m else "(glue: imports, exports, tables, unnamed)"
    by[crate] += size
    top[crate].append((size, re.sub(r"(\[[0-9a-f]+\])|(::h[0-9a-f]{16})", "", name)))
raw = Path("target/wasm32-wasip1/release/kube_peer_proxy.wasm")
opt = Path("target/kube_peer_proxy.wasm")
print(f"`make build`: cargo's release build `{raw}` {raw.stat().st_size:,} bytes (opt-level s, LTO, one codegen "
      f"unit, panic=abort, stripped); after `scripts/wasm-opt.sh` (`wasm-opt -Oz`, inlining off) `{opt}` "
      f"**{opt.stat().st_size:,} bytes**. By crate (twiggy 0.8 on the same build with function names kept, "
      f"after the same wasm-opt; sizes of the code and data, names excluded):")
noop = Path("target/size/noop.opt.wasm").stat().st_size
print(f"For scale, the do-nothing filter of `bench/noop` after the same wasm-opt: {noop:,} bytes.")
print()
print("| crate | bytes | share | largest items |")
print("|---|---:|---:|---|")
total = sum(by.values())
for crate, size in by.most_common(14):
    items = ", ".join(f"`{n[:70]}` {s:,}" for s, n in sorted(top[crate], reverse=True)[:2])
    print(f"| {crate} | {size:,} | {size / total:.0%} | {items} |")
print(f"| total | {total:,} | | |")
print()
PY
