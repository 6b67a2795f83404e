"""Tenants: bearer tokens on every call and shared memory handed out as descriptors.

FdPassingTest and TokenMetadataTest run against small in-test servers (a
Unix-socket server speaking the fd protocol with memfds, an in-process gRPC
server recording metadata); TenantDaemonTest against a real kvtierd started
with a tenants file written by kvtierctl.
"""

import concurrent.futures
import fcntl
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import unittest
from unittest import mock

import grpc
import numpy as np

import kvtier
from kvtier import arena as arena_mod
from kvtier._health import health_pb2
from kvtier.fd_passing import fetch_shared_fd
from kvtier.v1 import admin_pb2, admin_pb2_grpc, kvtier_pb2, kvtier_pb2_grpc, types_pb2
from support import kvtierd_path, random_block, small_profile

FILE_BYTES = 64 << 10


def pattern_memfd(seed, sealed=True):
    """A memfd of FILE_BYTES whose byte i is (seed + 7 i) mod 256, and those
    bytes; sealed against resizing as the daemon's staging files are."""
    data = ((seed + 7 * np.arange(FILE_BYTES)) % 256).astype(np.uint8).tobytes()
    fd = os.memfd_create("kvtier-test", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    if sealed:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
    return fd, data


class FakeFdServer:
    """Serves one connection on a Unix socket in a fresh folder: reads the
    request line, then sends `reply` with `fd` attached (the server closes it
    afterwards), or, silent, never answers until the client hangs up."""

    def __init__(self, reply, fd=None, silent=False):
        self.dir = tempfile.mkdtemp(prefix="kvtier-fd-", dir="/tmp")
        self.path = os.path.join(self.dir, "fd.sock")
        self.request = None
        self._accepted = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(1)
        self._thread = threading.Thread(target=self._serve, args=(reply, fd, silent), daemon=True)
        self._thread.start()

    def _serve(self, reply, fd, silent):
        conn, _ = self._listener.accept()
        self._accepted.set()
        with conn:
            data = b""
            while b"\n" not in data:
                chunk = conn.recv(1024)
                if not chunk:
                    break
                data += chunk
            self.request = data.decode()
            if silent:
                while conn.recv(1024):
                    pass
            elif fd is not None:
                socket.send_fds(conn, [reply.encode()], [fd])
            else:
                conn.sendall(reply.encode())
        if fd is not None:
            os.close(fd)

    def close(self):
        if not self._accepted.is_set():  # nobody connected: unblock accept()
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(self.path)
        self._thread.join()
        self._listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_fd_count():
    return len(os.listdir("/proc/self/fd"))


class FdPassingTest(unittest.TestCase):
    def assertCode(self, code, fn, *fragments):
        with self.assertRaises(kvtier.KvTierError) as cm:
            fn()
        self.assertEqual(cm.exception.code, code, cm.exception.message)
        for fragment in fragments:
            self.assertIn(fragment, cm.exception.message)
        return cm.exception

    def test_arena_descriptor_carries_the_file(self):
        memfd, data = pattern_memfd(11)
        with FakeFdServer(f"ok {FILE_BYTES}\n", memfd) as server:
            fd, size = fetch_shared_fd(server.path, "arena", "tok-A_1")
            try:
                self.assertEqual(size, FILE_BYTES)
                self.assertEqual(os.pread(fd, 4, 100), data[100:104])
                self.assertFalse(os.get_inheritable(fd))
            finally:
                os.close(fd)
        self.assertEqual(server.request, "arena tok-A_1\n")

    def test_no_token_is_sent_as_dash(self):
        memfd, _ = pattern_memfd(0)
        with FakeFdServer(f"ok {FILE_BYTES}\n", memfd) as server:
            fd, _ = fetch_shared_fd(server.path, "staging", None)
            os.close(fd)
        self.assertEqual(server.request, "staging -\n")

    def test_error_line_keeps_the_daemons_code_and_message(self):
        with FakeFdServer("error 16 unknown bearer token\n") as server:
            self.assertCode(grpc.StatusCode.UNAUTHENTICATED,
                            lambda: fetch_shared_fd(server.path, "arena", "wrong"),
                            "unknown bearer token", server.path)

    def test_error_line_with_code_zero_is_not_success(self):
        with FakeFdServer("error 0 confused\n") as server:
            self.assertCode(grpc.StatusCode.UNKNOWN, lambda: fetch_shared_fd(server.path, "arena", "t"))

    def test_ok_without_descriptor_is_internal(self):
        with FakeFdServer("ok 4096\n") as server:
            self.assertCode(grpc.StatusCode.INTERNAL, lambda: fetch_shared_fd(server.path, "arena", "t"),
                            "0 descriptors")

    def test_malformed_reply_closes_the_descriptor(self):
        before = open_fd_count()
        memfd, _ = pattern_memfd(0)
        with FakeFdServer("ok 12x\n", memfd) as server:
            self.assertCode(grpc.StatusCode.INTERNAL, lambda: fetch_shared_fd(server.path, "arena", "t"),
                            "malformed size")
        # close() joined the server, which closed its memfd and sockets.
        self.assertEqual(open_fd_count(), before, "the received descriptor leaked")

    def test_eof_without_reply_is_unavailable(self):
        with FakeFdServer("") as server:
            self.assertCode(grpc.StatusCode.UNAVAILABLE, lambda: fetch_shared_fd(server.path, "arena", "t"),
                            "without a reply")

    def test_silent_server_times_out(self):
        with FakeFdServer("", silent=True) as server:
            self.assertCode(grpc.StatusCode.DEADLINE_EXCEEDED,
                            lambda: fetch_shared_fd(server.path, "arena", "t", timeout_s=0.05),
                            "no reply within 0.05 s")

    def test_missing_socket_is_unavailable(self):
        self.assertCode(grpc.StatusCode.UNAVAILABLE,
                        lambda: fetch_shared_fd("/nonexistent/kvtier-fd.sock", "arena", "t"),
                        "/nonexistent/kvtier-fd.sock")

    def test_bad_token_or_kind_is_refused_before_sending(self):
        for token in ("two words", "line\nbreak", "é"):
            error = self.assertCode(grpc.StatusCode.INVALID_ARGUMENT,
                                    lambda: fetch_shared_fd("/nonexistent/x.sock", "arena", token), "token")
            self.assertNotIn(token, error.message)
        self.assertCode(grpc.StatusCode.INVALID_ARGUMENT,
                        lambda: fetch_shared_fd("/nonexistent/x.sock", "device", "t"), "kind")

    def test_shm_arena_maps_read_only_from_the_socket(self):
        memfd, data = pattern_memfd(5)
        info = kvtier_pb2.OpenArenaResponse(arena_id=3, size_bytes=FILE_BYTES)
        with FakeFdServer(f"ok {FILE_BYTES}\n", memfd) as server:
            info.fd_socket_path = server.path
            arena = kvtier.ShmArena(info, token="tok")
        self.assertEqual(server.request, "arena tok\n")
        self.assertEqual(arena.path, f"{server.path} (arena)")
        view = arena.bytes_view(types_pb2.BlockHandle(arena_id=3, offset_bytes=4096, size_bytes=8))
        self.assertEqual(view.tobytes(), data[4096:4104])
        self.assertFalse(view.flags.writeable)

    def test_staging_writes_reach_the_file(self):
        memfd, _ = pattern_memfd(0)
        probe = os.dup(memfd)
        reserved = kvtier_pb2.ReserveSlotsResponse(staging_size_bytes=FILE_BYTES)
        with FakeFdServer(f"ok {FILE_BYTES}\n", memfd) as server:
            reserved.fd_socket_path = server.path
            staging = kvtier.StagingFile.open(reserved, token="tok")
        try:
            payload = np.full(512, 0xA5, dtype=np.uint8)
            staging.write(types_pb2.SlotRef(offset_bytes=8192, size_bytes=512), payload)
            self.assertEqual(os.pread(probe, 512, 8192), payload.tobytes())
        finally:
            os.close(probe)
        self.assertEqual(server.request, "staging tok\n")

    def test_an_unsealed_staging_file_is_refused(self):
        # Anyone else holding it could shrink it under our mapping (SIGBUS).
        memfd, _ = pattern_memfd(0, sealed=False)
        reserved = kvtier_pb2.ReserveSlotsResponse(staging_size_bytes=FILE_BYTES)
        with FakeFdServer(f"ok {FILE_BYTES}\n", memfd) as server:
            reserved.fd_socket_path = server.path
            self.assertCode(grpc.StatusCode.FAILED_PRECONDITION,
                            lambda: kvtier.StagingFile.open(reserved, token="tok"), "not sealed")

    def test_announced_size_must_match_the_response(self):
        memfd, _ = pattern_memfd(0)
        info = kvtier_pb2.OpenArenaResponse(arena_id=1, size_bytes=2 * FILE_BYTES)
        with FakeFdServer(f"ok {FILE_BYTES}\n", memfd) as server:
            info.fd_socket_path = server.path
            self.assertCode(grpc.StatusCode.FAILED_PRECONDITION, lambda: kvtier.ShmArena(info, token="t"),
                            f"announced {FILE_BYTES} bytes")

    def test_a_response_naming_no_file_is_refused(self):
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION,
                        lambda: kvtier.ShmArena(kvtier_pb2.OpenArenaResponse(arena_id=1, size_bytes=1)),
                        "neither shm_path nor fd_socket_path")
        self.assertCode(grpc.StatusCode.FAILED_PRECONDITION,
                        lambda: arena_mod.StagingFile.open(kvtier_pb2.ReserveSlotsResponse()),
                        "neither staging_path nor fd_socket_path")


