#!/usr/bin/env python3
"""Bar chart of GB/s per method and direction, one panel per block size.

Usage: plot.py RESULTS_CSV OUT_PNG  (the CSV that kvtier_putget_bench writes)
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

NAMES = {
    "memcpy": "memcpy",
    "kvtier_grpc_bytes": "kvtier gRPC",
    "kvtier_shm": "kvtier shm",
    "redis_tcp": "redis TCP",
    "redis_unix": "redis unix",
}


def human(n):
    n = int(n)
    if n % (1 << 20) == 0:
        return "%d MiB" % (n >> 20)
    return "%d KiB" % (n >> 10)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = list(csv.DictReader(open(sys.argv[1])))
    sizes = sorted({int(r["block_bytes"]) for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.2), squeeze=False)
    for ax, size in zip(axes[0], sizes):
        methods = [m for m in NAMES if any(r["method"] == m and int(r["block_bytes"]) == size
                                           for r in rows)]
        value = {}
        for r in rows:
            if int(r["block_bytes"]) == size:
                op = "put" if r["op"] in ("put", "copy") else "get"
                value[(r["method"], op)] = float(r["median_gbps"])
                if r["op"] == "copy":
                    value[(r["method"], "get")] = float(r["median_gbps"])
        x = range(len(methods))
        width = 0.4
        for k, (op, color) in enumerate((("put", "#4c72b0"), ("get", "#dd8452"))):
            ys = [value.get((m, op), 0.0) for m in methods]
            bars = ax.bar([i + (k - 0.5) * width for i in x], ys, width, label=op, color=color)
            ax.bar_label(bars, fmt="%.2f", fontsize=7)
        ax.set_xticks(list(x))
        ax.set_xticklabels([NAMES[m] for m in methods], rotation=20, ha="right")
        ax.set_ylabel("GB/s (median)")
        ax.set_title("block %s" % human(size))
        ax.legend()
    fig.suptitle("kvtierd put/get vs memcpy and redis-server (same run)")
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
