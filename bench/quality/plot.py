#!/usr/bin/env python3
"""Draws kvtier-eval's results.csv as PNGs.

usage: plot.py RESULTS_CSV OUT_DIR

  recall_vs_budget.png  per dump group: share of the oracle's mass beyond
                        the always-kept blocks, and total attention recall,
                        against the budget (raw ranking), one line a method,
                        one step ahead (chosen at t - 1, used at t)
  recall_vs_budget_at.png  the same, chosen and used at step t
  churn_vs_window.png   stability sweep: blocks loaded per step and share
                        against the stability window W, one line per
                        (method, rule, weight)
"""
import csv
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# Methods drawn in the budget plot (others stay in the tables), with styles.
SHOWN = {
    "oracle": dict(color="black", lw=2.2),
    "default": dict(color="tab:red", lw=3.0, zorder=6),
    "mass_ungated": dict(color="tab:red", lw=1.4, ls="--", zorder=6),
    "keykey_perlayer": dict(color="tab:pink", lw=1.6, ls="-."),
    "streamingllm": dict(color="tab:gray", lw=3.0, ls=":"),
    "random": dict(color="lightgray", lw=1.2),
    "keykey": dict(color="tab:blue", lw=2.0),
    "keykey_weighted": dict(color="tab:cyan", lw=1.2),
    "keykey (tuned)": dict(color="tab:blue", lw=2.0, ls="--"),
    "keykey_layer_centered+recency:0.5": dict(color="tab:orange", lw=1.0,
                                              ls=":"),
    "keykey_head_centered": dict(color="tab:pink", lw=1.2),
    "keykey_flat+recency:0.5": dict(color="tab:purple", lw=1.2),
    "quest": dict(color="tab:olive", lw=1.2, ls="--"),
    "quest_head": dict(color="tab:green", lw=1.8, ls="--"),
    "arkvale_head": dict(color="tab:green", lw=1.0, ls=":"),
    "keydiff": dict(color="tab:brown", lw=1.2),
    "h2o": dict(color="tab:orange", lw=1.2, ls="-."),
    "snapkv": dict(color="gold", lw=1.2, ls="-."),
}


def load(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def budget_plot(rows, out, timing):
    rows = [r for r in rows if r.get("timing", "at") == timing]
    if not rows:
        return
    groups = sorted({r["group"] for r in rows}, key=lambda g: (g == "all", g))
    fig, axes = plt.subplots(2, len(groups), figsize=(5.2 * len(groups), 8.5),
                             squeeze=False)
    for col, group in enumerate(groups):
        series = defaultdict(list)
        for r in rows:
            name = r["method"] + (" (tuned)" if r["variant"] == "tuned" else "")
            if r["group"] == group and r["variant"] in ("raw", "tuned") and \
                    name in SHOWN:
                series[name].append(
                    (float(r["budget"]), float(r["share"]),
                     float(r["recall"])))
        for method, pts in series.items():
            pts.sort()
            xs = [p[0] for p in pts]
            for row, idx in ((0, 1), (1, 2)):
                axes[row][col].plot(xs, [p[idx] for p in pts], marker="o",
                                    ms=3, label=method, **SHOWN[method])
        for row, ylabel in ((0, "share of oracle mass beyond sink/local"),
                            (1, "attention recall (all kept blocks)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("budget (fraction of visible blocks)")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.set_title(group)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8)
    fig.suptitle("one step ahead (chosen at t - 1, used at t)" if timing == "ahead"
                 else "at step t (chosen and used at t)")
    fig.tight_layout(rect=(0, 0.09, 1, 0.97))
    fig.savefig(out, dpi=110)


def parse_setting(variant):
    # "sweep:index,W=20,w=0.3,theta=0.5" or "sweep:rank,W=20,w=0.3"
    parts = variant[len("sweep:"):].split(",")
    fields = dict(p.split("=") for p in parts[1:])
    return parts[0], int(fields["W"]), fields["w"], fields.get("theta")


def churn_plot(rows, out):
    sweep = [r for r in rows
             if r["group"] == "all" and r["variant"].startswith("sweep:")]
    # The sweeps run at one timing (ahead when both are replayed).
    if not sweep:
        groups = {r["group"] for r in rows}
        group = sorted(groups)[0]
        sweep = [r for r in rows
                 if r["group"] == group and r["variant"].startswith("sweep:")]
    if not sweep:
        return False
    lines = defaultdict(list)
    for r in sweep:
        rule, window, weight, theta = parse_setting(r["variant"])
        if theta not in (None, "0.5", "0.8") or weight != "0.3":
            continue
        if theta is not None:
            rule = f"{rule}, theta {theta}"
        lines[(r["method"], rule)].append(
            (window, float(r["churn_blocks"]), float(r["share"])))
    colors = {}
    palette = ["tab:blue", "tab:red", "tab:green", "tab:purple",
               "tab:orange", "tab:brown"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    for (method, rule), pts in sorted(lines.items()):
        pts.sort()
        color = colors.setdefault(method, palette[len(colors) % len(palette)])
        style = "-" if rule == "rank" else (
            "--" if rule.endswith("0.5") else ":")
        label = f"{method} [{rule} rule]"
        for ax, idx in ((axes[0], 1), (axes[1], 2)):
            ax.plot([p[0] for p in pts], [p[idx] for p in pts], style,
                    color=color, marker="o", ms=3, label=label)
    axes[0].set_ylabel("blocks loaded per step (churn)")
    axes[1].set_ylabel("share of oracle mass beyond sink/local")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_xlabel("stability window W (steps)")
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=7, loc="lower left")
    budget = float(sweep[0]["budget"])
    label = f"1/{round(1 / budget)}" if budget > 0 else str(budget)
    fig.suptitle(f"stability filter at budget {label}, weight 0.3 "
                 "(dashed / dotted: index rule at theta 0.5 / 0.8; "
                 "solid: rank rule)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return True


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    rows = load(sys.argv[1])
    budget_plot(rows, f"{sys.argv[2]}/recall_vs_budget.png", "ahead")
    budget_plot(rows, f"{sys.argv[2]}/recall_vs_budget_at.png", "at")
    churn_plot(rows, f"{sys.argv[2]}/churn_vs_window.png")


if __name__ == "__main__":
    main()
