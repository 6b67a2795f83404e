#!/usr/bin/python3
"""Plots kvtier_select_bench --scenario long's select_long.csv: Select p50
against context length (one sequence) per method and shape, log-log.

usage: plot_long.py select_long.csv out.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, out):
    rows = list(csv.DictReader(open(path)))
    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.2), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for method in ["mass flat pass", "exact int8 scan", "mass sparse (shipped)",
                       "mass sparse (any drift)", "pooled key-key tree"]:
            pts = sorted((int(r["tokens"]), float(r["p50_us"])) for r in rows
                         if r["shape"] == shape and r["method"] == method and r["batch"] == "1")
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context tokens (one sequence)")
        ax.set_ylabel("Select p50 (us, in process, 2 threads)")
        ax.set_title(f"{shape} shape")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
