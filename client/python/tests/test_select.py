"""Contexts and streamed Select sessions against a real kvtierd."""

import unittest

import grpc
import numpy as np

import kvtier
from kvtier.v1 import kvtier_pb2
from support import ProfileTestCase, kvtierd_path, small_profile

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def keyed_block(profile, mean_key, seed):
    """A payload whose every key is mean_key plus a little noise (v_b ~ mean_key)."""
    rng = np.random.default_rng(seed)
    block = rng.standard_normal(profile.block_shape).astype(np.float32)
    block[:, 0] = mean_key + 0.02 * rng.standard_normal(block[:, 0].shape)
    return block.astype(np.float16)


class SelectTest(ProfileTestCase):
    profile_name = "select"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        rng = np.random.default_rng(7)
        cls.keys = rng.standard_normal((12, cls.profile.head_dim)).astype(np.float32)
        cls.keys /= np.linalg.norm(cls.keys, axis=1, keepdims=True)

    def make_context(self, name, n=12):
        ids = kvtier.chain_hash_sequence(self.pid, list(range(16 * n)), 16, [name])
        blocks = [keyed_block(self.profile, self.keys[i % 12], i) for i in range(n)]
        self.client.put_blocks(self.pid, zip(ids, blocks))
        ctx = self.client.open_context(self.pid, [ids])
        self.assertEqual(ctx.num_blocks, n)
        return ctx.context_id, ids, blocks

    def test_batched_contexts_answer_in_order_with_readable_handles(self):
        contexts = [self.make_context(f"batch-{i}") for i in range(3)]
        arena = self.client.arena()
        with self.client.select_session() as session:
            entries = [{"context_id": c, "anchor": self.keys[5], "max_blocks": 4, "scorer": "recency"}
                       for c, _, _ in contexts]
            answers = session.select(entries)
        self.assertEqual([a.context_id for a in answers], [c for c, _, _ in contexts])
        for answer, (_, ids, blocks) in zip(answers, contexts):
            answer.raise_for_status()
            positions = [b.position for b in answer.blocks]
            self.assertEqual(positions, [0, 9, 10, 11])  # sink, then the most recent blocks
            for b in answer.resident():
                self.assertEqual(b.block_id, ids[b.position])
                np.testing.assert_array_equal(arena.view(b.handle, self.profile), blocks[b.position])
                self.assertTrue(np.array_equal(arena.torch_view(b.handle, self.profile).numpy(),
                                               blocks[b.position]))

    def test_key_key_follows_the_anchor(self):
        context, _, _ = self.make_context("keykey")
        with self.client.select_session() as session:
            for target in (3, 6):
                answer = session.select([{"context_id": context, "anchor": self.keys[target],
                                          "max_blocks": 3, "scorer": kvtier_pb2.SCORER_KEY_KEY}])[0]
                answer.raise_for_status()
                self.assertEqual([b.position for b in answer.blocks], [0, target, 11])

    def test_select_entries_and_enums(self):
        # SelectEntry and the Scorer enum select what the dict and the
        # deprecated name select; answers in the order sent, mixed kinds.
        (context, _, blocks), (other, _, _), (third, _, _) = [self.make_context(f"typed-{i}") for i in range(3)]
        arena = self.client.arena()
        typed = kvtier.SelectEntry(context, max_blocks=3, anchor=self.keys[6], scorer=kvtier.Scorer.KEY_KEY)
        named = {"context_id": other, "anchor": self.keys[6], "max_blocks": 3, "scorer": "key_key"}
        recency = kvtier.SelectEntry(third, max_blocks=4, scorer=kvtier.Scorer.RECENCY)
        with self.client.select_session() as session:
            answers = session.select([typed, named, recency])
        for answer in answers:
            answer.raise_for_status()
        self.assertEqual([b.position for b in answers[0].blocks], [0, 6, 11])
        self.assertEqual([b.position for b in answers[1].blocks], [0, 6, 11])
        self.assertEqual([b.position for b in answers[2].blocks], [0, 9, 10, 11])
        resident = answers[0].resident()
        self.assertTrue(resident)
        for b in answers[0].blocks:
            self.assertIn(kvtier.Residency(b.residency), (kvtier.Residency.RESIDENT, kvtier.Residency.PENDING))
            self.assertEqual(b in resident, kvtier.Residency(b.residency) is kvtier.Residency.RESIDENT)
        for b in resident:
            np.testing.assert_array_equal(arena.view(b.handle, self.profile), blocks[b.position])
        self.assertEqual(self.client.select([typed])[0].context_id, context)

    def test_one_step_ahead_and_appended_blocks(self):
        context, ids, _ = self.make_context("ahead", n=4)
        with self.client.select_session() as session:
            entry = {"context_id": context, "anchor": self.keys[0], "max_blocks": 2, "scorer": "recency"}
            first = session.send([entry])
            # The daemon answers requests in order, but the append below goes
            # over another call: wait for the first answer so it is known to
            # precede the append (otherwise the two race).
            first_blocks = [b.position for b in first.result(10)[0].blocks]
            new_id = kvtier.chain_hash(self.pid, ids[-1], list(range(16)), ["ahead"])
            self.client.put_blocks(self.pid, [(new_id, keyed_block(self.profile, self.keys[4], 99))])
            self.assertEqual(self.client.append_blocks(context, [new_id]).num_blocks, 5)
            second = session.send([entry])
            self.assertEqual(first_blocks, [0, 3])
            self.assertEqual([b.position for b in second.result(10)[0].blocks], [0, 4])
            self.assertGreater(second.request_id, first.request_id)

    def test_bad_entries_are_refused_before_sending(self):
        context, _, _ = self.make_context("refuse", n=4)
        good = {"context_id": context, "anchor": self.keys[0], "max_blocks": 2}
        cases = [
            (dict(good, anchor=self.keys[0][:31]), "contexts[1].anchor: 31 floats"),
            (dict(good, anchor=np.arange(32)), "contexts[1].anchor: dtype int64"),
            (dict(good, anchor=np.full(32, np.nan, np.float32)), "contexts[1].anchor: holds NaN"),
            (dict(good, anchor=self.keys[:2]), "contexts[1].anchor: shape (2, 32)"),
            (dict(good, scorer="best"), "contexts[1].scorer: 'best' is not a Scorer (Scorer.UNSPECIFIED"),
            (kvtier.SelectEntry(context, max_blocks=2, scorer=42), "contexts[1].scorer: 42 is not a Scorer"),
            (kvtier.SelectEntry(context, max_blocks=2, anchor=self.keys[0][:31]), "contexts[1].anchor: 31 floats"),
            (dict(good, no_such_field=[1.0]), "contexts[1].no_such_field: kvtier.v1.ContextSelect has no field"),
            (dict(good, max_tokens=32), "contexts[1]: give one budget"),
            ({"anchor": self.keys[0]}, "contexts[1].context_id: missing"),
        ]
        with self.client.select_session() as session:
            for bad, message in cases:
                with self.subTest(message=message), self.assertKvTierError(INVALID, message):
                    session.send([good, bad])
            with self.assertKvTierError(INVALID, "contexts: empty"):
                session.send([])
            # Nothing was sent: the stream answers the next request as its first.
            pending = session.send([good])
            self.assertEqual(pending.request_id, 1)
            self.assertTrue(pending.result(10)[0].ok)

    def test_anchor_lengths_follow_the_daemons_layouts(self):
        context, _, _ = self.make_context("lengths", n=4)
        layers, heads, dim = 2, 2, 32
        with self.client.select_session() as session:
            # Per layer passes the client; the daemon decides (it needs
            # index.summary_per_layer), and names the sizes when it refuses.
            answer = session.select([{"context_id": context, "anchor": np.ones(layers * dim, np.float32),
                                      "max_blocks": 2, "scorer": "key_key"}])[0]
            self.assertTrue(answer.ok or answer.error.code == INVALID, answer.error)
            # Per (layer, KV head) is no daemon layout: refused before sending.
            with self.assertKvTierError(INVALID, "contexts[0].anchor: 128 floats"):
                session.send([{"context_id": context, "anchor": np.ones(layers * heads * dim, np.float32),
                               "max_blocks": 2, "scorer": "key_key"}])

    def test_fields_of_a_newer_proto_pass_by_name(self):
        fields = kvtier_pb2.ContextSelect.DESCRIPTOR.fields_by_name
        if "head_queries" not in fields:
            self.skipTest("this build's proto has no ContextSelect.head_queries")
        queries = np.arange(2 * 32, dtype=np.float32)
        msg = kvtier.select.build_entry({"context_id": 1, "anchor": self.keys[0], "max_blocks": 3,
                                         "head_queries": queries}, 0, {})
        self.assertEqual(list(msg.head_queries), queries.tolist())
        with self.assertKvTierError(INVALID, "contexts[0].head_queries: holds NaN"):
            kvtier.select.build_entry({"context_id": 1, "head_queries": [float("nan")]}, 0, {})

    def test_one_bad_context_fails_only_its_entry(self):
        context, _, _ = self.make_context("mixed", n=4)
        entries = [{"context_id": context, "anchor": self.keys[0], "max_blocks": 2},
                   {"context_id": 123456789, "anchor": self.keys[0], "max_blocks": 2},
                   {"context_id": context + 0, "anchor": self.keys[0], "max_blocks": 1000000}]
        with self.client.select_session() as session:
            answers = session.select(entries[:2])
            self.assertTrue(answers[0].ok)
            self.assertEqual(answers[1].error.code, grpc.StatusCode.NOT_FOUND)
            self.assertIn("contexts[1]", answers[1].error.message)
            with self.assertKvTierError(grpc.StatusCode.NOT_FOUND, "contexts[1]"):
                answers[1].raise_for_status()
            bad_budget = session.select(entries[2:])[0]
            self.assertEqual(bad_budget.error.code, INVALID)
            self.assertTrue(session.select(entries[:1])[0].ok)  # the stream survived
        self.client.close_context(context)
        closed = self.client.select(entries[:1])[0]
        self.assertEqual(closed.error.code, grpc.StatusCode.NOT_FOUND)

    def test_release_unpins_the_context_set(self):
        context, _, _ = self.make_context("release", n=4)
        self.client.select([{"context_id": context, "anchor": self.keys[0], "max_blocks": 3}])
        self.assertEqual(self.client.release(context_id=context).blocks_unpinned, 3)
        listed = {c.context_id: c for c in self.client.list_contexts().contexts}
        self.assertEqual(listed[context].pinned_blocks, 0)


