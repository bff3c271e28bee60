#!/bin/bash
# syscalls.sh IMPL: the gateway's system calls over 3 s in the middle of a 12 s
# `star --peers 1000 --direction tx` run against IMPL (e.g. wirelane, or wirelane@before
# with WIRELANE_LAB_BUILDS=before=/path/to/daemon set), then the run's table row.
# Run from the repository's root, as root, with nothing else running.
set -eu
IMPL=$1
OUT=$(mktemp -d)
target/release/wirelane-lab star --peers 1000 --direction tx --seconds 12 --repeats 1 \
    --implementations "$IMPL" --out "$OUT" > "$OUT/log" 2>&1 &
LAB=$!
sleep 9
P=$(pgrep -x wirelane | head -1)
perf stat -e 'syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendmmsg,syscalls:sys_enter_read,syscalls:sys_enter_futex,syscalls:sys_enter_poll' \
    -p "$P" -- sleep 3 2>&1 | grep syscalls
wait $LAB
grep "tx N=1000" "$OUT/log" | tail -1
