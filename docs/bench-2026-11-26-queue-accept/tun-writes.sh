#!/bin/bash
# System calls per GB in one `tcp 4x` cell: the receiving daemon's TUN writes (writev)
# and the sending daemon's UDP sends (sendmsg), counted by `perf stat` for 4 s in the
# middle of a 14 s run. Usage (from the repository root, after a release build):
#   WIRELANE_LAB_BUILDS=before=<9aa95a3's daemon> \
#     docs/bench-2026-11-26-queue-accept/tun-writes.sh IMPLEMENTATION
# perf's counting slows both daemons, so compare the per-GB counts, not the goodput.
set -eu
impl=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/m.toml" <<EOT
name = "tun-writes"
implementations = ["$impl"]
baseline = "$impl"
repeats = 1
duration_s = 14
[[workload]]
kind = "tcp"
streams = [4]
direction = ["a-b"]
EOT
target/release/wirelane-lab run "$work/m.toml" --out "$work/out" > "$work/lab.log" 2>&1 &
lab=$!
sleep 7
for pid in $(pgrep -x 'wirelane|wirelane-before'); do
    perf stat -e 'syscalls:sys_enter_writev,syscalls:sys_enter_sendmsg' -p "$pid" \
        -o "$work/stat-$pid.txt" -- sleep 4 &
done
wait
goodput=$(grep -a '^| tcp 4x' "$work/lab.log" | head -1 | awk -F'|' '{print $5}' | awk '{print $1}')
python3 - "$impl" "$goodput" "$work"/stat-*.txt <<'PY'
import re, sys
impl, gbps = sys.argv[1], float(sys.argv[2])
gb = gbps * 4 / 8  # the 4 s counted, at the run's goodput
counts = []
for f in sys.argv[3:]:
    d = {}
    for line in open(f):
        m = re.match(r'\s*([\d,]+)\s+syscalls:sys_enter_(\w+)', line)
        if m:
            d[m.group(2)] = int(m.group(1).replace(',', ''))
    counts.append(d)
sender = max(counts, key=lambda d: d.get('sendmsg', 0))
receiver = max(counts, key=lambda d: d.get('writev', 0))
print(f"{impl}: goodput {gbps} Gbit/s, receiver writev per GB {receiver['writev'] / gb:.0f}, "
      f"sender sendmsg per GB {sender['sendmsg'] / gb:.0f}")
PY
