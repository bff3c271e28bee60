#!/usr/bin/env bash
# The whole test suite: formatting, lints, unit and protocol tests, the network
# namespace integration tests against wireguard-go and boringtun, wireguard-go's own
# tests/netns.sh run unmodified against wirelane, the Debian package (scripts/package-test.sh),
# Miri and AddressSanitizer runs
# (scripts/sanitize.sh), and every fuzz target for a minute (FUZZ_SECONDS). Run as root
# on Debian; it installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$HOME/go/bin:$PATH"
rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
# What a test could leave behind: files in the UAPI socket directory, network
# namespaces, daemon processes. Compared before and after: each test must remove
# what it made, also when it fails.
leftovers() {
    { ls -A /var/run/wireguard 2>/dev/null || true; } | sed 's/^/file /'
    { ip netns list 2>/dev/null || true; } | awk '{print "netns " $1}'
    for name in wirelane wireguard-go boringtun-cli; do
        { pgrep -x "$name" || true; } | sed "s/^/process $name /"
    done
}
before=$(leftovers | sort)
# Namespace tests share /var/run/wireguard; names are unique, so two at a time is safe.
cargo test --workspace --locked -- --test-threads 2
sleep 1 # a daemon told to stop as its test ended removes its files within moments
left=$(comm -13 <(echo "$before") <(leftovers | sort))
if [[ -n $left ]]; then
    echo "the tests left behind:" >&2
    echo "$left" >&2
    exit 1
fi
echo "== wireguard-go's tests/netns.sh against wirelane"
bash scripts/third-party.sh target/debug/wirelane
echo "== the Debian package: build, install into a scratch root, check, remove"
bash scripts/package-test.sh
echo "== Miri and AddressSanitizer"
bash scripts/sanitize.sh
echo "== fuzz targets, ${FUZZ_SECONDS:-60} s each"
bash scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
