#!/usr/bin/python3
"""How well a copy head's lockstep run tells copying from plain text.

For each copy-model dump of ../shared/data/realkv and every decode step t
(the second half), the retrieval head's strongest stored key j(t) under full
attention (the token it scores highest among the complete blocks). A run
grows while j(t) = j(t-1) + 1 (the head reads a passage forward, one token
per step) and restarts otherwise. This is what the mass scorer's copy
tracking sees (index/select/calibration.h, copy_run). For each run length k it
prints:

- plain: steps of the plain-text windows at which a run of k ends at a key
  at least 4 blocks back (a false confirmation: following the head there
  makes the model copy the wrong continuation);
- first: per recall window, how many steps into the repeated passage the
  first confirmation comes;
- covered: the share of the repeated passage's steps where the head holds
  at least 0.4 of its attention on a block 4+ back that come after the first
  confirmation (what copy_hold 64 then keeps).

usage: bench/quality/copy_runs.py [--data ../shared/data/realkv] [--head 3:2]
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python", "examples"))
import safetensors_io  # noqa: E402

BLOCK = 16
FAR_BLOCKS = 4


def strongest_keys(path, layer, q_head):
    """Per decode step: (t, j, share of the block holding j, blocks)."""
    tensors, _ = safetensors_io.read(path)
    q = np.array(tensors["q"][layer, q_head], dtype=np.float64)
    kv = q_head // (tensors["q"].shape[1] // tensors["k"].shape[1])
    k = np.array(tensors["k"][layer, kv], dtype=np.float64)
    T, dim = q.shape
    out = []
    for t in range(T // 2, T):
        n = t // BLOCK  # complete blocks before the partial one
        logits = k[: t + 1] @ q[t] / np.sqrt(dim)
        p = np.exp(logits - logits.max())
        p /= p.sum()
        stored = p[: n * BLOCK]
        j = int(np.argmax(stored))
        out.append((t, j, float(stored[(j // BLOCK) * BLOCK:(j // BLOCK + 1) * BLOCK].sum()), n))
    return out


def runs(steps):
    prev, run = -100, 0
    for t, j, share, n in steps:
        run = run + 1 if j == prev + 1 else 0
        prev = j
        yield t, j, share, n, run, n - 1 - j // BLOCK >= FAR_BLOCKS


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=os.path.join(HERE, "..", "..", "..", "shared", "data", "realkv"))
    ap.add_argument("--head", default="3:2", help="layer:q_head (default: the copy head L3H2)")
    ap.add_argument("--runs", default="3,4,5,6,8")
    a = ap.parse_args()
    layer, q_head = (int(x) for x in a.head.split(":"))
    dumps = {}
    for kind in ("window", "recall"):
        for i in range(4):
            path = os.path.join(a.data, f"rkc-persuasion-{kind}-{i:02d}.safetensors")
            dumps[os.path.basename(path)] = (kind, strongest_keys(path, layer, q_head))
    print(f"head L{layer}H{q_head}; a key counts as far from {FAR_BLOCKS} blocks back")
    for k in (int(x) for x in a.runs.split(",")):
        false_hits = plain_steps = covered = useful = 0
        first = []
        for kind, steps in dumps.values():
            repeat_from = steps[-1][0] + 1 - (steps[-1][0] + 1) // 4  # the last quarter
            confirmed = None
            for t, j, share, n, run, far in runs(steps):
                hit = run >= k and far
                if kind == "window":
                    plain_steps += 1
                    false_hits += hit
                    continue
                if t < repeat_from:
                    continue
                if hit and confirmed is None:
                    confirmed = t
                if far and share >= 0.4:
                    useful += 1
                    covered += confirmed is not None
            if kind == "recall":
                first.append("-" if confirmed is None else str(confirmed - repeat_from))
        print(f"run {k}: plain {false_hits}/{plain_steps} steps confirm; first confirmation "
              f"{', '.join(first)} steps into the repeat; covered {covered}/{useful} = "
              f"{covered / max(useful, 1):.2f}")


if __name__ == "__main__":
    main()
