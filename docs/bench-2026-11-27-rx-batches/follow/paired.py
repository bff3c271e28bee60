#!/usr/bin/env python3
"""Pairs each repeat of one build with the same repeat of another in a `star.jsonl`.

The lab interleaves implementations within a repeat, so two builds' runs of one
repeat are seconds apart. This host passes through slow phases of tens of seconds in
which both the generator and the daemon cost a third more per packet; a median over
repeats moves with how many runs fell into one, a ratio within a repeat much less (a
phase can still begin between the two runs of one repeat).
Prints, per cell and repeat, goodput, CPU per GB, and the daemon's own receive
sojourn (kernel arrival stamp to TUN write: mean, and the p99 bucket's bound), then
the median of the paired ratios.

usage: paired.py STAR_JSONL BASE_IMPLEMENTATION OTHER_IMPLEMENTATION
"""
import json
import statistics
import sys


def p99_bound_us(hist):
    total, seen = sum(hist), 0
    for i, n in enumerate(hist):
        seen += n
        if total and seen >= 0.99 * total:
            return 0 if i == 0 else 2**i
    return None


def figures(r):
    q = r["signatures"]["queues"]
    return {
        "gbit": r["goodput_bps"] / 1e9,
        "cpu_gb": r["cpu_s_per_gb"],
        "sojourn_ms": q["rx_sojourn_ns"] / max(q["rx_timed"], 1) / 1e6,
        "p99_ms": r["delay_p99_us"] / 1e3,
        "sojourn_p99_ms": (p99_bound_us(q["rx_hist"]) or 0) / 1e3,
        "light_p99_ms": ((r.get("light") or {}).get("delay_p99_us") or 0) / 1e3,
    }


def main(path, base, other):
    runs = {}
    for line in open(path):
        r = json.loads(line)
        if r.get("error"):
            continue
        key = (r["spec"]["peers"], r["spec"]["light_peers"], r["spec"]["way"])
        runs.setdefault(key, {}).setdefault(r["repeat"], {})[r["implementation"]] = figures(r)
    for key, repeats in sorted(runs.items()):
        print(f"peers {key[0]}, light {key[1]}, {key[2]}:")
        ratios = {}
        for rep, by_impl in sorted(repeats.items()):
            if base not in by_impl or other not in by_impl:
                continue
            b, o = by_impl[base], by_impl[other]
            cells = ", ".join(f"{k} {b[k]:.2f} -> {o[k]:.2f}" for k in b)
            print(f"  repeat {rep}: {cells}")
            for k in b:
                if b[k]:
                    ratios.setdefault(k, []).append(o[k] / b[k])
        med = ", ".join(f"{k} {statistics.median(v):.2f}x" for k, v in ratios.items())
        print(f"  median of paired ratios ({other} / {base}): {med}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
