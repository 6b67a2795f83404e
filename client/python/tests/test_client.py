"""Client calls against a real kvtierd over its Unix socket: results, the
daemon's errors as KvTierError, and input refused before anything is sent."""

import unittest

import grpc
import numpy as np
import torch

import kvtier
from kvtier import wire
from kvtier.v1 import kvtier_pb2, types_pb2
from support import DaemonTestCase, ProfileTestCase, random_block, small_profile

INVALID = grpc.StatusCode.INVALID_ARGUMENT


class ProfileTest(DaemonTestCase):
    def test_register_is_idempotent_and_conflicts_are_refused(self):
        a = self.client.register_profile(small_profile("p-idem"))
        b = self.client.register_profile(small_profile("p-idem"))
        self.assertGreater(a.profile_id, 0)
        self.assertEqual(a.profile_id, b.profile_id)
        self.assertEqual(a.block_size_bytes, 2 * 2 * 2 * 16 * 32 * 2)
        with self.assertKvTierError(grpc.StatusCode.ALREADY_EXISTS):
            self.client.register_profile(small_profile("p-idem", head_dim=64))
        got = self.client.get_profile(a.profile_id)
        self.assertEqual(got.profile.name, "p-idem")
        self.assertEqual(got.block_size_bytes, a.block_size_bytes)

    def test_daemon_errors_keep_code_and_message(self):
        with self.assertKvTierError(INVALID, "profile.name"):
            self.client.register_profile(small_profile(""))
        with self.assertKvTierError(grpc.StatusCode.NOT_FOUND):
            self.client.get_profile(987654)

    def test_errors_keep_their_grpc_cause(self):
        with self.assertRaises(kvtier.KvTierError) as cm:
            self.client.get_profile(987654)
        self.assertIsInstance(cm.exception.__cause__, grpc.RpcError)
        self.assertEqual(cm.exception.__cause__.code(), grpc.StatusCode.NOT_FOUND)

    def test_timeouts_mean_what_they_say(self):
        # 0 or a negative timeout is refused, not silently the default.
        for bad in (0, -1.0, float("nan")):
            with self.assertKvTierError(INVALID, "timeout_s"):
                self.client.compact_context(1, 0.5, timeout_s=bad)
        # None is the default (the daemon answers the call itself).
        with self.assertRaises(kvtier.KvTierError) as cm:
            self.client.drop_context_version(987654, b"\0" * 16, 1, timeout_s=None)
        self.assertNotIn("timeout_s", str(cm.exception))
        self.assertIsInstance(cm.exception.__cause__, grpc.RpcError)

    def test_profile_fields_are_checked_and_passed_by_name(self):
        with self.assertKvTierError(INVALID, "profile.head_dim"):
            small_profile(head_dim=0)
        with self.assertKvTierError(INVALID, "dtype"):
            small_profile(dtype="int8")
        with self.assertKvTierError(INVALID, "profile.no_such_field", "ModelProfile has no field"):
            self.client.register_profile(small_profile("p-extra"), no_such_field=1)


