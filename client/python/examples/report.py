"""Markdown tables of decode_eval.py results (results.json -> results.md).

    /usr/bin/python3 client/python/examples/report.py bench/out/python/results.json
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


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(markdown(json.load(f)))
