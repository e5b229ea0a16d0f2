#!/usr/bin/env python3
"""busbw against message size, C twin and Rust, from a bench-run summary.md (the full sweeps).

Usage: ci/bench_plot.py SUMMARY_MD OUT_PNG   (needs matplotlib: pip install matplotlib)
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def full_sweeps(text):
    """{collective: [(bytes, C busbw, Rust busbw)]} from the '## <coll>, normal (full sweep' tables."""
    sweeps, current = {}, None
    for line in text.splitlines():
        head = re.match(r"## (\w+), normal \(full sweep", line)
        if head:
            current = sweeps.setdefault(head.group(1), [])
            continue
        if line.startswith("## "):
            current = None
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if current is None or len(cells) < 7 or not re.fullmatch(r"\d+[KMG]?", cells[0]):
            continue
        size = int(cells[0].rstrip("KMG")) * UNITS[cells[0][-1] if cells[0][-1] in "KMG" else ""]
        if size > 0:
            current.append((size, float(cells[5]), float(cells[6])))
    return sweeps


def main():
    summary, out = sys.argv[1], sys.argv[2]
    sweeps = full_sweeps(open(summary, encoding="utf-8").read())
    fig, axes = plt.subplots(1, len(sweeps), figsize=(4 * len(sweeps), 3.6), sharey=True)
    for ax, (coll, rows) in zip(axes, sorted(sweeps.items())):
        sizes = [r[0] for r in rows]
        ax.plot(sizes, [r[1] for r in rows], "o-", label="C (nccl.h directly)", markersize=4)
        ax.plot(sizes, [r[2] for r in rows], "x--", label="Rust (metrale-gpu-sys)", markersize=5)
        ax.set_xscale("log", base=2)
        ax.set_title(coll)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("busbw (GB/s)")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle("2x H200, NCCL 2.28.9: bus bandwidth, C twin vs Rust through the crate (one run)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
