"""Starts a private kvtierd for tests, examples and notebooks.

    with kvtier.LocalDaemon("build/test/daemon/kvtierd") as daemon:
        client = daemon.client()

The daemon runs in a fresh temporary folder (data, NVMe tier files, socket),
with its shared-memory files (arena, host slab, staging) in a fresh folder of
/dev/shm, small tier capacities and tiers.nvme.direct_io = false (tmpfs has no
O_DIRECT); extra `--set key=value` overrides come from `settings`. Readiness is
exact, not timed: the daemon's sd_notify READY=1 arrives on a private
NOTIFY_SOCKET (sent once it listens), then a health check must answer SERVING.
If the process exits first, KvTierError(UNAVAILABLE) quotes its log.

A daemon with tenants: pass settings={"auth.tenants_file": path} and the
token of one of them; the readiness check and client() then use it (client()
options may still override it, e.g. token="" for a caller without one).

stop() sends SIGTERM and waits; kill() sends SIGKILL (a daemon that goes
away mid-stream). Both folders are removed on exit, also after kill().
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Mapping
import grpc

from kvtier.client import Client
from kvtier.errors import KvTierError

DEFAULT_SETTINGS = {
    "log.level": "warn",
    "tiers.device.capacity_bytes": "32MiB",
    "tiers.host.capacity_bytes": "64MiB",
    "tiers.host.staging_bytes": "4MiB",
    "tiers.nvme.file_count": "1",
    "tiers.nvme.file_size_bytes": "64MiB",
    "tiers.nvme.direct_io": "false",
    "tiers.nvme.io_threads": "1",
    "server.shutdown_grace_ms": "1000",
}


class LocalDaemon:
    def __init__(self, kvtierd: str, settings: Mapping[str, object] | None = None, start_timeout_s: float = 30.0,
                 token: str | None = None) -> None:
        if not os.access(kvtierd, os.X_OK):
            raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION, f"kvtierd: {kvtierd} is not an executable")
        self.kvtierd = kvtierd
        self.settings = dict(DEFAULT_SETTINGS, **(settings or {}))
        self.start_timeout_s = start_timeout_s
        self.token = token
        self.dir: str | None = None
        self.shm_dir: str | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def _folder(self) -> str:
        if self.dir is None:
            raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION, "LocalDaemon: not started, or already closed")
        return self.dir

    @property
    def socket_path(self) -> str:
        """The daemon's socket; FAILED_PRECONDITION before start() and after close()."""
        return os.path.join(self._folder(), "kvtierd.sock")

    @property
    def log_path(self) -> str:
        """The daemon's log file; FAILED_PRECONDITION before start() and after close()."""
        return os.path.join(self._folder(), "kvtierd.log")

    def log(self) -> str:
        """The daemon's log so far; "" when there is none (not started, or closed)."""
        if self.dir is None:
            return ""
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def start(self) -> LocalDaemon:
        # A short folder: socket paths are limited to 107 bytes.
        self.dir = tempfile.mkdtemp(prefix="kvtier-py-", dir="/tmp")
        settings = dict(self.settings)
        if os.access("/dev/shm", os.W_OK):
            self.shm_dir = tempfile.mkdtemp(prefix="kvtier-py-", dir="/dev/shm")
            settings.setdefault("tiers.device.shm_dir", self.shm_dir)
            settings.setdefault("tiers.host.shm_dir", self.shm_dir)
        notify_path = os.path.join(self.dir, "notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        argv = [self.kvtierd, "--data-dir", self.dir, "--socket", self.socket_path]
        for key, value in settings.items():
            argv += ["--set", f"{key}={value}"]
        env = dict(os.environ, NOTIFY_SOCKET=notify_path)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        try:
            self._wait_ready(notify, self.process)
        except BaseException:
            self.kill()
            self._cleanup()
            raise
        finally:
            notify.close()
        return self

    def _wait_ready(self, notify: socket.socket, process: subprocess.Popen[bytes]) -> None:
        pidfd = os.pidfd_open(process.pid)
        try:
            ready, _, _ = select.select([notify, pidfd], [], [], self.start_timeout_s)
            while notify in ready:
                if b"READY=1" in notify.recv(4096):
                    break
                ready, _, _ = select.select([notify, pidfd], [], [], self.start_timeout_s)
            else:
                if pidfd in ready:
                    code = process.wait()
                    raise KvTierError(grpc.StatusCode.UNAVAILABLE,
                                      f"kvtierd exited with {code} before it was ready:\n{self.log()}")
                raise KvTierError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                  f"kvtierd not ready after {self.start_timeout_s} s:\n{self.log()}")
        finally:
            os.close(pidfd)
        # Its own token only, never $KVTIER_TOKEN: readiness must not depend on
        # the caller's environment.
        with Client(self.socket_path, token=self.token or "") as client:
            status = client.health(timeout_s=self.start_timeout_s, wait_for_ready=True)
        if status != "SERVING":
            raise KvTierError(grpc.StatusCode.UNAVAILABLE, f"kvtierd health is {status} after READY=1")

    def client(self, call_timeout_s: float = 10.0, max_message_bytes: int = 64 << 20,
               token: str | None = None) -> Client:
        """A Client of this daemon (arguments as kvtier.Client's); token None
        takes the daemon's token when it has one."""
        if token is None:
            token = self.token
        return Client(self.socket_path, call_timeout_s=call_timeout_s, max_message_bytes=max_message_bytes,
                      token=token)

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return None if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as when the daemon crashes; returns once it is gone."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _cleanup(self) -> None:
        for folder in (self.dir, self.shm_dir):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        self.dir = self.shm_dir = None

    def __enter__(self) -> LocalDaemon:
        return self.start()

    def close(self) -> None:
        """stop(), then removes the folders."""
        self.stop()
        self._cleanup()

    def __exit__(self, *exc: object) -> None:
        self.close()