class DaemonGoneTest(unittest.TestCase):
    def test_a_daemon_that_dies_mid_stream_raises_unavailable(self):
        daemon = kvtier.LocalDaemon(kvtierd_path()).start()
        try:
            client = daemon.client()
            profile = client.register_profile(small_profile("gone"))
            ids = kvtier.chain_hash_sequence(profile.profile_id, list(range(64)), 16)
            client.put_blocks(profile.profile_id, [(i, np.zeros(profile.block_shape, np.float16) + n)
                                                   for n, i in enumerate(ids)])
            context = client.open_context(profile.profile_id, [ids]).context_id
            entry = {"context_id": context, "anchor": np.ones(32, np.float32), "max_blocks": 2}
            session = client.select_session()
            self.assertTrue(session.select([entry], timeout_s=10)[0].ok)
            daemon.kill()
            with self.assertRaises(kvtier.KvTierError) as e:
                session.select([entry], timeout_s=10)
            self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)
            self.assertIn("Select stream", e.exception.message)
            self.assertIn("went away", e.exception.message)
            self.assertIs(session.broken.code, grpc.StatusCode.UNAVAILABLE)
            with self.assertRaises(kvtier.KvTierError):
                session.send([entry])
            session.close()
            client.close()
        finally:
            daemon.close()


if __name__ == "__main__":
    unittest.main()
