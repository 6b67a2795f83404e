#!/usr/bin/python3
"""Makes realkv dumps of *Persuasion* with the byte models: text to tune on
and separate text to report on.

    /usr/bin/python3 bench/quality/make_dumps.py --data ../shared/data --out bench/out/persuasion

writes two folders, OUT/tune and OUT/report, each laid out like
shared/data (so decode_eval.py --data and the C++ harness read them as
they read the shared dumps):

    realkv/{rk,rkc}-persuasion-{window,recall}-NN.safetensors    1,024 bytes
    realkv-2k/rkl-persuasion-{window,recall}-NN.safetensors      2,048 bytes
    models -> the shared weights (a symbolic link)

--count windows of each kind per model and set (default 8). The format, the
two kinds of window and the models are those of shared/data/realkv/README.md;
the text is Debian's r-cran-janeaustenr (bench/quality/models/austen_corpus.py).

Where the windows lie. With T the window length and U = len(book) - T + 1
the possible starts, the shared dumps start at i * U / (n + 1) (rounded
down; i = 1..n, n = 4 at 1K and 3 at 2K). A recall window is the passage
book[o : o + T/4], the filler book[f : f + T/2] with f = (o + U // 2 +
T // 2) mod U, and the passage again. The new windows start near
k * U / (2 count + 1), k = 1..2 count, moved forward in steps of 64 bytes
until neither the window nor its filler touches a byte that a shared dump
(either length) or an earlier new window reads; odd k go to tune, even k to
report, so the sets share no text and both span the book. Window NN and
recall NN of a set start at the same offset, as in the shared data. New
dumps add `set` and `filler_offset` to the metadata.

--check NAME remakes the shared dump NAME from its metadata and compares
it: tokens exactly, metadata, the loss to the dump's 4 decimals, and q, k, v
to float16 rounding. Exit status 1 when anything differs.
"""

import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python", "examples"))
sys.path.insert(0, os.path.join(HERE, "models"))
import austen_corpus  # noqa: E402
import byte_model  # noqa: E402
import safetensors_io  # noqa: E402

# key: (weights name, dump prefix, folder, window length, shared dumps per
# kind, the model name the shared dumps carry: calibrations are found by it)
MODELS = {
    "byte": ("austen-byte", "rk", "realkv", 1024, 4, "byte-gpt-gqa-rope"),
    "copy": ("austen-copy", "rkc", "realkv", 1024, 4, "austen-copy"),
    "copy2k": ("austen-copy-2k", "rkl", "realkv-2k", 2048, 3, "austen-copy-2k"),
}
LAYOUTS = {"window": "one contiguous window",
           "recall": "passage [0,T/4), filler [T/4,3T/4), same passage again [3T/4,T)"}
ROPE = "half-split (x1,x2)->(x1c-x2s,x1s+x2c), applied to q and k"
STEP = 64
# Agreement of a remade dump with a shared one: computed by another BLAS,
# a value may round to the neighbouring float16 (one unit in the last
# place: 2^-8 for |x| in [8, 16); the shared dumps' q, k, v stay below 16).
QKV_ATOL, QKV_RTOL = 0.01, 1e-3


