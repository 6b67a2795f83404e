"""Markdown tables and a plot of decode_eval.py results (results.json ->
results.md, results.png).

    /usr/bin/python3 client/python/examples/report.py bench/out/python/results.json [out.png]
"""

import json
import sys


def _f(x, digits=4):
    return "" if x is None else f"{x:.{digits}f}"


def _model_table(rows):
    full = rows[0]
    windows = {r["budget"]: r for r in rows if r["policy"] == "window"}
    out = ["| policy | scorer | budget | plain loss | vs full | window, same budget | repeated-half loss "
           "| gap to full | window's gap | gap closed | tok/s | Select share | Select RTT ms | blocks read |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        w = windows.get(r["budget"])
        rel = "" if r is full else f"{100 * (r['plain_loss'] / full['plain_loss'] - 1):+.2f}%"
        gap = wgap = closed = None
        if r["recall_loss"] is not None and full["recall_loss"] is not None:
            gap = r["recall_loss"] - full["recall_loss"]
            if w is not None:
                wgap = w["recall_loss"] - full["recall_loss"]
                if r["policy"] == "select" and abs(wgap) > 1e-9:
                    closed = 1 - gap / wgap
        share = "" if r["policy"] == "window" else f"{100 * r['select_share']:.1f}%"
        out.append(f"| {r['policy']} | {r['scorer'] or ''} | {r['budget']} | {_f(r['plain_loss'])} | {rel} "
                   f"| {_f(w['plain_loss']) if w and r['policy'] == 'select' else ''} "
                   f"| {_f(r['recall_loss'])} | {'' if r is full else _f(gap)} "
                   f"| {_f(wgap) if r['policy'] == 'select' else ''} "
                   f"| {'' if closed is None else f'{100 * closed:.0f}%'} | {r['tokens_per_s']:.0f} "
                   f"| {share} | {_f(r['select_rtt_ms'], 2)} | {r['blocks_per_step']:.1f} |")
    return "\n".join(out)


def markdown(results):
    parts = []
    for key, model in results["models"].items():
        rows, check = model["rows"], model["check"]
        parts.append(f"### {rows[0]['model']}\n")
        parts.append(_model_table(rows))
        for key, what in (("model_decode_loss", "the model's own forward pass, decode steps"),
                          ("dump_loss", "the dumps' next_byte_loss_nats, whole windows")):
            if f"worst_diff_vs_{key}" in check:
                parts.append(f"\nFull attention through the engine vs {what}: worst |diff| "
                             f"{check[f'worst_diff_vs_{key}']:.5f} nats over {len(check['texts'])} texts.")
        parts.append("")
    return "\n".join(parts) + "\n"


def _budget(text):
    num, _, den = text.partition("/")
    return float(num) / float(den or 1)


def plot(results, path):
    """Per model: plain-text loss over full attention, and the share of the
    sliding window's repeated-half gap closed, against the budget, for the
    sliding window, recency with the sink kept (scorer "recency") and the
    default (scorer "unspecified"). Returns False when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = list(results["models"].values())
    fig, axes = plt.subplots(2, len(models), figsize=(5.5 * len(models), 7), squeeze=False)
    for col, model in enumerate(models):
        rows = model["rows"]
        full = rows[0]
        windows = {r["budget"]: r for r in rows if r["policy"] == "window"}
        series = {"sliding window": [r for r in rows if r["policy"] == "window"],
                  "recency + sink": [r for r in rows if r["scorer"] == "recency" and r["policy"] == "select"],
                  "default": [r for r in rows if r["scorer"] == "unspecified"]}
        for name, rs in series.items():
            rs = sorted(rs, key=lambda r: _budget(r["budget"]))
            if not rs:
                continue
            xs = [_budget(r["budget"]) for r in rs]
            axes[0][col].plot(xs, [100 * (r["plain_loss"] / full["plain_loss"] - 1) for r in rs],
                              marker="o", label=name)
            closed = []
            for r in rs:
                w = windows.get(r["budget"])
                gap, wgap = r["recall_loss"], w["recall_loss"] if w else None
                ok = gap is not None and wgap is not None and full["recall_loss"] is not None
                closed.append(100 * (1 - (gap - full["recall_loss"]) / (wgap - full["recall_loss"]))
                              if ok and abs(wgap - full["recall_loss"]) > 1e-9 else float("nan"))
            axes[1][col].plot(xs, closed, marker="o", label=name)
        for row, label in ((0, "plain text: loss over full attention (%)"),
                           (1, "repeated half: window's gap closed (%)")):
            ax = axes[row][col]
            ax.set_xscale("log", base=2)
            ax.set_xlabel("budget (share of the blocks)")
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        axes[0][col].set_title(rows[0]["model"])
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        data = json.load(f)
    print(markdown(data))
    if len(sys.argv) > 2:
        plot(data, sys.argv[2])
