#!/usr/bin/env python3
"""busbw against message size from a bench/run.sh log folder: one panel per collective and mode, a curve per
program (nccl-tests, the C twin, Rust through the crate), medians over rounds, out of place.

Usage: bench/plot.py LOG_DIR OUT_PNG   (needs matplotlib: pip install matplotlib)
"""
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from table import LABEL, MODES, PROGRAMS, column, load  # noqa: E402

STYLE = {"nt": "s:", "c": "o-", "rust": "x--"}


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    runs, _ = load(sys.argv[1])
    panels = {}  # (coll, mode) -> prog -> [rows of every phase and round]
    for (_phase, coll, mode), by_prog in runs.items():
        for prog, rounds in by_prog.items():
            panels.setdefault((coll, mode), {}).setdefault(prog, []).extend(rounds)
    keys = sorted(panels, key=lambda k: (k[0] != "all_reduce", k[0], list(MODES).index(k[1])))
    cols = min(5, len(keys))
    rows = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.4 * rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        for prog in PROGRAMS:
            rounds = panels[key].get(prog)
            if not rounds:
                continue
            sizes = sorted(s for s in set().union(*rounds) if s > 0)
            ax.plot(sizes, [column(rounds, s, 1) for s in sizes], STYLE[prog], label=LABEL[prog], markersize=4)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{key[0]} {MODES[key[1]]}", fontsize=9)
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, alpha=0.3)
    for row in axes:
        row[0].set_ylabel("busbw (GB/s)")
    axes[0][0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
