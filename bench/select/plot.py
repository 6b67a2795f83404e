#!/usr/bin/env python3
"""Plots select_bench.csv: selection cost vs number of blocks per method.

usage: plot.py select_bench.csv out.png
Left: one context (latency vs blocks, log-log), one line per method and
configuration. Right: the 64-context batch (latency per method), annotated
with recall@K.
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = list(csv.DictReader(open(sys.argv[1])))
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6))

    lines = {}
    for r in rows:
        if r["scenario"] != "single":
            continue
        label = "%s [%s]" % (r["method"], r["config"])
        if r["method"] == "faiss_hnsw32":
            first = "efSearch=%d" % max(int(r["k"]), 64)
            label = "faiss_hnsw32 [efSearch=%s]" % (
                "K" if r["config"] == first else "2K")
        lines.setdefault(label, {})[int(r["num_blocks"])] = (
            float(r["latency_us_median"]), float(r["recall_at_k"]))
    for label, pts in sorted(lines.items()):
        xs = sorted(pts)
        style = "--" if label.startswith(("faiss", "exact")) else "-"
        left.plot(xs, [pts[x][0] for x in xs], style, marker="o", label=label)
        for x in xs:
            left.annotate("%.2f" % pts[x][1], (x, pts[x][0]), fontsize=6,
                          xytext=(3, 3), textcoords="offset points")
    left.set_xscale("log", base=2)
    left.set_yscale("log")
    left.set_xlabel("blocks in the context")
    left.set_ylabel("median latency per select (us), labels = recall@K")
    left.set_title("One context, K = 1% of blocks, 1 thread")
    left.legend(fontsize=6)
    left.grid(True, which="both", alpha=0.3)

    batch = [r for r in rows if r["scenario"] == "batch"]
    names = ["%s\n%s t%s" % (r["method"], r["config"], r["threads"]) for r in batch]
    vals = [float(r["latency_us_median"]) / 1000 for r in batch]
    bars = right.bar(range(len(batch)), vals)
    for b, r in zip(bars, batch):
        right.annotate("r=%.3f\nx%.1f" % (float(r["recall_at_k"]),
                                          float(r["speedup_vs_flat_ip"])),
                       (b.get_x() + b.get_width() / 2, b.get_height()),
                       ha="center", fontsize=6, xytext=(0, 2),
                       textcoords="offset points")
    right.set_xticks(range(len(batch)))
    right.set_xticklabels(names, rotation=70, fontsize=6)
    right.set_ylabel("median latency per step (ms)")
    if batch:
        right.set_title("Batch: %s contexts x %s blocks" %
                        (batch[0]["contexts"], batch[0]["num_blocks"]))
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
