"""Zero-copy views of the daemon's arena: same bytes, same memory, checked handles."""

import fcntl
import os
import unittest

import grpc
import numpy as np
import torch

import kvtier
from kvtier.v1 import types_pb2
from support import DaemonTestCase, random_block, small_profile


class ShmArenaTest(DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.profile = cls.client.register_profile(small_profile("arena"))
        cls.ids = kvtier.chain_hash_sequence(cls.profile.profile_id, list(range(48)), 16)
        cls.blocks = [random_block(cls.profile, i) for i in range(3)]
        cls.client.put_blocks(cls.profile.profile_id, zip(cls.ids, cls.blocks))
        got = cls.client.get_blocks(cls.profile.profile_id, cls.ids, mode="handles").raise_for_status()
        cls.handles = [r.handle for r in got.results]
        cls.arena = cls.client.arena()

    def test_views_are_the_arena_memory_not_copies(self):
        self.assertIsInstance(self.arena, kvtier.ShmArena)
        base = self.arena.bytes_view(types_pb2.BlockHandle(
            arena_id=self.arena.arena_id, offset_bytes=0, size_bytes=1)).__array_interface__["data"][0]
        for handle, block in zip(self.handles, self.blocks):
            view = self.arena.view(handle, self.profile)
            self.assertEqual(view.shape, self.profile.block_shape)
            self.assertEqual(view.dtype, np.float16)
            np.testing.assert_array_equal(view, block)
            address = view.__array_interface__["data"][0]
            self.assertEqual(address, base + handle.offset_bytes)
            self.assertEqual(self.arena.torch_view(handle, self.profile).data_ptr(), address)
            flat = self.arena.torch_elements(self.profile)
            start = self.arena.element_offset(handle, self.profile)
            self.assertEqual(flat[start:].data_ptr(), address)

    def test_numpy_views_are_read_only(self):
        view = self.arena.view(self.handles[0], self.profile)
        self.assertFalse(view.flags.writeable)
        with self.assertRaises(ValueError):
            view[0, 0, 0, 0, 0] = 1

    def test_foreign_and_out_of_range_handles_are_refused(self):
        h = self.handles[0]
        stale = types_pb2.BlockHandle(arena_id=h.arena_id + 1, offset_bytes=h.offset_bytes,
                                      size_bytes=h.size_bytes)
        with self.assertKvTierError(grpc.StatusCode.FAILED_PRECONDITION, "reopen the arena"):
            self.arena.view(stale, self.profile)
        outside = types_pb2.BlockHandle(arena_id=h.arena_id, offset_bytes=self.arena.size_bytes - 10,
                                        size_bytes=h.size_bytes)
        with self.assertKvTierError(grpc.StatusCode.INVALID_ARGUMENT, "outside"):
            self.arena.view(outside, self.profile)
        other = small_profile("arena-other", head_dim=64)
        with self.assertKvTierError(grpc.StatusCode.INVALID_ARGUMENT, "handle: 8192 bytes at 0; profile 0 blocks are 16384"):
            self.arena.view(h, other)


class StagingFileTest(unittest.TestCase):
    def test_closes_and_refuses_writes_after(self):
        # A sealed memfd, as the daemon hands out (StagingFile maps no other).
        fd = os.memfd_create("staging-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        self.addCleanup(os.close, fd)
        os.ftruncate(fd, 64)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        path = f"/proc/self/fd/{fd}"
        slot = types_pb2.SlotRef(offset_bytes=16, size_bytes=8)
        with kvtier.StagingFile(path) as staging:
            staging.write(slot, b"abcdefgh")
            self.assertFalse(staging.closed)
        self.assertTrue(staging.closed)
        staging.close()  # idempotent
        self.assertEqual(os.pread(fd, 8, 16), b"abcdefgh")
        with self.assertRaises(kvtier.KvTierError) as cm:
            staging.write(slot, b"abcdefgh")
        self.assertEqual(cm.exception.code, grpc.StatusCode.FAILED_PRECONDITION)


class CudaArenaTest(DaemonTestCase):
    def test_cuda_views_when_the_daemon_exports_a_cuda_arena(self):
        info = self.client.open_arena()
        if not info.cuda_ipc_handle:
            self.skipTest("the daemon runs the shared-memory arena (no GPU)")
        if not torch.cuda.is_available():
            self.skipTest("torch.cuda is not available")
        profile = self.client.register_profile(small_profile("cuda-arena"))
        block_id = kvtier.chain_hash(profile.profile_id, b"", list(range(16)))
        block = random_block(profile, 3)
        self.client.put_blocks(profile.profile_id, [(block_id, block)])
        got = self.client.get_blocks(profile.profile_id, [block_id], mode="handles").raise_for_status()
        arena = self.client.arena()
        self.assertEqual(arena.kind, "cuda")
        view = arena.torch_view(got.results[0].handle, profile)
        self.assertEqual(view.device.type, "cuda")
        self.assertTrue(torch.equal(view.cpu(), torch.from_numpy(block)))


if __name__ == "__main__":
    unittest.main()
