#!/usr/bin/env bash
# Runs every cargo-fuzz target of this directory for the given number of
# seconds each (default 60), installing cargo-fuzz first if it is missing.
# Needs the nightly toolchain (libFuzzer instrumentation).
set -euo pipefail

seconds="${1:-60}"
cd "$(dirname "$0")"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

for target in $(cargo +nightly fuzz list); do
    echo "fuzzing ${target} for ${seconds}s"
    # -jobs/-workers stay at 1: the machine's two cores are shared.
    cargo +nightly fuzz run "${target}" -- -max_total_time="${seconds}" -rss_limit_mb=2048
done
echo "fuzzing finished: every target ran ${seconds}s without a crash"
