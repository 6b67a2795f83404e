#!/usr/bin/python3
"""Teacher-forced decode of held-out text with attention restricted to the
blocks kvtierd selects; the loss table of docs/PYTHON.md.

    /usr/bin/python3 client/python/examples/decode_eval.py \
        --kvtierd build/test/daemon/kvtierd --data ../shared/data --out bench/out/python

Texts: the `tokens` of the realkv dumps (Jane Austen's *Persuasion*, which the
models never saw): per model its 4 window dumps (plain text) and its 4 recall
dumps (a passage, unrelated text, the passage again), decoded together as one
batch of 8 sequences. The first --prompt bytes are prefilled with full
attention and stored as blocks; every later byte is a decode step.

For each model, scorer and budget it reports: next-byte loss on the plain
texts' decode steps against full attention and against a sliding window of the
same budget; on the recall texts' repeated quarter, the loss gap to full
attention and the share of the window's gap the scorer closes; tokens per
second and the share of step time spent in Select. Full attention runs through
the same code path (Select with a budget of every block, zero-copy reads from
the arena) and must reproduce each dump's next_byte_loss_nats to 1e-3.

--ci: one plain and one recall text per model, 64 decode steps, budget 1/8
(about 20 s; --texts, --max-steps and --budgets override these); fails (exit 1) when full attention through the engine differs
from the model's own forward pass by more than 1e-3 nats, or when, for any
model, the default's plain-text loss exceeds the better of the sliding
window and recency with the sink (by more than --plain-tolerance).
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import byte_model  # noqa: E402
import kv_engine  # noqa: E402
import safetensors_io  # noqa: E402
import kvtier  # noqa: E402

# key: (weights in models/, dump prefix, dump folder)
MODELS = {"byte": ("model-austen-byte", "rk", "realkv"), "copy": ("model-austen-copy", "rkc", "realkv"),
          "copy2k": ("model-austen-copy-2k", "rkl", "realkv-2k")}
SCORERS = ("unspecified", "recency", "key_key", "mass")
LOSS_TOLERANCE_NATS = 1e-3


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("KVTIER_SHARED_DATA", "/work/shared/data"),
                   help="folder with models/ and realkv/")
    p.add_argument("--kvtierd", help="start a private kvtierd from this binary")
    p.add_argument("--socket", help="use a running kvtierd at this socket instead")
    p.add_argument("--daemon-set", action="append", default=[], metavar="KEY=VALUE",
                   help="extra --set for the private kvtierd, e.g. index.summary_per_layer=true (repeatable)")
    p.add_argument("--models", default="byte,copy")
    p.add_argument("--scorers", default=",".join(SCORERS))
    p.add_argument("--budgets", default=None, help="default 1/16,1/8,1/4 (with --ci: 1/8)")
    p.add_argument("--texts", type=int, default=None,
                   help="texts of each kind (window, recall) per model, at most as many as --data holds "
                   "(default 4; with --ci 1)")
    p.add_argument("--prompt", type=int, default=512, help="prefilled bytes (multiple of 16)")
    p.add_argument("--max-steps", type=int, default=None, help="decode steps per text (default: to the end)")
    p.add_argument("--anchor", default="pooled", choices=("pooled", "layer", "head"),
                   help="anchor = mean key of the last 8 tokens over layers and KV heads / per layer / per head")
    p.add_argument("--calibration", action="append", default=[], metavar="[MODEL=]FILE",
                   help="JSON of SelectionCalibration fields registered with the profile of MODEL "
                   "(byte, copy; every model without MODEL=); repeatable")
    p.add_argument("--calibration-dir", help="folder of <dump model name>.json calibrations "
                   "(e.g. bench/quality/calibration); --calibration takes precedence")
    p.add_argument("--retrieval-heads", default=None,
                   help="layer:q_head,... whose queries go with every Select as head_queries "
                   "(default: the calibration's retrieval_heads)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--out", help="write results.json, results.md and results.png (with matplotlib) here")
    p.add_argument("--oracle", action="store_true",
                   help="also run the oracle policy (kv_engine.py): the blocks holding the most of each "
                   "step's attention, a bound on selection by attention mass")
    p.add_argument("--plain-tolerance", type=float, default=1e-4,
                   help="nats the default's plain-text loss may exceed the better simple policy's by")
    p.add_argument("--ci", action="store_true", help="short run with checks, for CI")
    a = p.parse_args(argv)
    if a.ci:
        a.texts = 1 if a.texts is None else a.texts
        a.max_steps = 64 if a.max_steps is None else a.max_steps
    if a.texts is None:
        a.texts = 4
    if a.budgets is None:
        a.budgets = "1/8" if a.ci else "1/16,1/8,1/4"
    if (a.kvtierd is None) == (a.socket is None):
        p.error("give exactly one of --kvtierd and --socket")
    return a


def fraction(text):
    num, _, den = text.partition("/")
    return float(num) / float(den or 1)


def load_texts(data, model_key, per_kind):
    weights, prefix, folder = MODELS[model_key]
    out = []
    for kind in ("window", "recall"):
        for i in range(per_kind):
            path = os.path.join(data, folder, f"{prefix}-persuasion-{kind}-{i:02d}.safetensors")
            if i > 0 and not os.path.exists(path):
                break  # the folder has fewer texts of this kind
            tensors, meta = safetensors_io.read(path)
            out.append({"name": os.path.basename(path), "kind": kind, "model": meta.get("model", ""),
                        "tokens": torch.from_numpy(np.array(tensors["tokens"], dtype=np.int64)),
                        "loss": float(meta["next_byte_loss_nats"])})
    model = byte_model.ByteModel.load(os.path.join(data, "models", weights + ".safetensors"))
    return model, out


def calibration_path(args, model_key, dump_model):
    for item in args.calibration:
        key, sep, path = item.partition("=")
        if not sep:
            return item
        if key == model_key:
            return path
    if args.calibration_dir:
        path = os.path.join(args.calibration_dir, dump_model + ".json")
        if os.path.exists(path):
            return path
    return None


def load_calibration(path, log):
    """SelectionCalibration fields of a JSON file; other keys (notes such as
    "model" or "source") are named and left out."""
    with open(path) as f:
        calibration = json.load(f)
    field = kvtier.v1.types_pb2.ModelProfile.DESCRIPTOR.fields_by_name.get("calibration")
    if field is None:
        sys.exit(f"{path}: this build's ModelProfile has no calibration field")
    known = field.message_type.fields_by_name
    dropped = sorted(k for k in calibration if k not in known)
    if dropped:
        log(f"{path}: ignoring {', '.join(dropped)} (not SelectionCalibration fields)")
    return {k: v for k, v in calibration.items() if k in known}


def summarize(r, texts, prompt, decoded_end):
    """Loss on plain decode steps, on the recall texts' repeated quarter, speed."""
    plain = [i for i, t in enumerate(texts) if t["kind"] == "window"]
    recall = [i for i, t in enumerate(texts) if t["kind"] == "recall"]
    length = texts[0]["tokens"].shape[0]
    rep_start = max(3 * length // 4 - 1, prompt)  # loss index t predicts byte t+1
    out = {
        "plain_loss": r.losses[plain, prompt:decoded_end].mean().item() if plain else None,
        "recall_loss": r.losses[recall, rep_start:decoded_end].mean().item()
        if recall and decoded_end > rep_start else None,
        "tokens_per_s": len(texts) * r.steps / sum(r.step_s),
        "step_ms": 1000 * float(np.mean(r.step_s)),
        "select_share": sum(r.select_s) / sum(r.step_s),
        "select_rtt_ms": 1000 * float(np.mean(r.select_rtt_s)) if r.select_rtt_s else None,
        "blocks_per_step": r.blocks_read / (r.steps * len(texts)),
        "pending_blocks": r.pending_blocks,
        "fallback_step": r.fallback_step,
    }
    # Per text, mean loss over every prediction made (prefill and decode).
    out["span_losses"] = [r.losses[i, :decoded_end].mean().item() for i in range(len(texts))]
    out["decode_losses"] = [r.losses[i, prompt:decoded_end].mean().item() for i in range(len(texts))]
    return out


def evaluate_model(client, model_key, args, log):
    model, texts = load_texts(args.data, model_key, args.texts)
    weights = MODELS[model_key][0]
    extra, heads = {}, []
    path = calibration_path(args, model_key, texts[0]["model"])
    if path:
        extra["calibration"] = load_calibration(path, log)
        heads = [(h["layer"], h["q_head"]) for h in extra["calibration"].get("retrieval_heads", [])]
        log(f"{model_key}: calibration {path}, retrieval heads {heads}")
    if args.retrieval_heads:
        heads = [tuple(int(x) for x in h.split(":")) for h in args.retrieval_heads.split(",")]
    profile = client.register_profile(kvtier.Profile(weights, model.num_layers, model.num_kv_heads,
                                                     model.head_dim, 16, "fp16",
                                                     revision="calibrated" if extra else ""), **extra)
    tokens = [t["tokens"] for t in texts]
    started = time.perf_counter()
    cache = kv_engine.PrefillCache(model, tokens, args.prompt)
    log(f"{model_key}: prefilled {len(tokens)} x {args.prompt} bytes in {time.perf_counter() - started:.1f} s")
    length = tokens[0].shape[0]
    end = length - 1 if args.max_steps is None else min(length - 1, args.prompt + args.max_steps)
    runs = [("full", "recency", 1.0)]
    for budget in args.budgets.split(","):
        runs.append(("window", None, budget))
        if args.oracle:
            runs.append(("oracle", None, budget))
        runs += [("select", s, budget) for s in args.scorers.split(",")]
    rows = []
    for policy, scorer, budget in runs:
        f = 1.0 if policy == "full" else fraction(budget)
        engine = kv_engine.DecodeEngine(model, client, profile, policy=policy, fraction=f,
                                        scorer=scorer, anchor=args.anchor, retrieval_heads=heads, log=log)
        r = engine.run(tokens, cache, max_steps=end - args.prompt)
        row = {"model": weights, "policy": policy, "scorer": scorer,
               "budget": "all" if policy == "full" else budget, "retrieval_heads": len(heads)}
        row.update(summarize(r, texts, args.prompt, end))
        rows.append(row)
        log(f"{model_key} {policy:6s} {scorer or '-':11s} {row['budget']:4s} plain {row['plain_loss']:.4f} "
            f"recall {row['recall_loss'] if row['recall_loss'] is None else round(row['recall_loss'], 4)} "
            f"{row['tokens_per_s']:.0f} tok/s select {100 * row['select_share']:.1f}%")
    # Full attention through the engine against the model's own forward pass
    # over the same bytes (decode steps only), and over whole dumps against
    # the loss recorded in the dump.
    check = {"texts": [t["name"] for t in texts], "engine_loss": rows[0]["span_losses"],
             "engine_decode_loss": rows[0]["decode_losses"], "model_decode_loss": []}
    with torch.no_grad():
        for t in tokens:
            losses = byte_model.next_byte_loss(model.prefill(t[: end + 1])[0][:-1], t[1 : end + 1])
            check["model_decode_loss"].append(losses[args.prompt : end].mean().item())
    if end == length - 1:
        check["dump_loss"] = [t["loss"] for t in texts]
    return rows, check


def main(argv=None):
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    def log(msg):
        print(msg, flush=True)

    daemon = None
    if args.kvtierd:
        settings = {"tiers.device.capacity_bytes": "96MiB", "tiers.host.capacity_bytes": "256MiB",
                    "tiers.nvme.file_size_bytes": "256MiB"}
        for item in args.daemon_set:
            key, sep, value = item.partition("=")
            if not sep:
                sys.exit(f"--daemon-set: {item!r} is not KEY=VALUE")
            settings[key] = value
        daemon = kvtier.LocalDaemon(args.kvtierd, settings=settings).start()
        client = daemon.client()
    else:
        client = kvtier.Client(args.socket)
    try:
        results = {"args": vars(args), "models": {}}
        failed = False
        for model_key in args.models.split(","):
            rows, check = evaluate_model(client, model_key, args, log)
            results["models"][model_key] = {"rows": rows, "check": check}
            failed |= report_check(check, log)
            failed |= check_simple_policies(rows, log, args.plain_tolerance)
    finally:
        client.close()
        if daemon is not None:
            daemon.close()
    if args.out:
        write_outputs(results, args)
    return 1 if failed else 0


def check_simple_policies(rows, log, tolerance=1e-4):
    """The default's plain-text loss must not exceed the better of a sliding
    window and recency with the sink kept, at every budget run (a budget
    without both rows is skipped): with no retrieval head there is nothing
    to retrieve, and a calibration with copy tracking lets its heads count
    only while they copy. True when it does not hold."""
    failed = False
    for budget in sorted({r["budget"] for r in rows if r["policy"] == "window"}):
        def plain(policy, scorer):
            return next((r["plain_loss"] for r in rows if r["budget"] == budget and r["policy"] == policy
                         and r["scorer"] == scorer), None)
        default, window, sink = plain("select", "unspecified"), plain("window", None), plain("select", "recency")
        if None in (default, window, sink):
            continue
        best = min(window, sink)
        ok = default <= best + tolerance
        failed |= not ok
        log(f"{rows[0]['model']} {budget}: the default's plain loss {default:.4f}, the better simple "
            f"policy {best:.4f} ({'ok' if ok else 'FAILED'}, tolerance {tolerance})")
    return failed


def report_check(check, log):
    """Logs and records the worst differences; True when one exceeds the tolerance."""
    pairs = [("model_decode_loss", "engine_decode_loss", "the model's forward pass (decode steps)")]
    if "dump_loss" in check:
        pairs.append(("dump_loss", "engine_loss", "the dumps' next_byte_loss_nats (whole windows)"))
    failed = False
    for ref, got, what in pairs:
        worst = max(abs(a - b) for a, b in zip(check[ref], check[got]))
        check[f"worst_diff_vs_{ref}"] = worst
        ok = worst <= LOSS_TOLERANCE_NATS
        failed |= not ok
        log(f"full attention through the engine vs {what}: worst |diff| {worst:.5f} nats over "
            f"{len(check['texts'])} texts ({'ok' if ok else 'FAILED'}, tolerance {LOSS_TOLERANCE_NATS})")
    return failed


def write_outputs(results, args):
    import report  # noqa: E402  (the table writer lives beside this script)

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(report.markdown(results))
    report.plot(results, os.path.join(args.out, "results.png"))


if __name__ == "__main__":
    sys.exit(main())
