"""Zero-copy views of the daemon's shared-memory files.

ShmArena      the device arena of a daemon without a GPU ("shm-arena"), mapped
              read-only once; a block handle (arena_id, offset_bytes,
              size_bytes, generation) becomes a numpy array or torch tensor
              over the mapped bytes, no copy.
StagingFile   the host tier's staging file, mapped read-write, for the
              zero-copy put path (ReserveSlots -> write the slot -> PutBlocks).

The arena is opened by path (shm_path), or, when the daemon has tenants and
names an fd_socket_path instead, from a descriptor fetched there with the
client's token (kvtier.fd_passing); the staging file always comes from the fd
socket. A staging file must be sealed against resizing (F_SEAL_SHRINK |
F_SEAL_GROW), as the daemon makes it; an unsealed one is refused, since
whoever else holds it could shrink it under the mapping (SIGBUS).

Lifetime: views stay valid while the mapping lives (the mapping keeps the file
alive even when the daemon removes it). A block's bytes are only meaningful
while the daemon's lease on it holds (the Select that returned it, or the
GetBlocks lease). Arena views are read-only: numpy refuses writes; a torch
tensor over the arena does not know it and a write through it kills the
process with SIGSEGV (the pages are mapped PROT_READ).

Thread safety: every method may be called from several threads at once.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import warnings
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import numpy.typing as npt

from kvtier.errors import KvTierError, invalid_argument
from kvtier.fd_passing import fetch_shared_fd

if TYPE_CHECKING:
    import torch

    from kvtier.profile import BlockArray, Payload, Profile
    from kvtier.v1 import kvtier_pb2, types_pb2


_STAGING_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW


def _map_fd(fd: int, size_bytes: int | None, writable: bool, what: str, name: str) -> mmap.mmap:
    """Maps the whole file behind fd (size_bytes None: whatever it holds, if
    not empty); always closes fd (the mapping keeps the file alive). A
    writable file must be sealed against resizing."""
    try:
        if writable:
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                seals = 0
            if seals & _STAGING_SEALS != _STAGING_SEALS:
                raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"{what} {name}: not sealed against resizing "
                                  "(F_SEAL_SHRINK | F_SEAL_GROW); refusing to map it")
        actual = os.fstat(fd).st_size
        if size_bytes is None:
            size_bytes = actual
        if actual != size_bytes or size_bytes == 0:
            raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"{what} {name}: {actual} bytes, the daemon announced {size_bytes}")
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        try:
            return mmap.mmap(fd, size_bytes, flags=mmap.MAP_SHARED, prot=prot)
        except OSError as e:
            raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"{what} {name}: cannot map: {e.strerror}") from e
    finally:
        os.close(fd)


def _map(path: str, size_bytes: int | None, writable: bool, what: str) -> mmap.mmap:
    try:
        fd = os.open(path, (os.O_RDWR if writable else os.O_RDONLY) | os.O_CLOEXEC)
    except OSError as e:
        raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{what} {path}: cannot open: {e.strerror}") from e
    return _map_fd(fd, size_bytes, writable, what, path)


def _map_from_socket(fd_socket_path: str, kind: str, token: str | None, size_bytes: int | None,
                     writable: bool, what: str) -> tuple[mmap.mmap, str]:
    """(mmap, name) of the file the fd socket hands out; size_bytes None takes
    the size the daemon announces there."""
    fd, announced = fetch_shared_fd(fd_socket_path, kind, token)
    name = f"{fd_socket_path} ({kind})"
    if size_bytes is not None and announced != size_bytes:
        os.close(fd)
        raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{what} {name}: the fd socket announced {announced} bytes, "
                          f"the response {size_bytes}")
    return _map_fd(fd, announced, writable, what, name), name


def _torch_from_numpy(arr: npt.NDArray[Any]) -> torch.Tensor:
    import torch

    with warnings.catch_warnings():
        # Read-only mapping: torch warns that it cannot mark the tensor read-only.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(arr)


class ShmArena:
    """The shared-memory device arena described by an OpenArenaResponse: its
    shm_path, or (daemon with tenants) its fd_socket_path, where `token` (the
    client's, None for none) fetches a read-only descriptor. `path` names the
    file or the socket."""

    kind = "shm"

    def __init__(self, info: kvtier_pb2.OpenArenaResponse, token: str | None = None) -> None:
        self.arena_id = int(info.arena_id)
        self.size_bytes = int(info.size_bytes)
        if info.shm_path:
            self.path = info.shm_path
            self._mm = _map(self.path, self.size_bytes, writable=False, what="arena")
        elif info.fd_socket_path:
            self._mm, self.path = _map_from_socket(info.fd_socket_path, "arena", token, self.size_bytes,
                                                   writable=False, what="arena")
        else:
            raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION,
                              "OpenArena: the daemon named neither shm_path nor fd_socket_path")
        self._bytes = np.frombuffer(self._mm, dtype=np.uint8)
        self._flat: dict[np.dtype[Any], npt.NDArray[Any]] = {}   # numpy dtype -> the whole arena as that type
        self._torch: dict[str, torch.Tensor] = {}

    def _range(self, handle: types_pb2.BlockHandle, argument: str) -> tuple[int, int]:
        if int(handle.arena_id) != self.arena_id:
            raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION,
                              f"{argument}: arena_id {handle.arena_id} is not the mapped arena "
                              f"{self.arena_id} (the daemon restarted: reopen the arena)")
        offset, size = int(handle.offset_bytes), int(handle.size_bytes)
        if size <= 0 or offset < 0 or offset + size > self.size_bytes:
            raise invalid_argument(argument, f"range [{offset}, {offset + size}) is empty or outside "
                                   f"the {self.size_bytes}-byte arena")
        return offset, size

    def bytes_view(self, handle: types_pb2.BlockHandle, argument: str = "handle") -> npt.NDArray[np.uint8]:
        """Read-only uint8 array over the handle's bytes."""
        offset, size = self._range(handle, argument)
        return self._bytes[offset : offset + size]

    def view(self, handle: types_pb2.BlockHandle, profile: Profile, argument: str = "handle") -> BlockArray:
        """Read-only numpy array [layers, 2, kv_heads, tokens, head_dim] of the
        profile's dtype (bf16 as uint16 bit patterns) over the block's bytes."""
        offset, size = handle.offset_bytes, handle.size_bytes
        itemsize = profile.itemsize
        if (handle.arena_id != self.arena_id or size != profile.block_size_bytes or offset % itemsize
                or offset + size > self.size_bytes):
            self._range(handle, argument)  # raises the precise error
            raise invalid_argument(argument, f"{size} bytes at {offset}; profile {profile.profile_id} "
                                   f"blocks are {profile.block_size_bytes}, aligned to {itemsize}")
        flat = self._flat.get(profile.numpy_dtype)
        if flat is None:
            flat = self._flat[profile.numpy_dtype] = np.frombuffer(
                self._mm, dtype=profile.numpy_dtype, count=self.size_bytes // itemsize)
        start = offset // itemsize
        return flat[start : start + profile.block_elements].reshape(profile.block_shape)

    def torch_view(self, handle: types_pb2.BlockHandle, profile: Profile, argument: str = "handle") -> torch.Tensor:
        """torch tensor [layers, 2, kv_heads, tokens, head_dim] over the block's
        bytes (CPU, zero-copy, must not be written)."""
        arr = self.view(handle, profile, argument)
        tensor = _torch_from_numpy(arr.view(np.int16) if profile.dtype == "bf16" else arr)
        if profile.dtype == "bf16":
            import torch

            tensor = tensor.view(torch.bfloat16)
        return tensor

    def torch_elements(self, profile: Profile) -> torch.Tensor:
        """The whole arena as one flat torch tensor of the profile's element
        type (zero-copy), for engines that gather many blocks in one indexing
        operation: block h starts at element h.offset_bytes // itemsize."""
        key = profile.dtype
        if key not in self._torch:
            count = self.size_bytes // profile.itemsize
            arr = np.frombuffer(self._mm, dtype=profile.numpy_dtype, count=count)
            tensor = _torch_from_numpy(arr.view(np.int16) if profile.dtype == "bf16" else arr)
            if profile.dtype == "bf16":
                import torch

                tensor = tensor.view(torch.bfloat16)
            self._torch[key] = tensor
        return self._torch[key]

    def element_offset(self, handle: types_pb2.BlockHandle, profile: Profile, argument: str = "handle") -> int:
        """Checked start element of a block inside torch_elements(profile)."""
        offset, size = self._range(handle, argument)
        if size != profile.block_size_bytes or offset % profile.itemsize:
            raise invalid_argument(argument, f"{size} bytes at {offset} is not one aligned block of "
                                   f"profile {profile.profile_id}")
        return offset // profile.itemsize

    def close(self) -> None:
        """Drops this object's references; views already handed out keep the
        mapping alive until they are gone."""
        self._torch.clear()
        self._flat.clear()


class StagingFile:
    """The staging file of ReserveSlots, mapped read-write: by path, or from a
    descriptor the fd socket hands out for `token` (StagingFile.open picks the
    one a ReserveSlotsResponse names). `path` names the file or the socket."""

    def __init__(self, path: str | None = None, *, fd_socket_path: str | None = None, token: str | None = None,
                 size_bytes: int | None = None) -> None:
        if path:
            self.path = path
            try:
                size = os.stat(path).st_size
            except OSError as e:
                raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION,
                                  f"staging file {path}: {e.strerror}") from e
            mm = _map(path, size, writable=True, what="staging file")
        elif fd_socket_path:
            mm, self.path = _map_from_socket(fd_socket_path, "staging", token, size_bytes,
                                             writable=True, what="staging file")
        else:
            raise invalid_argument("path", "give a staging file path or an fd_socket_path")
        self.size_bytes = len(mm)
        self._mm: mmap.mmap | None = mm
        self._bytes: npt.NDArray[np.uint8] | None = np.frombuffer(mm, dtype=np.uint8)

    @classmethod
    def open(cls, reserved: kvtier_pb2.ReserveSlotsResponse, token: str | None = None) -> StagingFile:
        """The staging file a ReserveSlotsResponse names (fd_socket_path of
        staging_size_bytes; a staging_path from an older daemon is tried and
        refused unless sealed)."""
        if reserved.staging_path:
            return cls(reserved.staging_path)
        if reserved.fd_socket_path:
            return cls(fd_socket_path=reserved.fd_socket_path, token=token,
                       size_bytes=int(reserved.staging_size_bytes) or None)
        raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION,
                          "ReserveSlots: the daemon named neither staging_path nor fd_socket_path")

    def close(self) -> None:
        """Unmaps the file (idempotent); write() then raises FAILED_PRECONDITION."""
        mm, self._mm, self._bytes = self._mm, None, None
        if mm is not None:
            mm.close()

    @property
    def closed(self) -> bool:
        return self._mm is None

    def __enter__(self) -> StagingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def write(self, slot: types_pb2.SlotRef, payload: Payload, argument: str = "slot") -> None:
        """Copies a checked payload (see profile.block_payload) into the slot."""
        if self._bytes is None:
            raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION, f"staging file {self.path}: closed")
        offset, size = int(slot.offset_bytes), int(slot.size_bytes)
        src = np.frombuffer(payload, dtype=np.uint8) if not isinstance(payload, np.ndarray) else payload
        if offset + size > self.size_bytes or src.nbytes != size:
            raise invalid_argument(argument, f"slot [{offset}, {offset + size}) does not fit the "
                                   f"{src.nbytes}-byte payload in the {self.size_bytes}-byte file")
        self._bytes[offset : offset + size] = src.reshape(-1).view(np.uint8)
