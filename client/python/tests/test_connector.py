"""The vLLM-shaped connector: lookups, loads into engine slots, saves, prefix reuse."""

import os
import unittest

import grpc
import numpy as np
import torch

from kvtier.connector import KvTierConnector, Request
from support import DaemonTestCase, SHARED_DATA, add_examples_to_path, small_profile

LAYERS = ["model.layers.0.attn", "model.layers.1.attn"]


class ConnectorTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.profile = cls.client.register_profile(small_profile("connector"))

    def pool(self, slots=8, fill=None):
        p = self.profile
        return {name: (torch.randn(2, slots, p.num_kv_heads, 16, p.head_dim).half() if fill is None
                       else torch.full((2, slots, p.num_kv_heads, 16, p.head_dim), fill, dtype=torch.float16))
                for name in LAYERS}

    def test_save_then_load_into_other_slots(self):
        connector = KvTierConnector(self.client, self.profile, LAYERS)
        tokens = list(range(3 * 16 + 5))
        first = Request("first", tokens)
        self.assertEqual(connector.get_num_new_matched_tokens(first, 0), (0, False))
        connector.update_state_after_alloc(first, [4, 5, 6, 7], 0)
        meta = connector.build_connector_meta()
        self.assertEqual([len(s.block_ids) for s in meta.saves], [3])
        source = self.pool()
        connector.bind_connector_metadata(meta)
        for name in LAYERS:
            connector.save_kv_layer(name, source[name])
        connector.wait_for_save()
        self.assertEqual(connector.get_finished({"first"}), ({"first"}, None))
        connector.request_finished(first, [4, 5, 6, 7])

        # Same first 40 tokens: two full blocks are shared and loadable.
        second = Request("second", tokens[:40] + [999] * 30)
        matched, asynchronous = connector.get_num_new_matched_tokens(second, 0)
        self.assertEqual((matched, asynchronous), (32, False))
        self.assertEqual(connector.get_num_new_matched_tokens(second, 16)[0], 16)
        connector.update_state_after_alloc(second, [0, 1, 2, 3, 4], matched)
        meta = connector.build_connector_meta()
        target = self.pool(fill=0)
        connector.bind_connector_metadata(meta)
        connector.start_load_kv(target)
        for name in LAYERS:
            connector.wait_for_layer_load(name)
            self.assertTrue(torch.equal(target[name][:, 0:2], source[name][:, 4:6]))
            self.assertTrue((target[name][:, 2:] == 0).all())
        self.assertEqual(connector.get_finished({"second"}), (None, {"second"}))
        self.assertEqual(self.client.stats().active_leases, 0)  # the load's lease was released

    def test_a_fully_stored_prompt_leaves_one_token_to_compute(self):
        connector = KvTierConnector(self.client, self.profile, LAYERS)
        tokens = list(range(100, 132))  # exactly two blocks
        req = Request("r", tokens)
        connector.update_state_after_alloc(req, [0, 1], 0)
        connector.bind_connector_metadata(connector.build_connector_meta())
        pool = self.pool()
        for name in LAYERS:
            connector.save_kv_layer(name, pool[name])
        connector.wait_for_save()
        self.assertEqual(connector.get_num_new_matched_tokens(Request("again", tokens), 0)[0], 16)

    def test_wrong_layer_and_alloc_are_refused(self):
        with self.assertKvTierError(grpc.StatusCode.INVALID_ARGUMENT, "layer_names: 1 names"):
            KvTierConnector(self.client, self.profile, LAYERS[:1])
        connector = KvTierConnector(self.client, self.profile, LAYERS)
        req = Request("x", list(range(40)))
        with self.assertKvTierError(grpc.StatusCode.INVALID_ARGUMENT, "num_external_tokens"):
            connector.update_state_after_alloc(req, [0, 1, 2], 20)
        connector.update_state_after_alloc(req, [0, 1, 2], 0)
        connector.bind_connector_metadata(connector.build_connector_meta())
        with self.assertKvTierError(grpc.StatusCode.INVALID_ARGUMENT, "layer_name"):
            connector.save_kv_layer("decoder.9", self.pool()[LAYERS[0]])


class PrefixReuseTest(DaemonTestCase):
    def test_second_request_loads_the_prefix_with_equal_logits(self):
        if not os.path.isdir(os.path.join(SHARED_DATA, "models")):
            self.skipTest(f"{SHARED_DATA}/models is absent")
        add_examples_to_path()
        import byte_model
        import prefix_reuse
        import safetensors_io

        model = byte_model.ByteModel.load(os.path.join(SHARED_DATA, "models", "model-austen-copy.safetensors"))
        tensors, _ = safetensors_io.read(os.path.join(SHARED_DATA, "realkv", "rkc-persuasion-window-00.safetensors"))
        text = torch.from_numpy(np.array(tensors["tokens"], dtype=np.int64))
        r = prefix_reuse.run(self.client, model, text, prefix_tokens=128, suffix_tokens=24, dtype="fp32")
        self.assertEqual(r["loaded_a"], 0)
        self.assertEqual(r["loaded_b"], 128)
        self.assertEqual(r["computed_b"], 24)
        self.assertLess(r["max_abs_logit_diff"], 1e-4)
        self.assertTrue(r["same_argmax"])


if __name__ == "__main__":
    unittest.main()
