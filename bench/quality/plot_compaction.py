#!/usr/bin/env python3
"""Draws kvtier-eval --compaction's compaction.csv as a PNG.

usage: plot_compaction.py COMPACTION_CSV OUT_DIR

  compaction.png  per dump kind (and all dumps): mean relative L2 error of
                  the attention output after compaction, one bar per method
                  and retention rho (p90 as a tick), every layer pooled
"""
import csv
import re
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Method families share a colour; rho sets the shade.
COLORS = {
    "selkv": "tab:red",
    "uniform": "tab:blue",
    "evict": "tab:gray",
}


def color(method, rho, rhos):
    base = COLORS.get(method.split("_")[0], "tab:green")
    alpha = 1.0 if rho == rhos[0] else 0.55
    return base, alpha


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1], newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["layer"] == "-1"]
    # Scopes: dump kinds and "all" (per-dump rows end in -NN).
    scopes = []
    for r in rows:
        if not re.search(r"-\d+$", r["scope"]) and r["scope"] not in scopes:
            scopes.append(r["scope"])
    methods = []
    for r in rows:
        if r["method"] not in methods:
            methods.append(r["method"])
    rhos = sorted({float(r["rho"]) for r in rows})
    value = defaultdict(dict)
    for r in rows:
        value[r["scope"]][(r["method"], float(r["rho"]))] = (
            float(r["mean"]), float(r["p90"]))

    fig, axes = plt.subplots(1, len(scopes), figsize=(4.2 * len(scopes), 6.5),
                             sharey=True, squeeze=False)
    height = 0.8 / len(rhos)
    for col, scope in enumerate(scopes):
        ax = axes[0][col]
        for i, m in enumerate(methods):
            for j, rho in enumerate(rhos):
                mean, p90 = value[scope].get((m, rho), (0.0, 0.0))
                c, a = color(m, rho, rhos)
                y = i + (j - (len(rhos) - 1) / 2) * height
                ax.barh(y, mean, height=height, color=c, alpha=a,
                        label=f"rho {rho:g}" if i == 0 and col == 0 else None)
                ax.plot([p90], [y], "|", color="black", ms=6)
        ax.set_yticks(range(len(methods)))
        ax.set_yticklabels(methods, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, None)
        ax.set_xlabel("rel. L2 error of attention output (bar: mean, |: p90)")
        ax.set_title(scope, fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
    shades = ", ".join(f"rho {r:g}" + (" dark" if r == rhos[0] else " light")
                       for r in rhos)
    fig.suptitle("compacted prefix + exact suffix vs full attention "
                 f"(red: gated SelKV, blue: uniform merge, gray: eviction; {shades})",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(f"{sys.argv[2]}/compaction.png", dpi=100)


if __name__ == "__main__":
    main()
