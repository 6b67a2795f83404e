"""train_long.py: its forward pass equals byte_model.py's, chunked attention
equals full attention, and a two-step run from the 2K weights resumes bit
for bit and writes the input's layout. Needs python3-torch and
KVTIER_SHARED_DATA (models/ and realkv-2k/); skips without them.
"""

import math
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
sys.path.insert(0, os.path.join(_HERE, "..", "..", "..", "client", "python", "examples"))

DATA = os.environ.get("KVTIER_SHARED_DATA", os.path.join(_HERE, "..", "..", "..", "..", "shared", "data"))
MODEL = os.path.join(DATA, "models", "model-austen-copy-2k.safetensors")


@unittest.skipIf(torch is None or not os.path.exists(MODEL), "python3-torch or shared data missing")
class TrainLongTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import safetensors_io
        torch.set_num_threads(1)
        cls.tmp = tempfile.mkdtemp(prefix="train_long_test.")
        texts = []
        for name in sorted(os.listdir(os.path.join(DATA, "realkv-2k"))):
            if name.endswith(".safetensors") and "window" in name:
                tensors, _ = safetensors_io.read(os.path.join(DATA, "realkv-2k", name))
                texts.append(np.array(tensors["tokens"], dtype=np.uint8).tobytes())
        cls.text = os.path.join(cls.tmp, "text.txt")
        with open(cls.text, "wb") as f:
            f.write(b"".join(texts))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_forward_equals_byte_model(self):
        import byte_model
        import long_model
        ref = byte_model.ByteModel.load(MODEL)
        w, cfg, _ = long_model.load(MODEL)
        tokens = torch.tensor(list(b"It is a truth universally acknowledged, that a single man"))
        want = ref.prefill(tokens)[0]
        for chunk in (0, 16):
            got = long_model.forward(w, cfg, tokens[None], chunk=chunk)[0]
            self.assertLess(float((got - want).abs().max()), 1e-4, f"chunk {chunk}")

    def test_chunked_equals_full_attention(self):
        import long_model
        g = torch.Generator().manual_seed(3)
        q = torch.randn(2, 4, 37, 8, generator=g, requires_grad=True)
        k = torch.randn(2, 2, 37, 8, generator=g, requires_grad=True)
        v = torch.randn(2, 2, 37, 8, generator=g, requires_grad=True)
        kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = q @ kk.transpose(-1, -2) / math.sqrt(8)
        mask = torch.ones(37, 37, dtype=torch.bool).tril()
        p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        full = p @ vv
        grads_full = torch.autograd.grad(full.square().sum(), (q, k, v))
        chunked, _ = long_model.causal_attention(q, k, v, group=2, chunk=10)
        grads_chunked = torch.autograd.grad(chunked.square().sum(), (q, k, v))
        self.assertLess(float((chunked - full).abs().max()), 1e-5)
        for a, b in zip(grads_full, grads_chunked):
            self.assertLess(float((a - b).abs().max()), 1e-4)
        with torch.no_grad():
            _, mass = long_model.causal_attention(q, k, v, group=2, chunk=10, probe=(25, 37, 3, 12))
        self.assertLess(float((mass - p[:, :, 25:37, 3:12].sum(-1).mean(-1)).abs().max()), 1e-5)

    def _run(self, out, *extra):
        import train_long
        train_long.main(["--init", MODEL, "--out", out, "--context", "96", "--steps", "2", "--accum", "2",
                         "--warmup", "1", "--lr", "1e-3", "--passage-min", "16", "--attn-chunk", "32",
                         "--train-text", self.text, "--eval-text", self.text, "--eval-every", "1",
                         "--eval-lengths", "96", "--eval-recall", "1", "--eval-windows", "1",
                         "--checkpoint-every", "1", "--freeze-copy-heads", "2", "--threads", "1",
                         "--device", "cpu", *extra])

    def test_resume_is_identical_and_layout_kept(self):
        import json
        import long_model
        import safetensors_io
        straight, split = os.path.join(self.tmp, "a"), os.path.join(self.tmp, "b")
        self._run(straight)
        self._run(split, "--stop-after", "1")
        self._run(split, "--resume")
        with open(os.path.join(straight, "model.safetensors"), "rb") as f:
            a = f.read()
        with open(os.path.join(split, "model.safetensors"), "rb") as f:
            self.assertEqual(a, f.read(), "resumed run differs from the straight run")
        with open(os.path.join(split, "log.jsonl")) as f:
            logs = [json.loads(line) for line in f]
        self.assertEqual([r["step"] for r in logs if r["kind"] == "train"], [1, 2])
        evals = [r for r in logs if r["kind"] == "eval"]
        self.assertTrue(evals and "ratio" in evals[-1]["recall"]["96"] and evals[-1]["plain_loss"] > 0)

        init, init_meta = safetensors_io.read(MODEL)
        got, meta = safetensors_io.read(os.path.join(straight, "model.safetensors"))
        self.assertEqual(list(got), list(init))
        for name in init:
            self.assertEqual(got[name].shape, init[name].shape, name)
            self.assertEqual(got[name].dtype, np.float32, name)
        self.assertEqual(meta, dict(init_meta, train_ctx="96"))
        changed = [n for n in init if not np.array_equal(got[n], init[n])]
        self.assertIn("blocks.0.q.weight", changed)
        cfg = long_model.Config(meta)
        for layer, head in ((3, 2), (3, 3)):  # frozen for both steps
            for name, dim, lo, hi in long_model.head_slices(cfg, layer, head):
                sl = (slice(lo, hi),) if dim == 0 else (slice(None), slice(lo, hi))
                self.assertTrue(np.array_equal(got[name][sl], init[name][sl]), name)


if __name__ == "__main__":
    unittest.main()
