#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 8) over its committed seed corpus
# (fuzz/corpus/TARGET), with new inputs kept in a scratch directory. Fails on
# the first crash; libFuzzer leaves the input in fuzz/artifacts/TARGET/.
#   fuzz/run.sh [SECONDS] [TARGET...]
# Needs cargo-fuzz (cargo install cargo-fuzz). It runs on the stable toolchain
# with RUSTC_BOOTSTRAP=1 for the sanitizer flags.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-8}; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(ls fuzz_targets | sed 's/\.rs$//')
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O >/dev/null
scratch=$(mktemp -d); trap 'rm -rf "$scratch"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "$scratch/$t"
  line=$(cargo fuzz run -O "$t" "$scratch/$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 2>&1 | grep -E "^Done|SUMMARY|panicked" | tail -1)
  echo "fuzz $t: $line"
  case "$line" in Done*) ;; *) echo "fuzz $t FAILED" >&2; exit 1 ;; esac
done
