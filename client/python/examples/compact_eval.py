#!/usr/bin/python3
"""Next-byte loss after SelKV compaction through kvtierd; the compaction loss
table of docs/QUALITY.md.

    PYTHONPATH=build/test/client/python /usr/bin/python3 \
        client/python/examples/compact_eval.py \
        --kvtierd build/test/daemon/kvtierd --data ../shared/data --out bench/out/compaction

For each realkv text (4 window and 4 recall dumps per model) the first
--prompt bytes are prefilled with full attention and stored in a private
kvtierd as fp16 blocks of 16 tokens, the way an engine writes them. The
context is then compacted by the daemon (CompactContext) at each retention
and method; the compacted blocks and their slots (positions, logit biases)
come back through GetBlocks, and every later byte is decoded teacher-forced
with attention over the compacted prefix (bias added to the logits, padding
masked) plus the exact keys of the bytes decoded since. The loss on those
bytes is compared with full attention over the uncompacted cache (which must
reproduce the model's own forward pass to 1e-3 nats).

Methods (the API's names): gate+bias (GATED merge, ATTENTION_RATIO bias;
KEYDIFF importance, and SNAPKV with the last --window prompt queries of
every query head as observation queries), gate (no bias), uniform (+ bias),
evict (NONE merge, NONE bias: plain eviction by KEYDIFF or SNAPKV).

--ci: one window and one recall text of the copy model, retention 0.25, two
methods, 64 decode steps (a few seconds); fails when a compacted block's
slots are malformed or full attention disagrees with the model.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import byte_model  # noqa: E402
import kvtier  # noqa: E402
from decode_eval import MODELS, load_texts  # noqa: E402

BLOCK = 16
# name -> (importance, merge, bias, uses observation queries)
METHODS = {
    "gate+bias keydiff": ("keydiff", "gated", "ratio", False),
    "gate+bias snapkv": ("snapkv", "gated", "ratio", True),
    "gate keydiff": ("keydiff", "gated", "none", False),
    "uniform+bias keydiff": ("keydiff", "uniform", "ratio", False),
    "uniform+bias snapkv": ("snapkv", "uniform", "ratio", True),
    "evict keydiff": ("keydiff", "none", "none", False),
    "evict snapkv": ("snapkv", "none", "none", True),
}
LOSS_TOLERANCE_NATS = 1e-3


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("KVTIER_SHARED_DATA", "/work/shared/data"))
    p.add_argument("--kvtierd", help="start a private kvtierd from this binary")
    p.add_argument("--socket", help="use a running kvtierd at this socket instead")
    p.add_argument("--models", default="byte,copy")
    p.add_argument("--texts", type=int, default=4, help="texts of each kind (window, recall) per model")
    p.add_argument("--prompt", type=int, default=768, help="prefilled, then compacted bytes (multiple of 16)")
    p.add_argument("--window", type=int, default=32, help="observation queries per query head")
    p.add_argument("--retentions", default="0.25,0.5")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--out", help="write results.json, results.md and compaction_loss.png here")
    p.add_argument("--ci", action="store_true")
    a = p.parse_args(argv)
    if a.ci:
        a.models, a.texts, a.retentions, a.max_steps = "copy", 1, "0.25", 64
        a.methods = "gate+bias keydiff,evict keydiff"
    if (a.kvtierd is None) == (a.socket is None):
        p.error("give exactly one of --kvtierd and --socket")
    if a.prompt % BLOCK:
        p.error(f"--prompt must be a multiple of {BLOCK}")
    return a


def to_blocks(k, v):
    """k, v [L, H, T, d] float -> T/16 fp16 payloads [L][k|v][H][16][d]."""
    L, H, T, d = k.shape
    kv = torch.stack([k, v], dim=1).half()  # [L, 2, H, T, d]
    kv = kv.view(L, 2, H, T // BLOCK, BLOCK, d).permute(3, 0, 1, 2, 4, 5).contiguous()
    return [kv[b].numpy().tobytes() for b in range(T // BLOCK)]


def from_blocks(payloads, slots, L, H, d):
    """Compacted payloads + CompactedSlots -> keys, values [L, H, S, d] float,
    bias [L, H, S] (padding slots: -inf), S = 16 x blocks."""
    n = len(payloads)
    raw = np.frombuffer(b"".join(payloads), dtype=np.float16).reshape(n, L, 2, H, BLOCK, d)
    kv = torch.from_numpy(raw.astype(np.float32)).permute(1, 2, 3, 0, 4, 5).reshape(L, 2, H, n * BLOCK, d)
    bias = np.stack([np.array(s.logit_bias, dtype=np.float32).reshape(L, H, BLOCK) for s in slots], axis=2)
    positions = np.stack([np.array(s.positions, dtype=np.int64).reshape(L, H, BLOCK) for s in slots], axis=2)
    bias = torch.from_numpy(bias.reshape(L, H, n * BLOCK))
    positions = positions.reshape(L, H, n * BLOCK)
    if not np.all((positions >= 0) == np.isfinite(bias.numpy())):
        raise AssertionError("a slot has a position but an infinite bias, or the other way round")
    return kv[:, 0], kv[:, 1], bias


class CompactedCache:
    """KV callbacks of ByteModel.decode_step for one sequence: a fixed
    compacted prefix (with per-slot logit bias) plus exact decoded tokens."""

    def __init__(self, model, keys, values, bias):
        self.group = model.num_q_heads // model.num_kv_heads
        self.k = [keys[l] for l in range(keys.shape[0])]    # [H, S, d]
        self.v = [values[l] for l in range(values.shape[0])]
        self.bias = [bias[l] for l in range(bias.shape[0])]  # [H, S]

    def append(self, layer, k, v):  # k, v [1, H, d]
        self.k[layer] = torch.cat([self.k[layer], k[0][:, None, :]], dim=1)
        self.v[layer] = torch.cat([self.v[layer], v[0][:, None, :]], dim=1)
        self.bias[layer] = torch.cat([self.bias[layer], torch.zeros(k.shape[1], 1)], dim=1)

    def attend(self, layer, q):  # q [1, Hq, d]
        h, _, d = self.k[layer].shape
        qg = q[0].view(h, self.group, d)
        scores = qg @ self.k[layer].transpose(1, 2) / math.sqrt(d) + self.bias[layer][:, None, :]
        p = torch.softmax(scores, dim=-1)
        return (p @ self.v[layer]).reshape(1, h * self.group, d)


def observation_queries(q, window, group):
    """q [L, Hq, T, d] of the prompt -> [L][Hkv][group * window][d] float32."""
    L, hq, _, d = q.shape
    last = q[:, :, -window:, :]  # [L, Hq, W, d]
    return last.reshape(L, hq // group, group * window, d).contiguous().numpy().astype(np.float32)


def evaluate_text(client, profile_id, model, text, args, methods, retentions, log):
    tokens = text["tokens"]
    end = tokens.shape[0] - 1 if args.max_steps is None else min(tokens.shape[0] - 1,
                                                                   args.prompt + args.max_steps)
    with torch.no_grad():
        full_logits, q, k, v = model.prefill(tokens[:end])
        full = byte_model.next_byte_loss(full_logits[args.prompt:end], tokens[args.prompt + 1:end + 1])
        # Causal: the prompt's keys, values and queries are the first ones.
        q, k, v = q[:, :, :args.prompt], k[:, :, :args.prompt], v[:, :, :args.prompt]
        # Full attention through the engine path must match the model.
        cache = CompactedCache(model, k, v, torch.zeros(k.shape[0], k.shape[1], args.prompt))
        gap = 0.0
        for t in range(args.prompt, min(end, args.prompt + 8)):
            logits = model.decode_step(tokens[t:t + 1], torch.tensor([t]), cache)
            gap = max(gap, float((torch.log_softmax(logits[0], -1) -
                                  torch.log_softmax(full_logits[t], -1)).abs().max()))
    ids = [hashlib.sha256(f"{text['name']}-{b}".encode()).digest()[:16]
           for b in range(args.prompt // BLOCK)]
    client.put_blocks(profile_id, list(zip(ids, to_blocks(k, v))))
    obs = observation_queries(q, args.window, model.num_q_heads // model.num_kv_heads)
    rows = {"full": float(full.mean()), "engine_gap": gap}
    for rho in retentions:
        for name in methods:
            importance, merge, bias, queries = METHODS[name]
            ctx = client.open_context(profile_id, [ids]).context_id
            started = time.perf_counter()
            try:
                resp = client.compact_context(ctx, rho, importance=importance, merge=merge, bias=bias,
                                              observation_queries=obs if queries else None)
            finally:
                client.close_context(ctx)
            rows.setdefault("compact_s", []).append(time.perf_counter() - started)
            got = client.get_blocks(profile_id, list(resp.version.block_ids))
            results = list(got.results)
            for r in results:
                if r.status.code != 0 or not r.HasField("compacted"):
                    raise AssertionError(f"{name} rho {rho}: compacted block {r.block_id.hex()} "
                                         f"came back without its slots ({r.status.message})")
            keys, values, slot_bias = from_blocks([r.data for r in results], [r.compacted for r in results],
                                                  model.num_layers, model.num_kv_heads, model.head_dim)
            cache = CompactedCache(model, keys, values, slot_bias)
            losses = []
            with torch.no_grad():
                for t in range(args.prompt, end):
                    logits = model.decode_step(tokens[t:t + 1], torch.tensor([t]), cache)
                    losses.append(float(byte_model.next_byte_loss(logits, tokens[t + 1:t + 2])[0]))
            rows[f"{name} @ {rho:g}"] = float(np.mean(losses))
    return rows


def main(argv):
    args = parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    for m in methods:
        if m not in METHODS:
            sys.exit(f"--methods: {m!r} is not one of {', '.join(METHODS)}")
    retentions = [float(x) for x in args.retentions.split(",")]

    def log(msg):
        print(msg, flush=True)

    daemon = None
    if args.kvtierd:
        daemon = kvtier.LocalDaemon(args.kvtierd, settings={
            "tiers.device.capacity_bytes": "96MiB", "tiers.host.capacity_bytes": "256MiB",
            "tiers.nvme.file_size_bytes": "512MiB"}).start()
        client = daemon.client()
    else:
        client = kvtier.Client(args.socket)
    results = {"args": vars(args), "texts": []}
    failed = False
    try:
        for model_key in args.models.split(","):
            model, texts = load_texts(args.data, model_key, args.texts)
            profile = client.register_profile(kvtier.Profile(MODELS[model_key][0] + "-compact",
                                                             model.num_layers, model.num_kv_heads,
                                                             model.head_dim, BLOCK, "fp16"))
            for text in texts:
                started = time.perf_counter()
                rows = evaluate_text(client, profile.profile_id, model, text, args, methods,
                                     retentions, log)
                if rows["engine_gap"] > LOSS_TOLERANCE_NATS:
                    log(f"FAILED: {text['name']}: the engine path differs from the model by "
                        f"{rows['engine_gap']:.2e} nats")
                    failed = True
                results["texts"].append({"model": model_key, "name": text["name"], "kind": text["kind"],
                                         "loss": rows})
                log(f"{model_key} {text['name']}: full {rows['full']:.4f}  " +
                    "  ".join(f"{k} {v - rows['full']:+.4f}" for k, v in rows.items()
                              if k not in ("full", "engine_gap", "compact_s")) +
                    f"  ({time.perf_counter() - started:.1f} s)")
    finally:
        client.close()
        if daemon is not None:
            daemon.close()
    table = summarize(results, methods, retentions)
    times = sorted(x for t in results["texts"] for x in t["loss"]["compact_s"])
    if times:
        table += (f"\nCompactContext of {args.prompt // BLOCK} blocks ({args.prompt} tokens), "
                  f"{len(times)} calls: median {1000 * times[len(times) // 2]:.1f} ms, "
                  f"max {1000 * times[-1]:.1f} ms (the call as the client sees it).\n")
    print(table)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(args.out, "results.md"), "w") as f:
            f.write(table)
        plot(results, methods, retentions, os.path.join(args.out, "compaction_loss.png"))
    return 1 if failed else 0


def summarize(results, methods, retentions):
    """Markdown: mean loss increase over full attention (nats/byte) per
    model x kind (rows) and method @ retention (columns)."""
    cols = [f"{m} @ {r:g}" for r in retentions for m in methods]
    groups = {}
    for t in results["texts"]:
        groups.setdefault((t["model"], t["kind"]), []).append(t["loss"])
    lines = ["| texts | full (nats/byte) | " + " | ".join(cols) + " |",
             "| --- | --- | " + " | ".join("---" for _ in cols) + " |"]
    for (model, kind), rows in sorted(groups.items()):
        full = np.mean([r["full"] for r in rows])
        cells = [f"{np.mean([r[c] - r['full'] for r in rows]):+.4f}" for c in cols]
        lines.append(f"| {model} {kind} ({len(rows)}) | {full:.4f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(results, methods, retentions, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"matplotlib missing: no {path}")
        return
    groups = sorted({(t["model"], t["kind"]) for t in results["texts"]})
    fig, axes = plt.subplots(1, len(retentions), figsize=(6 * len(retentions), 4), squeeze=False)
    for ax, rho in zip(axes[0], retentions):
        width = 0.8 / max(1, len(methods))
        for i, m in enumerate(methods):
            vals = []
            for g in groups:
                rows = [t["loss"] for t in results["texts"] if (t["model"], t["kind"]) == g]
                vals.append(np.mean([r[f"{m} @ {rho:g}"] - r["full"] for r in rows]))
            ax.bar(np.arange(len(groups)) + i * width, vals, width, label=m)
        ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2)
        ax.set_xticklabels([f"{m} {k}" for m, k in groups])
        ax.set_title(f"retention {rho:g}")
        ax.set_ylabel("next-byte loss - full attention (nats)")
        ax.axhline(0, color="black", linewidth=0.5)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
