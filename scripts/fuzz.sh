#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for SECONDS each (default 60) with a 256 MiB RSS
# limit, after replaying the saved regression inputs once. Installs the nightly
# toolchain and cargo-fuzz when missing. Prints executions per target and exits
# non-zero on any crash, hang or OOM.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
secs="${1:-60}"
shift || true

if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cd fuzz && cargo +nightly fuzz list)
fi
(cd fuzz && cargo +nightly fuzz build)

# AddressSanitizer keeps freed memory in a quarantine of 256 MiB by default, which alone
# would reach the 256 MiB RSS limit on allocation-heavy targets; a small quarantine
# keeps the limit about the target's own memory.
export ASAN_OPTIONS="${ASAN_OPTIONS:-quarantine_size_mb=16}"

status=0
for t in "${targets[@]}"; do
    corpus="fuzz/corpus/$t"
    mkdir -p "$corpus" "fuzz/seeds/$t" "fuzz/regressions/$t"
    # Every earlier finding is replayed first: a regression fails here.
    if ! (cd fuzz && cargo +nightly fuzz run "$t" "regressions/$t" -- -runs=0 >/dev/null 2>&1); then
        echo "fuzz $t: a saved regression input fails again (fuzz/regressions/$t)"
        status=1
        continue
    fi
    log="fuzz/corpus/$t.log"
    if (cd fuzz && cargo +nightly fuzz run "$t" "corpus/$t" "seeds/$t" "regressions/$t" -- \
            -max_total_time="$secs" -rss_limit_mb=256 -timeout=10 -print_final_stats=1) \
            >"$log" 2>&1; then
        execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
        echo "fuzz $t: ${secs}s, $execs executions, no crash (corpus $(ls "$corpus" | wc -l) inputs)"
    else
        echo "fuzz $t: FAILED; last lines of $log:"
        tail -n 30 "$log"
        echo "crash inputs: fuzz/artifacts/$t/ (copy them to fuzz/regressions/$t/ once fixed)"
        status=1
    fi
done
exit $status
