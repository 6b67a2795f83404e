#!/usr/bin/python3
"""Where a tight budget loses the repeated passage: step by step, does the
default's selection hold the block the copy is read from?

    PYTHONPATH=build/test/client/python /usr/bin/python3 bench/quality/copy_slots.py \\
        --kvtierd build/test/daemon/kvtierd --data bench/out/persuasion/report \\
        --model copy --budget 1/16 --calibration-dir bench/quality/calibration

Runs the recall texts of one model (passage, filler, the passage again;
shared/data/realkv/README.md) through decode_eval's engine three times: full
attention, a sliding window and the default selection, one step ahead as an
engine drives kvtierd. On the repeated passage, decode step t predicts byte
t + 1, which is byte j = t + 1 - 3T/4 of the first reading; the copy reads
that byte, so the block it needs is j // block_size. Per stretch of 32 steps
of the repeat it prints:

- held: the share of steps whose selection holds that block (the sink,
  block 0, is always held, so the first stretch starts high);
- closed: the share of the window's loss gap to full attention that the
  default closes there;
- instead: when the block is missing, what the free slots held, as distance
  from the last complete block (1 = the block before the last one);

and for the whole repeat the same, with what the free slots held when the
block was missing split into recent blocks (at most 5 from the last one,
where the prior ranks first) and blocks further back (another head's
target, or a stale one).
"""

import argparse
import collections
import os
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python", "examples"))
import decode_eval  # noqa: E402
import kv_engine  # noqa: E402

import kvtier  # noqa: E402

STRETCH = 32


class RecordingEngine(kv_engine.DecodeEngine):
    """The engine of decode_eval, keeping the block positions of every
    selection it reads (per step, per sequence)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.chosen = {}

    def _await_select(self):
        selections = super()._await_select()
        if selections is not None:
            self.chosen[self.t] = [sorted(b.position for b in s.blocks) for s in selections]
        return selections


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kvtierd", required=True, help="start a private kvtierd from this binary")
    p.add_argument("--data", required=True, help="a folder laid out like shared/data")
    p.add_argument("--model", default="copy", choices=sorted(decode_eval.MODELS))
    p.add_argument("--budget", default="1/16")
    p.add_argument("--texts", type=int, default=8, help="recall texts (at most)")
    p.add_argument("--prompt", type=int, default=None,
                   help="prefilled bytes (default: 512, 1536 for the 2K model)")
    p.add_argument("--calibration-dir", default=os.path.join(HERE, "calibration"))
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    prompt = args.prompt or (1536 if args.model == "copy2k" else 512)
    model, texts = decode_eval.load_texts(args.data, args.model, args.texts)
    texts = [t for t in texts if t["kind"] == "recall"]
    if not texts:
        sys.exit(f"{args.data}: no recall texts for {args.model}")
    weights = decode_eval.MODELS[args.model][0]
    calibration = decode_eval.load_calibration(
        os.path.join(args.calibration_dir, texts[0]["model"] + ".json"), lambda m: None)
    heads = [(h["layer"], h["q_head"]) for h in calibration.get("retrieval_heads", [])]
    tokens = [t["tokens"] for t in texts]
    length = tokens[0].shape[0]
    rep = 3 * length // 4
    settings = {"tiers.device.capacity_bytes": "96MiB", "tiers.host.capacity_bytes": "256MiB",
                "tiers.nvme.file_size_bytes": "256MiB"}
    with kvtier.LocalDaemon(args.kvtierd, settings=settings) as daemon:
        client = daemon.client()
        profile = client.register_profile(
            kvtier.Profile(weights, model.num_layers, model.num_kv_heads, model.head_dim, 16, "fp16",
                           revision="calibrated"), calibration=calibration)
        cache = kv_engine.PrefillCache(model, tokens, prompt)
        losses, chosen = {}, None
        for policy, scorer, f in (("full", "recency", 1.0), ("window", None, None),
                                  ("select", "unspecified", None)):
            frac = f if f is not None else decode_eval.fraction(args.budget)
            engine = RecordingEngine(model, client, profile, policy=policy, fraction=frac,
                                     scorer=scorer, retrieval_heads=heads, log=lambda m: None)
            r = engine.run(tokens, cache)
            losses[policy] = r.losses.numpy()
            if policy == "select":
                chosen = engine.chosen
        client.close()
    if not any(t >= rep - 1 for t in chosen):
        sys.exit("no selection of the repeat was recorded: the engine fell back or never selected")
    bs = 16
    print(f"{args.model} at {args.budget}, {len(texts)} recall texts of {length} bytes "
          f"(repeat from byte {rep})")
    print("| steps of the repeat | held | closed | instead (distance from the last block: share) |")
    print("|---|---:|---:|---|")
    first = rep - 1
    all_held = all_total = 0
    all_instead = collections.Counter()
    for s0 in range(first, length - 1, STRETCH):
        steps = range(s0, min(s0 + STRETCH, length - 1))
        held = total = 0
        instead = collections.Counter()
        for t in steps:
            need = (t + 1 - rep) // bs
            for i in range(len(texts)):
                picked = chosen.get(t, [[]] * len(texts))[i]
                total += 1
                if need in picked:
                    held += 1
                else:
                    last = t // bs - 1
                    for p in picked:
                        if p != 0 and p != last:
                            instead[last - p] += 1
        w = losses["window"][:, steps].mean()
        d = losses["select"][:, steps].mean()
        full = losses["full"][:, steps].mean()
        closed = (w - d) / (w - full) if w > full else float("nan")
        all_held += held
        all_total += total
        all_instead.update(instead)
        n = sum(instead.values()) or 1
        top = ", ".join(f"{k}: {v / n:.0%}" for k, v in instead.most_common(3))
        print(f"| {s0 - first}-{s0 - first + len(steps) - 1} | {held / total:.0%} | "
              f"{closed:.0%} | {top} |")
    n = sum(all_instead.values()) or 1
    recent = sum(v for k, v in all_instead.items() if k <= 5)
    print(f"whole repeat: held {all_held / all_total:.0%} of the steps; when not, the free slots "
          f"held a block at most 5 from the last one {recent / n:.0%} of the time, one further "
          f"back {1 - recent / n:.0%}")
    steps = range(first, length - 1)
    w, d, full = (losses[k][:, steps].mean() for k in ("window", "select", "full"))
    print(f"whole repeat: closed {(w - d) / (w - full):.0%} (window {w:.4f}, default {d:.4f}, "
          f"full {full:.4f} nats)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
