#!/usr/bin/python3
"""How far a decode step's anchor moves, and what an exact incremental
Select step would have to rescore, on the realkv dumps.

For every step t of each dump: the anchor is the mean of the pooled keys
(over layers and KV heads) of the last RECENT tokens, scaled to unit
length; v_b are the unit means of the finished 16-token blocks. A block's
affinity (1 + cos) / 2 can move by at most |a_t - a_(t-1)| / 2 between two
steps (|v_b| = 1), so an incremental step that reuses the previous scores
and stays exact must rescore every block whose previous affinity lies
within that distance of the cut-off (the k-th best, budget 1/8).

Usage: anchor_drift.py DATA_DIR [RECENT ...]   (DATA_DIR: shared/data/realkv)
"""
import glob
import json
import struct
import sys

import numpy as np

BLOCK = 16


def load_keys(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        header = json.loads(f.read(n))
        t = header['k']
        begin, end = t['data_offsets']
        f.seek(8 + n + begin)
        raw = np.frombuffer(f.read(end - begin), dtype=np.float16)
        return raw.reshape(t['shape']).astype(np.float32)  # [L, H, T, D]


def measure(path, recent):
    pooled = load_keys(path).mean(axis=(0, 1))  # [T, D]
    T, D = pooled.shape
    drift, share = [], []
    prev = None
    for t in range(4 * BLOCK, T):
        a = pooled[t - recent + 1:t + 1].mean(0)
        a /= np.linalg.norm(a)
        nb = (t + 1) // BLOCK
        vb = pooled[:nb * BLOCK].reshape(nb, BLOCK, D).mean(1)
        vb /= np.linalg.norm(vb, axis=1, keepdims=True)
        aff = 0.5 * (1.0 + vb @ a)
        if prev is not None:
            d = float(np.linalg.norm(a - prev))
            kth = np.sort(aff)[-max(1, nb // 8)]
            drift.append(d)
            share.append(float(np.mean(np.abs(aff - kth) <= d)))
        prev = a
    return np.median(drift), np.percentile(drift, 90), np.median(share)


def main():
    data = sys.argv[1]
    recents = [int(x) for x in sys.argv[2:]] or [4, 16]
    print('| anchor (last tokens) | model | step drift p50 | p90 | blocks an exact incremental step rescores (p50) |')
    print('|---|---|---|---|---|')
    for recent in recents:
        for model, pattern in (('austen-byte', 'rk-*'), ('austen-copy', 'rkc-*')):
            rows = [measure(p, recent) for p in sorted(glob.glob(f'{data}/{pattern}.safetensors'))]
            if not rows:
                continue
            print('| %d | %s | %.3f | %.3f | %.0f%% |' % (
                recent, model, np.median([r[0] for r in rows]),
                np.median([r[1] for r in rows]), 100 * np.median([r[2] for r in rows])))


if __name__ == '__main__':
    main()
