"""Training sequences rich in repeated passages, and the fixed evaluation set.

A training sequence is T+1 contiguous bytes from a random place in the
corpus; with probability repeat_frac one passage of it (passage_min to
passage_max bytes) is copied over a later stretch of the same sequence. With
probability far_frac the copy lands far back (its distance to the first
reading uniform in [T/2, T - length]), otherwise near (uniform in
[length, T/2]). The model then predicts the copy from the first reading.

Evaluation sequences follow the recall/window dumps of shared/data/realkv:
a recall window of length n is a passage (first quarter), unrelated text
(middle half) and the same passage again (last quarter); a window is
contiguous text. Both come from held-out text with a fixed seed.
"""

import numpy as np


class Sampler:
    """Deterministic given its seed; state() / set_state() carry it across a resume."""

    def __init__(self, corpus, context, repeat_frac, far_frac, passage_min, passage_max, seed):
        self.corpus = np.frombuffer(corpus, dtype=np.uint8)
        if len(self.corpus) < context + 2:
            raise ValueError(f"corpus: {len(self.corpus)} bytes, fewer than --context {context} + 2")
        self.context = context
        self.repeat_frac, self.far_frac = repeat_frac, far_frac
        self.passage_min = min(passage_min, context // 4)
        self.passage_max = max(self.passage_min, min(passage_max, context // 2))
        self.rng = np.random.default_rng(seed)

    def state(self):
        return self.rng.bit_generator.state

    def set_state(self, state):
        self.rng.bit_generator.state = state

    def sequence(self):
        """Returns (tokens [T+1] int64, span or None); span = (first, copy, length)."""
        t = self.context
        start = int(self.rng.integers(0, len(self.corpus) - t - 1))
        seq = self.corpus[start:start + t + 1].astype(np.int64)
        if self.rng.random() >= self.repeat_frac:
            return seq, None
        length = int(self.rng.integers(self.passage_min, self.passage_max + 1))
        if self.rng.random() < self.far_frac:
            lo, hi = t // 2, t - length
        else:
            lo, hi = length, t // 2
        dist = int(self.rng.integers(min(lo, hi), max(lo, hi) + 1))
        first = int(self.rng.integers(0, t - dist - length + 1))
        seq[first + dist:first + dist + length] = seq[first:first + length]
        return seq, (first, first + dist, length)

    def batch(self, n):
        seqs, spans = zip(*(self.sequence() for _ in range(n)))
        return np.stack(seqs), list(spans)


def recall_window(text, n, rng):
    """n bytes: passage (n/4), unrelated text (n/2), the passage again; returns (tokens, span)."""
    q = n // 4
    if len(text) < 4 * n:
        raise ValueError(f"eval text: {len(text)} bytes, fewer than 4 x the recall length {n}")
    a = int(rng.integers(0, len(text) - q))
    b = int(rng.integers(0, len(text) - 2 * q))
    while abs(b - a) < 3 * q:  # the filler must not contain the passage
        b = int(rng.integers(0, len(text) - 2 * q))
    passage = text[a:a + q]
    seq = np.concatenate([passage, text[b:b + n - 2 * q], passage]).astype(np.int64)
    return seq, (0, n - q, q)


def eval_set(text, lengths, recall_per_length, windows, window_length, seed=1234):
    """{"recall": {n: [(tokens, span)]}, "window": [tokens]} from held-out bytes."""
    text = np.frombuffer(text, dtype=np.uint8)
    rng = np.random.default_rng(seed)
    recall = {n: [recall_window(text, n, rng) for _ in range(recall_per_length)] for n in lengths}
    win = []
    for _ in range(windows):
        s = int(rng.integers(0, len(text) - window_length))
        win.append(text[s:s + window_length].astype(np.int64))
    return {"recall": recall, "window": win}