class _Recorder:
    """Servicers that record each call's authorization metadata by method."""

    def __init__(self):
        self.seen = {}
        self.profile = small_profile("recorded").to_proto()

    def record(self, context, method):
        self.seen[method] = dict(context.invocation_metadata()).get("authorization")


class _KvTier(kvtier_pb2_grpc.KvTierServicer):
    def __init__(self, rec):
        self.rec = rec

    def GetProfile(self, request, context):
        self.rec.record(context, "GetProfile")
        return kvtier_pb2.GetProfileResponse(profile=self.rec.profile)

    def PutBlocks(self, request_iterator, context):
        self.rec.record(context, "PutBlocks")
        # Counted as the daemon does: the client checks it.
        received = sum(1 for _ in request_iterator)
        return kvtier_pb2.PutBlocksResponse(messages_received=received)

    def GetBlocks(self, request, context):
        self.rec.record(context, "GetBlocks")
        yield kvtier_pb2.GetBlocksResponse()

    def Select(self, request_iterator, context):
        self.rec.record(context, "Select")
        for request in request_iterator:
            yield kvtier_pb2.SelectResponse(request_id=request.request_id,
                                            contexts=[kvtier_pb2.ContextSelection()] * len(request.contexts))


class _Admin(admin_pb2_grpc.AdminServicer):
    def __init__(self, rec):
        self.rec = rec

    def Stats(self, request, context):
        self.rec.record(context, "Stats")
        return admin_pb2.StatsResponse(version="fake")

    def Drain(self, request, context):
        self.rec.record(context, "Drain")
        yield admin_pb2.DrainProgress()


