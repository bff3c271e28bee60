#!/usr/bin/env bash
# The main job on a built-in default: two network namespaces joined by a veth pair, a
# wirelane tunnel between them, traffic through it, and the figures. Run as root.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:/usr/local/go/bin:$HOME/go/bin:$PATH"
cargo build --release --locked -p wirelane
BIN="$PWD/target/release/wirelane"

tag="wld$$"
A="${tag}a"; B="${tag}b"
cleanup() {
    for ns in "$A" "$B"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
    done
    sleep 0.3
    for ns in "$A" "$B"; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$work"
}
work=$(mktemp -d)
trap cleanup EXIT INT TERM

ip netns add "$A"; ip netns add "$B"
ip link add "${tag}va" netns "$A" type veth peer name "${tag}vb" netns "$B"
ip -n "$A" addr add 192.168.93.1/24 dev "${tag}va"; ip -n "$A" link set "${tag}va" up; ip -n "$A" link set lo up
ip -n "$B" addr add 192.168.93.2/24 dev "${tag}vb"; ip -n "$B" link set "${tag}vb" up; ip -n "$B" link set lo up

(umask 077; wg genkey > "$work/a.key"; wg genkey > "$work/b.key")
pa=$(wg pubkey < "$work/a.key"); pb=$(wg pubkey < "$work/b.key")
for side in a b; do
    if [ $side = a ]; then ns=$A; me=1; other=2; peer=$pb; else ns=$B; me=2; other=1; peer=$pa; fi
    ifname="${tag}${side}"
    ip netns exec "$ns" "$BIN" --foreground --log-level warn "$ifname" &
    for _ in $(seq 100); do [ -S "/var/run/wireguard/$ifname.sock" ] && break; sleep 0.05; done
    ip netns exec "$ns" wg set "$ifname" private-key "$work/$side.key" listen-port 51820 \
        peer "$peer" endpoint "192.168.93.$other:51820" allowed-ips "10.93.0.$other/32"
    ip -n "$ns" addr add "10.93.0.$me/24" dev "$ifname"
    ip -n "$ns" link set "$ifname" up
done

echo "== handshake and latency (ping through the tunnel)"
ip netns exec "$A" ping -c 20 -i 0.05 -q 10.93.0.2 | tail -2
echo "== TCP throughput, 1 stream, 10 s (iperf3)"
ip netns exec "$B" iperf3 -s -1 -D -B 10.93.0.2 >/dev/null
sleep 0.3
ip netns exec "$A" iperf3 -c 10.93.0.2 -t 10 -f m | grep -E 'sender|receiver'
echo "== plain veth for comparison, 1 stream, 5 s"
ip netns exec "$B" iperf3 -s -1 -D -B 192.168.93.2 >/dev/null
sleep 0.3
ip netns exec "$A" iperf3 -c 192.168.93.2 -t 5 -f m | grep -E 'sender|receiver'
echo "== wg show"
ip netns exec "$A" wg show "${tag}a"
