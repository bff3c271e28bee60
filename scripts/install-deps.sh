#!/usr/bin/env bash
# Installs everything the tests and the demo need on a fresh Debian machine (run as root).
# Idempotent: each step is skipped when its tool is already present.
set -euo pipefail

WIREGUARD_GO_VERSION="v0.0.0-20260522210424-ecfc5a8d5446"
export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$HOME/go/bin:$PATH"

need_apt=()
command -v wg >/dev/null 2>&1 || need_apt+=(wireguard-tools)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v iperf3 >/dev/null 2>&1 || need_apt+=(iperf3)
command -v ping >/dev/null 2>&1 || need_apt+=(iputils-ping)
# wireguard-go's tests/netns.sh uses ncat and iptables.
command -v ncat >/dev/null 2>&1 || need_apt+=(ncat)
command -v iptables >/dev/null 2>&1 || need_apt+=(iptables)
command -v curl >/dev/null 2>&1 || need_apt+=(curl ca-certificates)
command -v cc >/dev/null 2>&1 || need_apt+=(build-essential)
command -v go >/dev/null 2>&1 || need_apt+=(golang-go)
# The package test reads the installed man page and verifies the systemd unit.
command -v man >/dev/null 2>&1 || need_apt+=(man-db)
command -v systemd-analyze >/dev/null 2>&1 || need_apt+=(systemd)
# The metrics test scrapes with a real Prometheus server and checks with promtool.
installs_prometheus=0
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
    need_apt+=(prometheus)
    installs_prometheus=1
fi
if [ "${#need_apt[@]}" -gt 0 ]; then
    echo "install-deps: apt-get install ${need_apt[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need_apt[@]}"
    # The tests start their own Prometheus in a namespace; the package's system
    # service, which installing it starts where systemd runs, is not wanted here.
    if [ "$installs_prometheus" = 1 ] && [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus >/dev/null 2>&1 || true
    fi
fi

if ! command -v cargo >/dev/null 2>&1; then
    echo "install-deps: installing Rust with rustup"
    if ! curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt; then
        echo "install-deps: rustup unreachable; falling back to Debian's cargo"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cargo rustc rustfmt rust-clippy
    fi
fi

if ! command -v wireguard-go >/dev/null 2>&1; then
    echo "install-deps: go install wireguard-go@$WIREGUARD_GO_VERSION"
    if GOBIN="$HOME/go/bin" go install "golang.zx2c4.com/wireguard@$WIREGUARD_GO_VERSION"; then
        mv "$HOME/go/bin/wireguard" "$HOME/go/bin/wireguard-go"
    else
        echo "install-deps: go install failed (Go too old?); using Debian's older wireguard-go"
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends wireguard-go
    fi
fi

if ! command -v boringtun-cli >/dev/null 2>&1; then
    echo "install-deps: cargo install boringtun-cli"
    cargo install --locked boringtun-cli
fi

echo "install-deps: ready: $(wg --version 2>&1 | head -1); wireguard-go $(wireguard-go --version 2>&1 | head -1); $(boringtun-cli --version 2>&1 | head -1)"