class TokenMetadataTest(unittest.TestCase):
    CALLS = ("Health", "Stats", "GetProfile", "PutBlocks", "GetBlocks", "Select", "Drain")

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kvtier-md-", dir="/tmp")
        cls.socket = os.path.join(cls.dir, "fake.sock")
        cls.rec = _Recorder()
        cls.server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4))
        kvtier_pb2_grpc.add_KvTierServicer_to_server(_KvTier(cls.rec), cls.server)
        admin_pb2_grpc.add_AdminServicer_to_server(_Admin(cls.rec), cls.server)

        def check(request, context):
            cls.rec.record(context, "Health")
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

        cls.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
            "Check": grpc.unary_unary_rpc_method_handler(
                check, request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString)})])
        cls.server.add_insecure_port("unix:" + cls.socket)
        cls.server.start()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop(None).wait()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def every_kind_of_call(self, client):
        """Unary, stream-unary, unary-stream and stream-stream calls."""
        self.rec.seen.clear()
        with client:
            self.assertEqual(client.health(), "SERVING")
            client.stats()
            profile = client.profile(5)
            block = random_block(profile, 1).astype(np.float16)
            client.put_blocks(5, [(b"\x01" * 32, block)])
            client.get_blocks(5, [b"\x01" * 32])
            client.select([{"context_id": 1, "max_blocks": 1}])
            client.drain()
        self.assertEqual(sorted(self.rec.seen), sorted(self.CALLS))
        return self.rec.seen

    def test_every_call_carries_the_bearer_token(self):
        seen = self.every_kind_of_call(kvtier.Client(self.socket, token="s3cret-Token_1"))
        for method in self.CALLS:
            self.assertEqual(seen[method], "Bearer s3cret-Token_1", method)

    def test_the_environment_supplies_a_missing_token(self):
        with mock.patch.dict(os.environ, {"KVTIER_TOKEN": "from-env"}):
            seen = self.every_kind_of_call(kvtier.Client(self.socket))
        for method in self.CALLS:
            self.assertEqual(seen[method], "Bearer from-env", method)

    def test_no_token_sends_no_authorization(self):
        with mock.patch.dict(os.environ, {"KVTIER_TOKEN": "from-env"}):
            seen = self.every_kind_of_call(kvtier.Client(self.socket, token=""))
        for method in self.CALLS:
            self.assertIsNone(seen[method], method)

    def test_tokens_that_cannot_be_metadata_are_refused(self):
        for token in ("a b", "a\nb", "x" * 257):
            with self.assertRaises(kvtier.KvTierError) as cm:
                kvtier.Client(self.socket, token=token)
            self.assertEqual(cm.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("token", cm.exception.message)
            self.assertNotIn(token, cm.exception.message)
        with mock.patch.dict(os.environ, {"KVTIER_TOKEN": "bad token"}):
            with self.assertRaises(kvtier.KvTierError) as cm:
                kvtier.Client(self.socket)
        self.assertIn("KVTIER_TOKEN", cm.exception.message)


def kvtierctl_path():
    path = os.environ.get("KVTIERCTL")
    if not path:
        raise RuntimeError("KVTIERCTL is not set: run through ctest, or set it to the built kvtierctl")
    return path


def add_tenant(tenants_file, name, role="data"):
    """`kvtierctl tenants add`; returns the printed token."""
    done = subprocess.run([kvtierctl_path(), "tenants", "add", name, "--file", tenants_file, "--role", role],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip()


class TenantDaemonTest(unittest.TestCase):
    """A kvtierd with two tenants; the class's client is tenant a's."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="kvtier-tenants-", dir="/tmp")
        tenants_file = os.path.join(cls.dir, "tenants.toml")
        cls.token_a = add_tenant(tenants_file, "engine-a")
        cls.token_b = add_tenant(tenants_file, "engine-b")
        settings = {"auth.tenants_file": tenants_file, "auth.tenant_arena_bytes": "8MiB",
                    "auth.tenant_staging_bytes": "2MiB"}
        cls.daemon = kvtier.LocalDaemon(kvtierd_path(), settings=settings, token=cls.token_a).start()
        cls.client = cls.daemon.client()
        cls.profile = cls.client.register_profile(small_profile("tenants"))
        cls.pid = cls.profile.profile_id

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def assertUnauthenticated(self, fn):
        with self.assertRaises(kvtier.KvTierError) as cm:
            fn()
        self.assertEqual(cm.exception.code, grpc.StatusCode.UNAUTHENTICATED, cm.exception.message)

    def test_calls_without_a_valid_token_are_unauthenticated(self):
        with self.daemon.client(token="") as anonymous:
            self.assertUnauthenticated(lambda: anonymous.register_profile(small_profile("anon")))
            self.assertUnauthenticated(lambda: anonymous.get_profile(self.pid))
        with self.daemon.client(token="not-a-tenant-token") as stranger:
            self.assertUnauthenticated(lambda: stranger.register_profile(small_profile("stranger")))

    def test_staging_put_and_arena_handles_go_through_descriptors(self):
        ids = kvtier.chain_hash_sequence(self.pid, list(range(48)), 16, ["zero-copy"])
        blocks = [random_block(self.profile, 20 + i).astype(np.float16) for i in range(3)]
        reserved = self.client.reserve_slots(self.pid, 1)
        self.assertEqual(reserved.staging_path, "", "a tenant's staging file must not be reachable by path")
        self.assertTrue(reserved.fd_socket_path)
        self.assertGreater(reserved.staging_size_bytes, 0)

        resp = self.client.put_blocks(self.pid, zip(ids, blocks), staging=True)
        self.assertEqual(resp.blocks_stored, 3)
        got = self.client.get_blocks(self.pid, ids).raise_for_status()
        for result, block in zip(got.results, blocks):
            np.testing.assert_array_equal(np.frombuffer(result.data, np.float16).reshape(block.shape), block)

        info = self.client.open_arena()
        self.assertEqual(info.shm_path, "", "a tenant's arena must not be reachable by path")
        self.assertTrue(info.fd_socket_path)
        handles = self.client.get_blocks(self.pid, ids, mode="handles").raise_for_status()
        arena = self.client.arena()
        self.assertEqual(arena.path, f"{info.fd_socket_path} (arena)")
        for result, block in zip(handles.results, blocks):
            np.testing.assert_array_equal(arena.view(result.handle, self.profile), block)
        self.client.release(lease_id=handles.lease_id)

    def test_select_stream_carries_the_token(self):
        ids = kvtier.chain_hash_sequence(self.pid, list(range(64)), 16, ["select"])
        self.client.put_blocks(self.pid, [(i, random_block(self.profile, 40 + n).astype(np.float16))
                                          for n, i in enumerate(ids)])
        context = self.client.open_context(self.pid, [ids]).context_id
        answer = self.client.select([{"context_id": context, "max_blocks": 2, "scorer": "recency"}])[0]
        answer.raise_for_status()
        self.assertEqual(len(answer.blocks), 2)
        self.client.close_context(context)

    def test_the_fd_socket_wants_a_tenants_token(self):
        socket_path = self.client.open_arena().fd_socket_path
        for token in (None, "not-a-tenant-token"):
            with self.assertRaises(kvtier.KvTierError) as cm:
                fetch_shared_fd(socket_path, "arena", token)
            self.assertEqual(cm.exception.code, grpc.StatusCode.UNAUTHENTICATED, cm.exception.message)
        fd, size = fetch_shared_fd(socket_path, "staging", self.token_b)
        os.close(fd)
        self.assertGreater(size, 0)


if __name__ == "__main__":
    unittest.main()
