"""The byte model's forward pass and the example engine's decode loop on a real kvtierd."""

import os
import unittest

import numpy as np
import torch

import kvtier
from support import DaemonTestCase, SHARED_DATA, add_examples_to_path, require_shared_data

add_examples_to_path()
import byte_model  # noqa: E402
import kv_engine  # noqa: E402
import safetensors_io  # noqa: E402


def load(model_key, dump):
    weights = {"byte": "model-austen-byte", "copy": "model-austen-copy"}[model_key]
    model = byte_model.ByteModel.load(os.path.join(SHARED_DATA, "models", weights + ".safetensors"))
    tensors, meta = safetensors_io.read(os.path.join(SHARED_DATA, "realkv", dump))
    return model, tensors, meta


class ForwardTest(unittest.TestCase):
    def setUp(self):
        require_shared_data(self)

    def test_reproduces_a_dump_of_each_model(self):
        for key, dump in (("byte", "rk-persuasion-window-01.safetensors"),
                          ("copy", "rkc-persuasion-recall-02.safetensors")):
            with self.subTest(model=key):
                model, t, meta = load(key, dump)
                tokens = torch.from_numpy(np.array(t["tokens"], dtype=np.int64))
                with torch.no_grad():
                    logits, q, k, v = model.prefill(tokens)
                loss = byte_model.next_byte_loss(logits[:-1], tokens[1:]).mean().item()
                self.assertAlmostEqual(loss, float(meta["next_byte_loss_nats"]), delta=1e-3)
                for name, ours in (("q", q), ("k", k), ("v", v)):
                    dumped = torch.from_numpy(np.array(t[name], dtype=np.float32))
                    # The dumps hold float16: half a unit in the last place apart, plus
                    # float32 summation-order noise.
                    excess = (ours - dumped).abs() - dumped.abs() * 2.0 ** -11
                    self.assertLess(excess.max().item(), 1e-3, name)


class EngineTest(DaemonTestCase):
    settings = {"tiers.device.capacity_bytes": "64MiB"}

    @classmethod
    def setUpClass(cls):
        if not os.path.isdir(os.path.join(SHARED_DATA, "models")):
            raise unittest.SkipTest(f"{SHARED_DATA}/models is absent")
        super().setUpClass()
        cls.model, window, _ = load("copy", "rkc-persuasion-window-00.safetensors")
        _, recall, _ = load("copy", "rkc-persuasion-recall-00.safetensors")
        cls.texts = [torch.from_numpy(np.array(t["tokens"][:352], dtype=np.int64)) for t in (window, recall)]
        cls.cache = kv_engine.PrefillCache(cls.model, cls.texts, 256)
        cls.profile = cls.client.register_profile(kvtier.Profile("austen-copy-test", 4, 2, 64, 16, "fp16"))
        with torch.no_grad():
            cls.reference = torch.stack([byte_model.next_byte_loss(cls.model.prefill(t)[0][:-1], t[1:])
                                         for t in cls.texts])

    def engine(self, policy, **kwargs):
        return kv_engine.DecodeEngine(self.model, self.client, self.profile, policy=policy,
                                      log=lambda msg: None, **kwargs)

    def test_full_attention_through_the_arena_is_the_model(self):
        r = self.engine("full").run(self.texts, self.cache, max_steps=48)
        self.assertEqual(r.steps, 48)
        self.assertIsNone(r.fallback_step)
        decoded = slice(256, 256 + 48)
        diff = (r.losses[:, decoded].mean(dim=1) - self.reference[:, decoded].mean(dim=1)).abs()
        self.assertLess(diff.max().item(), 1e-3)
        # Every finished block was read at every step: 16 at the first, 18 at the last.
        self.assertEqual(r.blocks_read, 2 * sum((256 + s) // 16 for s in range(48)))
        self.assertEqual(r.pending_blocks, 0)

    def test_selection_reads_only_the_budget(self):
        for policy, scorer in (("select", "key_key"), ("select", "recency"), ("window", None)):
            with self.subTest(policy=policy, scorer=scorer):
                r = self.engine(policy, fraction=1 / 8, scorer=scorer).run(self.texts, self.cache, max_steps=32)
                budgets = [kv_engine.step_budget(1 / 8, (256 + s) // 16 + 1) - 1 for s in range(32)]
                self.assertEqual(r.blocks_read, 2 * sum(budgets))
                self.assertTrue(torch.isfinite(r.losses[:, 256:288]).all())
                full = self.reference[:, 256:288].mean().item()
                self.assertNotAlmostEqual(r.losses[:, 256:288].mean().item(), full, places=4)

    def test_daemon_gone_mid_run_falls_back_to_full_attention(self):
        daemon = kvtier.LocalDaemon(os.environ["KVTIERD"]).start()
        client = daemon.client()
        try:
            profile = client.register_profile(kvtier.Profile("austen-copy-gone", 4, 2, 64, 16, "fp16"))
            messages = []
            engine = kv_engine.DecodeEngine(self.model, client, profile, policy="select", fraction=1 / 8,
                                            scorer="key_key", log=messages.append)

            def kill_at_step_10(e):
                if e.t == 256 + 10:
                    daemon.kill()

            r = engine.run(self.texts, self.cache, max_steps=40, on_step=kill_at_step_10)
        finally:
            client.close()
            daemon.close()
        self.assertEqual(r.steps, 40)
        self.assertGreaterEqual(r.fallback_step, 266)
        self.assertIn("UNAVAILABLE", r.fallback_error)
        self.assertEqual(len(messages), 1)
        self.assertTrue(torch.isfinite(r.losses[:, 256:296]).all())
        # After the fallback every finished block is read again.
        self.assertEqual(engine.policy, "local")


if __name__ == "__main__":
    unittest.main()
