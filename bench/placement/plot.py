#!/usr/bin/env python3
"""Draws kvtier_placement_bench's placement.csv as a PNG.

usage: plot.py PLACEMENT_CSV OUT_PNG

One row of panels per model (and "all": both models pooled), one column per
figure: the fast-tier hit rate of selected blocks (device + host: no disk
read needed), the share answered RESIDENT (an arena handle at once), NVMe ->
host KiB promoted per step and host -> device KiB promoted per step; bars per policy, grouped by tier size (device = host
capacity as a fraction of the working set).
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {
    "keydiff": "tab:brown",
    "lru": "tab:gray",
    "stability": "tab:red",
    "stability_unwanted_first": "tab:pink",
}
FIGURES = [
    ("fast_hit_rate", "selected blocks found in device+host", 1.0),
    ("resident_share", "selected blocks answered RESIDENT", 1.0),
    ("promoted_nvme_to_host_bytes_per_step", "NVMe -> host KiB / step", 1 / 1024),
    ("promoted_host_to_device_bytes_per_step", "host -> device KiB / step", 1 / 1024),
]
RATES = ("fast_hit_rate", "resident_share")


def size_label(s):
    f = float(s)
    inv = 1 / f
    return f"1/{round(inv)}" if abs(inv - round(inv)) < 1e-6 else s


def main(path, out):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    models = sorted({r["model"] for r in rows}, key=lambda m: (m == "all", m))
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    sizes = sorted({r["size"] for r in rows}, key=float, reverse=True)
    by = defaultdict(dict)
    for r in rows:
        by[r["model"]][(r["policy"], r["size"])] = r
    fig, axes = plt.subplots(len(models), len(FIGURES),
                             figsize=(4.6 * len(FIGURES), 3.4 * len(models)),
                             squeeze=False)
    width = 0.8 / max(len(policies), 1)
    for i, model in enumerate(models):
        for j, (key, title, scale) in enumerate(FIGURES):
            ax = axes[i][j]
            for k, policy in enumerate(policies):
                xs, ys = [], []
                for x, size in enumerate(sizes):
                    r = by[model].get((policy, size))
                    if r is None:
                        continue
                    xs.append(x - 0.4 + width * (k + 0.5))
                    ys.append(float(r[key]) * scale)
                bars = ax.bar(xs, ys, width, label=policy,
                              color=COLORS.get(policy, None))
                if key in RATES:
                    ax.bar_label(bars, fmt="%.4f", fontsize=7, rotation=90,
                                 padding=2)
            ax.set_xticks(range(len(sizes)))
            ax.set_xticklabels([f"tiers {size_label(s)} of working set"
                                for s in sizes], fontsize=9)
            ax.set_title(f"{model}: {title}", fontsize=10)
            if key in RATES:
                lo = min(float(r[key]) for r in by[model].values())
                ax.set_ylim(max(0.0, lo - 0.1), 1.12)
            ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
