#!/usr/bin/env python3
"""Extends a byte model (shared/data/models) to a longer context by training.

Same architecture and math as client/python/examples/byte_model.py; rotary
positions over the new range; causal attention in query chunks (long_model.py);
sequences rich in passages repeated far back (long_data.py); gradient
accumulation; the copy heads frozen for a while and then trained at a
reduced learning rate, or re-initialised. Writes OUT/model.safetensors (the
input's exact layout, metadata train_ctx = --context), OUT/ckpt.pt (weights,
optimizer, data position: --resume continues bit for bit) and OUT/log.jsonl
(one JSON object per line: "train" records with the loss and the copy ratio
of the step's repeated passages, "eval" records with held-out diagnostics).
See README.md beside this file for the options and the recommended curriculum.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import austen_corpus  # noqa: E402
import long_data  # noqa: E402
import long_model  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = ap.add_argument
    a("--init", required=True, help="safetensors weights to start from (ignored when --resume finds OUT/ckpt.pt)")
    a("--out", required=True, help="output folder: model.safetensors, ckpt.pt, log.jsonl")
    a("--log", help="JSON-lines log (default OUT/log.jsonl)")
    a("--context", type=int, default=4096, help="training sequence length in bytes")
    a("--steps", type=int, default=2000, help="optimizer steps in the whole run (sets the lr schedule)")
    a("--stop-after", type=int, default=0, help="stop (with a checkpoint) after this many steps in this invocation")
    a("--batch", type=int, default=1, help="sequences per forward/backward")
    a("--accum", type=int, default=4, help="forward/backward passes per optimizer step (effective batch = batch x accum)")
    a("--lr", type=float, default=3e-4, help="peak learning rate (AdamW), linear warmup then cosine to lr/10")
    a("--warmup", type=int, default=50, help="warmup steps")
    a("--weight-decay", type=float, default=0.0)
    a("--clip", type=float, default=1.0, help="gradient norm clip (0: none)")
    a("--copy-heads", default="3.2,3.3", help="LAYER.HEAD list of the copy heads (austen-copy*: 3.2,3.3)")
    a("--freeze-copy-heads", type=int, default=0, help="keep the copy heads' weights fixed for the first N steps")
    a("--copy-head-lr-scale", type=float, default=1.0, help="after freezing, their updates are scaled by this")
    a("--reinit-heads", default="", help="LAYER.HEAD list re-initialised (normal, std 0.02) before training")
    a("--repeat-frac", type=float, default=0.5, help="fraction of training sequences holding a repeated passage")
    a("--far-frac", type=float, default=0.7, help="fraction of repeats at distance >= context/2")
    a("--passage-min", type=int, default=128)
    a("--passage-max", type=int, default=1024)
    a("--attn-chunk", type=int, default=512, help="query chunk of the causal attention")
    a("--corpus-dir", default=austen_corpus.DEFAULT_DIR, help="r-cran-janeaustenr's data folder")
    a("--train-text", help="plain text file to train on instead of the four training novels")
    a("--eval-text", help="plain text file to evaluate on instead of Persuasion")
    a("--eval-every", type=int, default=50, help="held-out diagnostics every N steps (0: only at the end)")
    a("--eval-lengths", default="", help="recall window lengths evaluated (default: 2048 and --context)")
    a("--eval-recall", type=int, default=3, help="recall windows per length")
    a("--eval-windows", type=int, default=2, help="plain windows (length --context)")
    a("--checkpoint-every", type=int, default=25, help="write ckpt.pt and model.safetensors every N steps")
    a("--resume", action="store_true", help="continue from OUT/ckpt.pt when it exists")
    a("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a("--threads", type=int, default=2, help="torch CPU threads")
    a("--seed", type=int, default=0)
    return ap.parse_args(argv)


def parse_heads(spec):
    return [tuple(int(x) for x in h.split(".")) for h in spec.split(",") if h.strip()]


def load_texts(args):
    if args.train_text:
        with open(args.train_text, "rb") as f:
            train = f.read()
    else:
        train = austen_corpus.training_bytes(args.corpus_dir)
    if args.eval_text:
        with open(args.eval_text, "rb") as f:
            held = f.read()
    else:
        held = austen_corpus.read_books(args.corpus_dir)[austen_corpus.HELD_OUT_BOOK].encode("utf-8")
    return train, held


def lr_at(args, step):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


class HeadGuard:
    """Scales the optimizer's update of the copy heads' weight slices (0 = frozen)."""

    def __init__(self, weights, cfg, heads):
        self.w = weights
        self.slices = [s for (l, h) in heads for s in long_model.head_slices(cfg, l, h)]

    @staticmethod
    def _view(t, dim, lo, hi):
        return t[lo:hi] if dim == 0 else t[:, lo:hi]

    def snapshot(self):
        return [self._view(self.w[n], d, lo, hi).detach().clone() for n, d, lo, hi in self.slices]

    @torch.no_grad()
    def restore(self, before, scale):
        for (n, d, lo, hi), old in zip(self.slices, before):
            view = self._view(self.w[n], d, lo, hi)
            view.copy_(old + scale * (view - old))


def span_losses(losses, spans):
    """Sums of per-target loss on the first readings and on the copies (first byte excluded)."""
    first = copy = 0.0
    for row, span in zip(losses, spans):
        if span is None:
            continue
        a, c, n = span
        first += float(row[a:a + n - 1].sum())  # row[i] is the loss of predicting token i + 1
        copy += float(row[c:c + n - 1].sum())
    return first, copy


@torch.no_grad()
def evaluate(w, cfg, evals, chunk, device, heads):
    out = {"recall": {}}
    for n, items in evals["recall"].items():
        first = copy = 0.0
        mass = torch.zeros(cfg.layers, cfg.q_heads)
        for tokens, (a, c, q) in items:
            x = torch.tensor(tokens[None], device=device)
            logits, m = long_model.forward(w, cfg, x, chunk, probe=(c, c + q, a, a + q))
            losses = F.cross_entropy(logits[0, :-1], x[0, 1:], reduction="none")[None]
            f, cp = span_losses(losses, [(a, c, q)])
            first, copy = first + f, copy + cp
            mass += m[:, 0].cpu()
        mass /= len(items)
        best = divmod(int(mass.argmax()), cfg.q_heads)
        out["recall"][str(n)] = {
            "ratio": round(copy / max(first, 1e-9), 4),
            "first_loss": round(first / (len(items) * (q - 1)), 4),
            "copy_mass": {f"{l}.{h}": round(float(mass[l, h]), 4) for l, h in heads},
            "best_head": [f"{best[0]}.{best[1]}", round(float(mass.max()), 4)]}
    total = count = 0.0
    for tokens in evals["window"]:
        x = torch.tensor(tokens[None], device=device)
        logits = long_model.forward(w, cfg, x, chunk)
        total += float(F.cross_entropy(logits[0, :-1], x[0, 1:], reduction="sum"))
        count += len(tokens) - 1
    out["plain_loss"] = round(total / max(count, 1), 4)
    return out


def save_checkpoint(args, state):
    w, names, cfg = state["w"], state["names"], state["cfg"]
    meta = dict(cfg.meta, train_ctx=str(args.context))
    long_model.save(os.path.join(args.out, "model.safetensors"), w, names, meta)
    ckpt = {"step": state["step"], "names": names, "meta": cfg.meta,
            "weights": {n: w[n].detach().cpu() for n in names},
            "optimizer": state["opt"].state_dict(), "sampler": state["sampler"].state(),
            "torch_rng": torch.get_rng_state(), "args": vars(args)}
    path = os.path.join(args.out, "ckpt.pt")
    torch.save(ckpt, path + ".tmp")
    os.replace(path + ".tmp", path)


def setup(args, train_text):
    """Returns the training state: weights, optimizer, sampler, step (resumed when asked)."""
    ckpt_path = os.path.join(args.out, "ckpt.pt")
    ckpt = torch.load(ckpt_path, map_location="cpu") if args.resume and os.path.exists(ckpt_path) else None
    w, cfg, names = long_model.load(args.init, args.device)
    if ckpt is not None:
        if ckpt["names"] != names:
            raise ValueError(f"{ckpt_path}: tensor names differ from --init {args.init}")
        cfg = long_model.Config(ckpt["meta"])
        for n in names:
            w[n] = ckpt["weights"][n].to(args.device)
    elif args.reinit_heads:
        gen = torch.Generator().manual_seed(args.seed)
        for l, h in parse_heads(args.reinit_heads):
            for n, d, lo, hi in long_model.head_slices(cfg, l, h)[:2]:  # q rows, o columns
                view = w[n][lo:hi] if d == 0 else w[n][:, lo:hi]
                view.copy_(torch.randn(view.shape, generator=gen).to(args.device) * 0.02)
    for n in names:
        w[n].requires_grad_(True)
    opt = torch.optim.AdamW([w[n] for n in names], lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=args.weight_decay)
    sampler = long_data.Sampler(train_text, args.context, args.repeat_frac, args.far_frac,
                                args.passage_min, args.passage_max, args.seed)
    step = 0
    if ckpt is not None:
        opt.load_state_dict(ckpt["optimizer"])
        sampler.set_state(ckpt["sampler"])
        torch.set_rng_state(ckpt["torch_rng"])
        step = ckpt["step"]
    return {"w": w, "cfg": cfg, "names": names, "opt": opt, "sampler": sampler, "step": step,
            "guard": HeadGuard(w, cfg, parse_heads(args.copy_heads))}


def train_step(args, state, rope_cache):
    """One optimizer step over args.accum batches; returns the train log record."""
    w, opt, guard, step = state["w"], state["opt"], state["guard"], state["step"]
    lr = lr_at(args, step)
    for g in opt.param_groups:
        g["lr"] = lr
    opt.zero_grad(set_to_none=True)
    total, first, copy = 0.0, 0.0, 0.0
    for _ in range(args.accum):
        seqs, spans = state["sampler"].batch(args.batch)
        x = torch.tensor(seqs, device=args.device)
        logits = long_model.forward(w, state["cfg"], x[:, :-1], args.attn_chunk, rope_cache=rope_cache)
        losses = F.cross_entropy(logits.reshape(-1, 256), x[:, 1:].reshape(-1), reduction="none")
        loss = losses.mean()
        (loss / args.accum).backward()
        total += float(loss) / args.accum
        f, c = span_losses(losses.detach().view(args.batch, -1).cpu(), spans)
        first, copy = first + f, copy + c
    params = [w[n] for n in state["names"]]
    norm = torch.nn.utils.clip_grad_norm_(params, args.clip if args.clip > 0 else float("inf"))
    scale = 0.0 if step < args.freeze_copy_heads else args.copy_head_lr_scale
    before = guard.snapshot() if scale != 1.0 else None
    opt.step()
    if before is not None:
        guard.restore(before, scale)
    state["step"] = step + 1
    return {"kind": "train", "step": step + 1, "lr": round(lr, 8), "loss": round(total, 4),
            "repeat_ratio": round(copy / first, 4) if first > 0 else None,
            "grad_norm": round(float(norm), 4), "copy_head_scale": scale}


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    train_text, held = load_texts(args)
    state = setup(args, train_text)
    lengths = [int(n) for n in args.eval_lengths.split(",") if n] or sorted({min(2048, args.context), args.context})
    evals = long_data.eval_set(held, lengths, args.eval_recall, args.eval_windows, args.context)
    heads = parse_heads(args.copy_heads)
    rope_cache = long_model.rope_tables(state["cfg"], args.context, args.device)
    log = open(args.log or os.path.join(args.out, "log.jsonl"), "a")

    def emit(rec):
        log.write(json.dumps(rec) + "\n")
        log.flush()
        print(json.dumps(rec), flush=True)

    emit({"kind": "start", "step": state["step"], "args": vars(args), "train_bytes": len(train_text)})
    if args.eval_every > 0 and state["step"] == 0:  # the starting point, for comparison
        emit(dict(kind="eval", step=0, **evaluate(state["w"], state["cfg"], evals, args.attn_chunk,
                                                  args.device, heads)))
    done = 0
    while state["step"] < args.steps and (args.stop_after <= 0 or done < args.stop_after):
        t0 = time.time()
        rec = train_step(args, state, rope_cache)
        rec["sec"] = round(time.time() - t0, 2)
        emit(rec)
        done += 1
        step = state["step"]
        if args.eval_every > 0 and step % args.eval_every == 0:
            emit(dict(kind="eval", step=step, **evaluate(state["w"], state["cfg"], evals, args.attn_chunk,
                                                        args.device, heads)))
        if step % args.checkpoint_every == 0 or step == args.steps:
            save_checkpoint(args, state)
    save_checkpoint(args, state)
    if args.eval_every == 0 or state["step"] % args.eval_every != 0:
        emit(dict(kind="eval", step=state["step"], **evaluate(state["w"], state["cfg"], evals,
                                                              args.attn_chunk, args.device, heads)))
    log.close()


if __name__ == "__main__":
    main()
