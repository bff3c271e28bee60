#!/usr/bin/env python3
"""Splits the daemon's CPU per GB at one peer and at 1,000 into categories, from two
flat symbol lists (`perf report --no-children --sort dso,sym --stdio -g none`) and
each run's CPU-s per GB:  gap.py all-n1.txt 1.27 all-n1000.txt 1.39"""
import re
import sys
from collections import defaultdict


def load(path):
    d = {}
    for line in open(path):
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if m:
            d[(m.group(2), m.group(4).strip())] = float(m.group(1))
    return d


def category(key):
    dso, sym = key
    if "chacha" in sym or "Opener::open" in sym or "aead" in sym:
        return "AEAD"
    if dso == "[kernel.kallsyms]":
        return "kernel"
    if "memmove" in sym or "extend_trusted" in sym or "from_datagram" in sym:
        return "reader's copy"
    if dso.startswith("libc"):
        return "libc, other"
    return "user space, other"


a, cpu_a, b, cpu_b = load(sys.argv[1]), float(sys.argv[2]), load(sys.argv[3]), float(sys.argv[4])
ms_a, ms_b = defaultdict(float), defaultdict(float)
for k, v in a.items():
    ms_a[category(k)] += v * cpu_a * 10  # percent of CPU-s/GB, in ms/GB
for k, v in b.items():
    ms_b[category(k)] += v * cpu_b * 10
print("| category | one peer, ms/GB | 1,000 peers | difference |")
print("|---|---|---|---|")
for c in sorted(set(ms_a) | set(ms_b), key=lambda c: ms_a[c] - ms_b[c]):
    print(f"| {c} | {ms_a[c]:.0f} | {ms_b[c]:.0f} | {ms_b[c] - ms_a[c]:+.0f} |")
user = [k for k in set(a) | set(b) if category(k) == "user space, other"]
user.sort(key=lambda k: a.get(k, 0) * cpu_a - b.get(k, 0) * cpu_b)
print("\nuser space, the largest differences (ms/GB):")
for k in user[:12]:
    print(f"  {a.get(k, 0) * cpu_a * 10:6.1f} {b.get(k, 0) * cpu_b * 10:6.1f}  {k[1]}")