def shared_starts(book_len, length, n):
    usable = book_len - length + 1
    return [i * usable // (n + 1) for i in range(1, n + 1)]


def filler_start(book_len, length, offset):
    usable = book_len - length + 1
    return (offset + usable // 2 + length // 2) % usable


def window_tokens(book, mode, offset, filler, length):
    if mode == "window":
        return book[offset:offset + length]
    quarter = length // 4
    passage = book[offset:offset + quarter]
    return passage + book[filler:filler + length // 2] + passage


class Ranges:
    """Byte ranges [begin, end) of the book already read by some dump."""

    def __init__(self):
        self.ranges = []

    def add(self, begin, end):
        self.ranges.append((begin, end))

    def free(self, begin, end):
        return all(end <= b or begin >= e for b, e in self.ranges)


def shared_ranges(book_len):
    used = Ranges()
    for _, _, _, length, n, _ in MODELS.values():
        for o in shared_starts(book_len, length, n):
            used.add(o, o + length)
            f = filler_start(book_len, length, o)
            used.add(f, f + length // 2)
    return used


def plan(book_len, count, used):
    """{(length, set): [(offset, filler)] * count}: the new windows' starts."""
    out = {}
    for length in sorted({m[3] for m in MODELS.values()}):
        usable = book_len - length + 1
        for k in range(1, 2 * count + 1):
            o = k * usable // (2 * count + 1)
            while True:
                if o >= usable:
                    raise ValueError(f"no free {length}-byte window left after k={k}")
                f = filler_start(book_len, length, o)
                if used.free(o, o + length) and used.free(f, f + length // 2):
                    break
                o += STEP
            used.add(o, o + length)
            used.add(f, f + length // 2)
            out.setdefault((length, "tune" if k % 2 else "report"), []).append((o, f))
    return out


def make(model, model_key, book, mode, offset, filler):
    """(tensors, metadata) of one dump, as the shared dumps hold them."""
    name, _, _, length, _, dump_name = MODELS[model_key]
    tokens = window_tokens(book, mode, offset, filler, length)
    t = torch.tensor(list(tokens), dtype=torch.int64)
    with torch.no_grad():
        logits, q, k, v = model.prefill(t)
        loss = byte_model.next_byte_loss(logits[:-1], t[1:]).mean().item()
    tensors = {"tokens": np.array(list(tokens), dtype=np.int32),
               "q": q.numpy().astype(np.float16), "k": k.numpy().astype(np.float16),
               "v": v.numpy().astype(np.float16)}
    meta = {"format": "kvtier-realkv-1", "model": dump_name, "layers": model.num_layers,
            "q_heads": model.num_q_heads, "kv_heads": model.num_kv_heads, "head_dim": model.head_dim,
            "d_model": model.d_model, "train_ctx": model.context_tokens,
            "rope_theta": int(model.rope_theta), "rope": ROPE,
            "softmax_scale": f"1/sqrt({model.head_dim})", "causal": "true", "tokens": "bytes (vocab 256)",
            "source": austen_corpus.HELD_OUT_BOOK, "offset": offset, "seq_len": length,
            "next_byte_loss_nats": f"{loss:.4f}", "mode": mode, "layout": LAYOUTS[mode]}
    meta["weights"] = f"model-{name}.safetensors"
    return tensors, {k: str(v) for k, v in meta.items()}


def load_model(data, model_key):
    return byte_model.ByteModel.load(os.path.join(data, "models", f"model-{MODELS[model_key][0]}.safetensors"))


def read_book(corpus_dir):
    return austen_corpus.read_books(corpus_dir)[austen_corpus.HELD_OUT_BOOK].encode("utf-8")


def check(args, name):
    """Remakes the shared dump `name`; returns a list of differences."""
    key = next((k for k, m in MODELS.items() if name.startswith(m[1] + "-")), None)
    if key is None:
        return [f"{name}: no model makes dumps named so (prefixes {', '.join(m[1] for m in MODELS.values())})"]
    path = os.path.join(args.data, MODELS[key][2], name + ".safetensors")
    want, meta = safetensors_io.read(path)
    book = read_book(args.corpus_dir)
    length, offset = int(meta["seq_len"]), int(meta["offset"])
    got, got_meta = make(load_model(args.data, key), key, book, meta["mode"], offset,
                         filler_start(len(book), length, offset))
    diffs = [f"metadata {k}: {got_meta.get(k)!r} != {v!r}" for k, v in meta.items() if got_meta.get(k) != v]
    if not np.array_equal(got["tokens"], want["tokens"]):
        diffs.append("tokens differ")
    for t in ("q", "k", "v"):
        a, b = got[t].astype(np.float32), np.asarray(want[t], dtype=np.float32)
        if a.shape != b.shape or not np.allclose(a, b, atol=QKV_ATOL, rtol=QKV_RTOL):
            worst = float(np.abs(a - b).max()) if a.shape == b.shape else float("nan")
            diffs.append(f"{t} differs beyond float16 rounding (worst |diff| {worst})")
    return diffs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("KVTIER_SHARED_DATA", "/work/shared/data"),
                   help="folder with models/ and the shared realkv dumps")
    p.add_argument("--corpus-dir", default=austen_corpus.DEFAULT_DIR, help="janeaustenr's data folder")
    p.add_argument("--out", help="write OUT/tune and OUT/report")
    p.add_argument("--count", type=int, default=8, help="windows of each kind per model and set")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--check", metavar="NAME", action="append", default=[],
                   help="remake this shared dump and compare (repeatable)")
    args = p.parse_args(argv)
    if not args.check and not args.out:
        p.error("give --out or --check")
    failed = False
    for name in args.check:
        diffs = check(args, name)
        print(f"{name}: {'reproduced' if not diffs else 'DIFFERS: ' + '; '.join(diffs)}", flush=True)
        failed |= bool(diffs)
    if args.out:
        write_sets(args)
    return 1 if failed else 0


def write_sets(args):
    book = read_book(args.corpus_dir)
    windows = plan(len(book), args.count, shared_ranges(len(book)))
    models = os.path.abspath(os.path.join(args.data, "models"))
    for key in args.models.split(","):
        if key not in MODELS:
            sys.exit(f"--models: unknown model {key!r} (known: {', '.join(MODELS)})")
        model = load_model(args.data, key)
        _, prefix, folder, length, _, _ = MODELS[key]
        for which in ("tune", "report"):
            out = os.path.join(args.out, which, folder)
            os.makedirs(out, exist_ok=True)
            link = os.path.join(args.out, which, "models")
            if not os.path.lexists(link):
                os.symlink(models, link)
            for i, (offset, filler) in enumerate(windows[(length, which)]):
                for mode in ("window", "recall"):
                    tensors, meta = make(model, key, book, mode, offset, filler)
                    meta["set"] = which
                    if mode == "recall":
                        meta["filler_offset"] = str(filler)
                    path = os.path.join(out, f"{prefix}-persuasion-{mode}-{i:02d}.safetensors")
                    safetensors_io.write(path, tensors, meta)
                    print(f"{path}: offset {offset}, loss {meta['next_byte_loss_nats']}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
