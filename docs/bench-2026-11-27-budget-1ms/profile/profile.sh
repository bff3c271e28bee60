#!/bin/bash
# Profiles the gateway daemon during one star receive run of N peers, once it is busy
# with data (its first worker busy more than 40% of a second; the handshakes before
# that run on other threads), for 5 s.
#   profile.sh N TAG     (IMPL=wirelane@before COMM=<daemon binary's name> for another build)
# Writes $OUT/perf-TAG.data (OUT defaults to /tmp/prof); read it with
#   perf report -i $OUT/perf-TAG.data --no-children --sort sym --stdio
set -u
N=$1; tag=$2; out=${OUT:-/tmp/prof}
mkdir -p "$out"
cd "$(git rev-parse --show-toplevel)"
target/release/wirelane-lab star --peers "$N" --direction rx --offered-gbit 8 --seconds 10 \
    --sealed-max-mib 12000 --repeats 1 --implementations "${IMPL:-wirelane}" \
    --out "$out/out-$tag" > "$out/lab-$tag.log" 2>&1 &
lab=$!
pid=""
for _ in $(seq 1 600); do
    sleep 0.5
    kill -0 "$lab" 2> /dev/null || break
    pid=$(pgrep -x "${COMM:-wirelane}" | head -1)
    [ -n "$pid" ] || continue
    # The first worker's CPU time: handshakes run on other threads.
    worker=$(grep -l '^wl-worker-0$' /proc/"$pid"/task/*/comm 2> /dev/null | head -1)
    [ -n "$worker" ] || continue
    stat=${worker%comm}stat
    t1=$(awk '{print $14+$15}' "$stat" 2> /dev/null)
    sleep 1
    t2=$(awk '{print $14+$15}' "$stat" 2> /dev/null)
    if [ -n "$t1" ] && [ -n "$t2" ] && [ $((t2 - t1)) -gt 40 ]; then
        perf record -F 2999 -g -p "$pid" -o "$out/perf-$tag.data" -- sleep 5 > /dev/null 2>&1
        break
    fi
done
wait "$lab"
tail -3 "$out/lab-$tag.log"
