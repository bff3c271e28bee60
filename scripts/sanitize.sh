#!/usr/bin/env bash
# Checks the code Rust cannot check at compile time:
# - loom model-checks the hand-off from a completed crypt item to a peer's serial stage,
#   as each execution model performs it (every interleaving up to three preemptions);
# - Miri runs the ordered queue's tests (its scheduling protocol is the one piece of
#   lock-free coordination in the pipeline) over many seeds, which checks every access
#   for data races and undefined behaviour across thread interleavings;
# - AddressSanitizer runs the io crate's tests (TUN, UDP batches, poll: the FFI and
#   `unsafe` code, which Miri cannot execute) and the daemon's tests, which start the
#   sanitized daemon itself in namespaces and push real traffic through it.
# Installs the nightly toolchain with Miri when missing. Run as root (TUN, namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$HOME/go/bin:$PATH"
if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
rustup component add --toolchain nightly miri rust-src >/dev/null

echo "== loom: the serial-stage hand-off of each execution model"
RUSTFLAGS="--cfg loom" cargo test --release --target-dir target/loom -p wirelane-dataplane \
    --lib queue::loom_tests

echo "== Miri: ordered queue, 16 seeds"
MIRIFLAGS="-Zmiri-many-seeds=0..16" cargo +nightly miri test -p wirelane-dataplane --lib queue::

echo "== AddressSanitizer: io, and the daemon under traffic"
# An explicit --target keeps build scripts and proc macros out of the sanitizer.
RUSTFLAGS="-Zsanitizer=address" ASAN_OPTIONS="detect_leaks=1" \
    cargo +nightly test --target x86_64-unknown-linux-gnu --target-dir target/asan \
    -p wirelane-io -p wirelane -- --test-threads 2