class BlockTest(ProfileTestCase):
    profile_name = "blocks"

    def ids(self, name, n):
        return kvtier.chain_hash_sequence(self.pid, list(range(16 * n)), 16, [name])

    def stored_blocks(self):
        counts = self.client.list_blocks(profile_id=self.pid).counts
        return sum(c.blocks for c in counts)

    def test_put_and_get_numpy_torch_and_bytes(self):
        ids = self.ids("roundtrip", 3)
        arrays = [random_block(self.profile, i) for i in range(3)]
        payloads = [arrays[0], torch.from_numpy(arrays[1]), arrays[2].tobytes()]
        resp = self.client.put_blocks(self.pid, zip(ids, payloads))
        self.assertEqual(resp.blocks_stored, 3)
        got = self.client.get_blocks(self.pid, ids).raise_for_status()
        for r, a in zip(got.results, arrays):
            self.assertEqual(r.data, a.tobytes())
        again = self.client.put_blocks(self.pid, [(ids[0], arrays[0])])
        self.assertTrue(again.results[0].existed)

    def test_get_blocks_into_caller_buffers(self):
        ids = self.ids("into", 3)
        arrays = [random_block(self.profile, 20 + i) for i in range(3)]
        self.client.put_blocks(self.pid, zip(ids, arrays))
        size = self.profile.block_size_bytes
        a = np.zeros(self.profile.block_shape, dtype=arrays[0].dtype)
        b = bytearray(size)
        c = torch.zeros(size // 2, dtype=torch.float16)
        missing = bytearray(b"\x5a" * size)
        got = self.client.get_blocks_into(self.pid, ids + [self.ids("into-missing", 1)[0]],
                                          [a, b, c, missing], ids_per_call=2)
        codes = [r.status.code for r in got.results]
        self.assertEqual(codes[:3], [0, 0, 0])
        self.assertEqual(codes[3], grpc.StatusCode.NOT_FOUND.value[0])
        self.assertEqual(a.tobytes(), arrays[0].tobytes())
        self.assertEqual(bytes(b), arrays[1].tobytes())
        self.assertEqual(c.numpy().tobytes(), arrays[2].tobytes())
        self.assertEqual(bytes(missing), b"\x5a" * size, "a missed block's buffer was written")
        self.assertEqual([r.block_id for r in got.results[:3]], ids)
        with self.assertRaises(kvtier.KvTierError) as e:
            got.raise_for_status()
        self.assertEqual(e.exception.index, 3)

    def test_get_blocks_into_refuses_unusable_buffers(self):
        ids = self.ids("into-bad", 2)
        size = self.profile.block_size_bytes
        cases = [([bytearray(size)], "out", "1 buffers for 2"),
                 ([bytearray(size), bytearray(size - 1)], "out[1]", "bytes"),
                 ([bytearray(size), bytes(size)], "out[1]", "writable")]
        for buffers, field, text in cases:
            with self.assertKvTierError(INVALID, field, text):
                self.client.get_blocks_into(self.pid, ids, buffers)
        strided = np.zeros(2 * size, np.uint8)[::2]
        with self.assertKvTierError(INVALID, "out[0]", "contiguous"):
            self.client.get_blocks_into(self.pid, ids[:1], [strided])

    def test_staging_put_stores_the_same_bytes(self):
        ids = self.ids("staging", 2)
        arrays = [random_block(self.profile, 10 + i) for i in range(2)]
        self.client.put_blocks(self.pid, zip(ids, arrays), staging=True)
        got = self.client.get_blocks(self.pid, ids).raise_for_status()
        self.assertEqual([r.data for r in got.results], [a.tobytes() for a in arrays])

    def test_wrong_payloads_are_refused_before_sending(self):
        before = self.stored_blocks()
        good = random_block(self.profile, 1)
        block_id = self.ids("refused", 1)[0]
        cases = [
            (good.astype(np.float32), "blocks[0].data: dtype float32"),
            (good.reshape(-1)[:100], "blocks[0].data: shape (100,)"),
            (good.reshape(2, 2, 2, 32, 16), "blocks[0].data: shape (2, 2, 2, 32, 16)"),
            (torch.from_numpy(good).to(torch.bfloat16), "blocks[0].data: dtype bfloat16"),
            (good.tobytes()[:-2], "blocks[0].data: 8190 bytes"),
            ([1.0, 2.0], "blocks[0].data: expected bytes"),
        ]
        for payload, message in cases:
            with self.subTest(message=message), self.assertKvTierError(INVALID, message):
                self.client.put_blocks(self.pid, [(block_id, payload)])
        # The second item is bad: the first is not stored either.
        with self.assertKvTierError(INVALID, "blocks[1].data"):
            self.client.put_blocks(self.pid, [(block_id, good), (self.ids("refused2", 1)[0], good[0])])
        for bad_id, message in ((b"", "blocks[0].block_id[0]: 0 bytes"),
                                (b"x" * 33, "33 bytes"), ("text", "expected bytes, got str")):
            with self.assertKvTierError(INVALID, message):
                self.client.put_blocks(self.pid, [(bad_id, good)])
        with self.assertKvTierError(INVALID, "profile_id: profile 424242 is not registered"):
            self.client.put_blocks(424242, [(block_id, good)])
        with self.assertKvTierError(INVALID, "blocks: empty"):
            self.client.put_blocks(self.pid, [])
        self.assertEqual(self.stored_blocks(), before)
        self.assertFalse(self.client.lookup(self.pid, [block_id]).entries[0].present)

    def test_different_bytes_under_an_id_raise_the_item(self):
        block_id = self.ids("conflict", 1)[0]
        self.client.put_blocks(self.pid, [(block_id, random_block(self.profile, 1))])
        with self.assertKvTierError(grpc.StatusCode.ALREADY_EXISTS, "blocks[0]") as check:
            self.client.put_blocks(self.pid, [(block_id, random_block(self.profile, 2))])
        self.assertEqual(check.exception.index, 0)
        resp = self.client.put_blocks(self.pid, [(block_id, random_block(self.profile, 2))], check=False)
        self.assertEqual(resp.results[0].status.code, grpc.StatusCode.ALREADY_EXISTS.value[0])

    def test_misses_lookup_and_delete(self):
        ids = self.ids("lookup", 3)
        self.client.put_blocks(self.pid, [(ids[0], random_block(self.profile, 0)),
                                          (ids[1], random_block(self.profile, 1))])
        look = self.client.lookup(self.pid, ids)
        self.assertEqual(look.prefix_blocks, 2)
        self.assertEqual([e.present for e in look.entries], [True, True, False])
        got = self.client.get_blocks(self.pid, ids)
        self.assertEqual(got.results[2].status.code, grpc.StatusCode.NOT_FOUND.value[0])
        with self.assertKvTierError(grpc.StatusCode.NOT_FOUND, "block_ids[2]") as check:
            got.raise_for_status()
        self.assertEqual(check.exception.index, 2)
        self.client.delete_blocks(self.pid, ids[:1])
        self.assertEqual(self.client.lookup(self.pid, ids).prefix_blocks, 0)
        with self.assertKvTierError(grpc.StatusCode.NOT_FOUND, "block_ids[0]"):
            self.client.delete_blocks(self.pid, ids[:1])
        with self.assertKvTierError(INVALID, "mode"):
            self.client.get_blocks(self.pid, ids, mode="copy")

    def test_handles_pin_until_released(self):
        ids = self.ids("handles", 2)
        arrays = [random_block(self.profile, 20 + i) for i in range(2)]
        self.client.put_blocks(self.pid, zip(ids, arrays))
        got = self.client.get_blocks(self.pid, ids, mode="handles").raise_for_status()
        self.assertNotEqual(got.lease_id, 0)
        arena = self.client.arena()
        for r, a in zip(got.results, arrays):
            np.testing.assert_array_equal(arena.view(r.handle, self.profile), a)
        with self.assertKvTierError(grpc.StatusCode.FAILED_PRECONDITION, "pinned"):
            self.client.delete_blocks(self.pid, ids[:1])
        self.assertEqual(self.client.release(lease_id=got.lease_id).blocks_unpinned, 2)
        with self.assertKvTierError(grpc.StatusCode.NOT_FOUND):
            self.client.release(lease_id=got.lease_id)
        with self.assertKvTierError(INVALID, "exactly one"):
            self.client.release()

    def test_bf16_profile_takes_torch_bfloat16(self):
        profile = self.client.register_profile(small_profile("bf16-model", dtype="bf16"))
        tensor = torch.randn(profile.block_shape).to(torch.bfloat16)
        block_id = kvtier.chain_hash(profile.profile_id, b"", list(range(16)))
        self.client.put_blocks(profile.profile_id, [(block_id, tensor)])
        got = self.client.get_blocks(profile.profile_id, [block_id], mode="handles").raise_for_status()
        view = self.client.arena().torch_view(got.results[0].handle, profile)
        self.assertEqual(view.dtype, torch.bfloat16)
        self.assertTrue(torch.equal(view, tensor))
        self.client.release(lease_id=got.lease_id)
        with self.assertKvTierError(INVALID, "dtype float16"):
            self.client.put_blocks(profile.profile_id, [(block_id, tensor.half())])


class AdminTest(DaemonTestCase):
    def test_health_stats_lists_verify_drain(self):
        self.assertEqual(self.client.health(), "SERVING")
        stats = self.client.stats()
        self.assertTrue(stats.version)
        self.assertEqual(len(stats.tiers), 3)
        self.assertEqual(stats.config["tiers.nvme.direct_io"], "false")
        profile = self.client.register_profile(small_profile("admin"))
        ids = kvtier.chain_hash_sequence(profile.profile_id, list(range(32)), 16)
        self.client.put_blocks(profile.profile_id, [(i, random_block(profile, n)) for n, i in enumerate(ids)],
                               durable=True)
        listed = self.client.list_blocks(profile_id=profile.profile_id, limit=10)
        self.assertEqual(sorted(b.block_id for b in listed.blocks), sorted(ids))
        self.assertTrue(all(e.durable for e in self.client.lookup(profile.profile_id, ids).entries))
        with self.assertKvTierError(INVALID, "tier"):
            self.client.list_blocks(tier="disk")
        progress = self.client.verify(profile_id=profile.profile_id)
        self.assertTrue(progress[-1].done)
        self.assertEqual(progress[-1].corrupt_blocks, 0)
        self.assertGreaterEqual(progress[-1].blocks_checked, 2)
        listed_profiles = {p.profile_id: p for p in self.client.list_profiles().profiles}
        self.assertGreaterEqual(listed_profiles[profile.profile_id].blocks, 2)
        self.client.evict(profile.profile_id, ids[:1], tier="host")
        self.assertEqual(self.client.lookup(profile.profile_id, ids[:1]).entries[0].tier,
                         types_pb2.TIER_NVME)
        self.client.evict(profile.profile_id, ids[:1])
        self.assertFalse(self.client.lookup(profile.profile_id, ids[:1]).entries[0].present)
        with self.assertKvTierError(INVALID, "tier"):
            self.client.evict(profile.profile_id, ids[:1], tier="disk")
        self.assertEqual(self.client.drain(tier="device")[-1].blocks_total, 0)
        drained = self.client.drain()
        self.assertEqual(drained[-1].blocks_done, drained[-1].blocks_total)
        self.assertEqual(len(self.client.list_contexts().contexts), 0)


class EnumArgumentTest(ProfileTestCase):
    """kvtier.enums members as arguments; the deprecated strings do the same."""

    profile_name = "enums"

    def test_tiers_and_return_modes(self):
        ids = kvtier.chain_hash_sequence(self.pid, list(range(48)), 16, ["enums"])
        self.client.put_blocks(self.pid, [(i, random_block(self.profile, n)) for n, i in enumerate(ids)],
                               durable=True)
        for member, name in ((kvtier.Tier.HOST, "host"), (kvtier.Tier.NVME, "nvme"), (None, None)):
            typed = self.client.list_blocks(profile_id=self.pid, tier=member, limit=10)
            self.assertEqual(typed, self.client.list_blocks(profile_id=self.pid, tier=name, limit=10))
        self.assertEqual(self.client.list_blocks(profile_id=self.pid, tier=kvtier.Tier.UNSPECIFIED, limit=10),
                         self.client.list_blocks(profile_id=self.pid, limit=10))
        self.client.evict(self.pid, ids[:1], tier=kvtier.Tier.HOST)
        self.assertIs(kvtier.Tier(self.client.lookup(self.pid, ids[:1]).entries[0].tier), kvtier.Tier.NVME)
        got = self.client.get_blocks(self.pid, ids[1:], mode=kvtier.ReturnMode.HANDLES).raise_for_status()
        self.assertNotEqual(got.lease_id, 0)
        self.assertTrue(all(r.HasField("handle") for r in got.results))
        self.client.release(lease_id=got.lease_id)
        data = self.client.get_blocks(self.pid, ids[1:2], mode=kvtier.ReturnMode.BYTES).raise_for_status()
        self.assertEqual(len(data.results[0].data), self.profile.block_size_bytes)
        drained = self.client.drain(tier=kvtier.Tier.DEVICE)
        self.assertEqual(drained[-1].blocks_done, drained[-1].blocks_total)
        for call, text in ((lambda: self.client.drain(tier=kvtier.Tier.HOST), "expected None or one of Tier.DEVICE"),
                           (lambda: self.client.list_blocks(tier=kvtier.Tier.REMOTE), "Tier.NVME"),
                           (lambda: self.client.evict(self.pid, ids[:1], tier="disk"), "is not a Tier"),
                           (lambda: self.client.get_blocks(self.pid, ids, mode=7), "is not a ReturnMode")):
            with self.assertKvTierError(INVALID, text):
                call()

    def test_compaction_choices(self):
        ids = kvtier.chain_hash_sequence(self.pid, list(range(16 * 4)), 16, ["enums-compact"])
        self.client.put_blocks(self.pid, [(i, random_block(self.profile, n)) for n, i in enumerate(ids)])
        ctx = self.client.open_context(self.pid, [ids]).context_id
        resp = self.client.compact_context(ctx, 0.5, importance=kvtier.CompactImportance.KEYDIFF,
                                           merge=kvtier.CompactMerge.UNIFORM, bias=kvtier.CompactBias.NONE)
        self.assertFalse(resp.existed)
        self.assertIs(kvtier.CompactImportance(resp.version.importance), kvtier.CompactImportance.KEYDIFF)
        self.assertIs(kvtier.CompactMerge(resp.version.merge), kvtier.CompactMerge.UNIFORM)
        self.assertIs(kvtier.CompactBias(resp.version.bias), kvtier.CompactBias.NONE)
        # The same choices by their deprecated names: the same version.
        again = self.client.compact_context(ctx, 0.5, importance="keydiff", merge="uniform", bias="none")
        self.assertTrue(again.existed)
        self.assertEqual(again.version.version, resp.version.version)
        with self.assertKvTierError(INVALID, "bias", "is not a CompactBias"):
            self.client.compact_context(ctx, 0.5, bias=kvtier.CompactMerge.UNIFORM.name + "x")
        self.client.close_context(ctx)


class CompactionTest(ProfileTestCase):
    profile_name = "compaction"

    def test_compact_list_and_drop_versions(self):
        ids = kvtier.chain_hash_sequence(self.pid, list(range(16 * 4)), 16, ["compact"])
        self.client.put_blocks(self.pid, [(i, random_block(self.profile, n)) for n, i in enumerate(ids)])
        ctx = self.client.open_context(self.pid, [ids]).context_id
        p = self.profile
        queries = np.ones((p.num_layers, p.num_kv_heads, 2, p.head_dim), dtype=np.float32)
        resp = self.client.compact_context(ctx, 0.5, observation_queries=queries)
        self.assertFalse(resp.existed)
        self.assertEqual(resp.version.version, 1)
        self.assertEqual(resp.version.tokens, 32)
        self.assertEqual(resp.version.importance, kvtier.v1.kvtier_pb2.COMPACT_IMPORTANCE_SNAPKV)
        got = self.client.get_blocks(self.pid, list(resp.version.block_ids)).raise_for_status()
        slots = got.results[0].compacted
        self.assertEqual(len(slots.positions), p.num_layers * p.num_kv_heads * 16)
        self.assertTrue(all(0 <= x < 64 for x in slots.positions))
        again = self.client.compact_context(ctx, 0.5, observation_queries=queries.tolist())
        self.assertTrue(again.existed, "a nested list is the same queries as the array")
        self.client.close_context(ctx)

        versions = self.client.list_context_versions(self.pid, resp.context_key).versions
        self.assertEqual([v.version for v in versions], [0, 1])
        self.assertEqual(list(versions[0].block_ids), ids)
        dropped = self.client.drop_context_version(self.pid, resp.context_key, 0)
        self.assertEqual(dropped.blocks_deleted, 4)
        with self.assertKvTierError(grpc.StatusCode.FAILED_PRECONDITION, "last copy"):
            self.client.drop_context_version(self.pid, resp.context_key, 1)

    def test_bad_arguments_name_the_field(self):
        with self.assertKvTierError(grpc.StatusCode.INVALID_ARGUMENT, "merge"):
            self.client.compact_context(1, 0.5, merge="average")
        with self.assertKvTierError(grpc.StatusCode.INVALID_ARGUMENT, "retention"):
            self.client.compact_context(1, 0.0)
        with self.assertKvTierError(grpc.StatusCode.NOT_FOUND, "context_id"):
            self.client.compact_context(987654321, 0.5)
        with self.assertKvTierError(grpc.StatusCode.NOT_FOUND, "context_key"):
            self.client.list_context_versions(self.pid, b"x" * 16)


class UnreachableTest(unittest.TestCase):
    def test_a_missing_daemon_is_unavailable_naming_the_target(self):
        with kvtier.Client("/tmp/kvtier-no-such-daemon.sock", call_timeout_s=2) as client:
            with self.assertRaises(kvtier.KvTierError) as e:
                client.stats()
        self.assertEqual(e.exception.code, grpc.StatusCode.UNAVAILABLE)
        self.assertIn("unix:/tmp/kvtier-no-such-daemon.sock", e.exception.message)
        self.assertIn("unreachable", e.exception.message)


class WireTest(unittest.TestCase):
    """kvtier.wire writes exactly the PutBlocksRequest the generated class reads."""

    def test_put_blocks_message_parses_as_the_request(self):
        rng = np.random.default_rng(5)
        arr = rng.standard_normal((4, 8)).astype(np.float16)
        strided = memoryview(np.arange(64, dtype=np.uint8))[::2]   # not contiguous
        blocks = [(b"a" * 32, arr, 0), (b"\x00\xff", b"", (1 << 64) - 1), (b"s", strided, 7),
                  (b"big", bytes(range(256)) * 700, 1 << 35)]
        for profile_id, durable, retain in [(1, False, False), ((1 << 64) - 1, True, True)]:
            raw = wire.put_blocks_message(profile_id, durable, retain, blocks)
            req = kvtier_pb2.PutBlocksRequest.FromString(raw)
            self.assertEqual((req.profile_id, req.durable, req.retain), (profile_id, durable, retain))
            self.assertEqual(len(req.blocks), len(blocks))
            for got, (block_id, payload, xxh3) in zip(req.blocks, blocks):
                self.assertEqual(got.block_id, block_id)
                self.assertEqual(got.WhichOneof("source"), "data")
                self.assertEqual(got.data, memoryview(payload).tobytes())
                self.assertEqual(got.xxh3, xxh3)

    def test_get_blocks_response_parses_as_the_generated_class_writes_it(self):
        resp = kvtier_pb2.GetBlocksResponse(lease_id=9, results=[
            kvtier_pb2.BlockResult(block_id=b"a", tier=types_pb2.TIER_HOST, data=bytes(range(200))),
            kvtier_pb2.BlockResult(block_id=b"b", status=types_pb2.ItemStatus(code=5, message="not found: b")),
            kvtier_pb2.BlockResult(block_id=b"c", status=types_pb2.ItemStatus(code=-1),
                                   handle=types_pb2.BlockHandle(offset_bytes=4096)),
        ])
        raw = resp.SerializeToString()
        got = wire.parse_get_blocks_response(raw)
        self.assertEqual([r.block_id for r in got], [b"a", b"b", b"c"])
        self.assertEqual(got[0].tier, types_pb2.TIER_HOST)
        self.assertEqual(bytes(got[0].data), bytes(range(200)))
        self.assertEqual((got[1].code, got[1].message, got[1].data), (5, "not found: b", None))
        self.assertEqual(got[2].code, -1)
        for cut in (1, len(raw) // 2, len(raw) - 1):
            with self.assertRaises(wire.WireError):
                wire.parse_get_blocks_response(raw[:cut])

    def test_varint_refuses_what_is_not_a_uint64(self):
        for bad in (-1, 1 << 64):
            with self.assertRaises(ValueError):
                wire.varint(bad)


if __name__ == "__main__":
    unittest.main()
