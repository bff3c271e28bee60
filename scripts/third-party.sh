#!/usr/bin/env bash
# Runs wireguard-go's own test script, tests/netns.sh, unmodified and from where the
# Go module cache keeps it, against a wirelane binary (default: the release build).
# The script takes any user-space implementation as its argument: it builds three
# namespaces, moves interfaces between them, and runs ping, iperf3 (TCP and UDP, at two
# MTUs, over IPv4 and IPv6), roaming, a NAT and the source-address cases through them.
# Its output goes to a log whose tail is printed on failure.
#
#   scripts/third-party.sh [PATH-TO-WIRELANE]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$HOME/go/bin:$PATH"
version="$(sed -n 's/^WIREGUARD_GO_VERSION="\(.*\)"$/\1/p' scripts/install-deps.sh)"
module="golang.zx2c4.com/wireguard@$version"
dir="$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "$module" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')"
script="$dir/tests/netns.sh"
[ -f "$script" ] || { echo "third-party: $script not found" >&2; exit 1; }
bin="$(realpath "${1:-target/release/wirelane}")"
log="$(mktemp /tmp/wireguard-go-netns.XXXXXX.log)"
echo "third-party: $script $bin (log: $log)"
if ! bash "$script" "$bin" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "third-party: wireguard-go's tests/netns.sh failed against $bin" >&2
    exit 1
fi
echo "third-party: wireguard-go's tests/netns.sh passed"
