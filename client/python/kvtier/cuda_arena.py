"""Zero-copy torch views of the daemon's CUDA arena (a daemon with a GPU).

OpenArena then returns a cudaIpcMemHandle_t (64 bytes) and the 16-byte UUID of
the device holding the arena. CudaArena finds the local device with that UUID
(CUDA driver API, cuDeviceGetUuid), opens the handle there once with
cudaIpcOpenMemHandle (CUDA runtime, loaded with ctypes) and turns block handles
into torch CUDA tensors through __cuda_array_interface__, without a copy.
Needs torch with CUDA (torch.cuda.is_available()); the CUDA runtime library is
found next to torch, in the nvidia-* wheels, or on the loader path.

Lifetime: close() unmaps (cudaIpcMemHandle is closed); tensors handed out
become invalid then. A process cannot open a handle it exported itself.
Thread safety: views may be taken from several threads at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from typing import TYPE_CHECKING, NoReturn

import grpc

from kvtier.errors import KvTierError, invalid_argument

if TYPE_CHECKING:
    import torch

    from kvtier.profile import Profile
    from kvtier.v1 import kvtier_pb2, types_pb2

_IPC_HANDLE_BYTES = 64
_UUID_BYTES = 16
_LAZY_ENABLE_PEER_ACCESS = 1
_TYPESTR = {"fp16": "<f2", "bf16": "<u2", "fp32": "<f4"}


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * _IPC_HANDLE_BYTES)]


def _precondition(message: str) -> KvTierError:
    return KvTierError(grpc.StatusCode.FAILED_PRECONDITION, f"CUDA arena: {message}")


def _load_library(names: list[str], patterns: list[str]) -> ctypes.CDLL | None:
    candidates: list[str | None] = [ctypes.util.find_library(n) for n in names]
    import torch

    roots = [os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(torch.__file__))]
    for root in roots:
        for pattern in patterns:
            candidates += sorted(glob.glob(os.path.join(root, pattern)))
    for path in candidates:
        if not path:
            continue
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


def _device_ordinal(uuid: bytes) -> int:
    """Local CUDA ordinal of the device whose 16-byte UUID is `uuid`."""
    libcuda = _load_library(["cuda"], ["lib/libcuda.so*"])
    if libcuda is None:
        raise _precondition("libcuda (the CUDA driver) is not loadable")
    if libcuda.cuInit(0) != 0:
        raise _precondition("cuInit failed")
    count = ctypes.c_int()
    libcuda.cuDeviceGetCount(ctypes.byref(count))
    for ordinal in range(count.value):
        dev = ctypes.c_int()
        raw = (ctypes.c_char * _UUID_BYTES)()
        if libcuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
            continue
        if libcuda.cuDeviceGetUuid(raw, dev) == 0 and bytes(raw) == uuid:
            return ordinal
    raise _precondition(f"no visible device has UUID {uuid.hex()} (hidden by CUDA_VISIBLE_DEVICES?)")


class CudaArena:
    """The CUDA device arena described by an OpenArenaResponse."""

    kind = "cuda"

    def __init__(self, info: kvtier_pb2.OpenArenaResponse) -> None:
        import torch

        if not torch.cuda.is_available():
            raise _precondition("the daemon exports a CUDA arena but torch.cuda is not available here")
        handle, uuid = bytes(info.cuda_ipc_handle), bytes(info.device_uuid)
        if len(handle) != _IPC_HANDLE_BYTES:
            raise invalid_argument("cuda_ipc_handle", f"{len(handle)} bytes, expected {_IPC_HANDLE_BYTES}")
        if len(uuid) != _UUID_BYTES:
            raise invalid_argument("device_uuid", f"{len(uuid)} bytes, expected {_UUID_BYTES}")
        self.arena_id = int(info.arena_id)
        self.size_bytes = int(info.size_bytes)
        self.device_ordinal = _device_ordinal(uuid)
        self.device = torch.device("cuda", self.device_ordinal)
        cudart = _load_library(["cudart"], ["lib/libcudart*.so*", "nvidia/cuda_runtime/lib/libcudart.so*"])
        if cudart is None:
            raise _precondition("libcudart (the CUDA runtime) is not loadable")
        self._cudart = cudart
        torch.cuda.init()
        with torch.cuda.device(self.device):
            torch.empty(1, device=self.device)  # makes the primary context current
            ptr = ctypes.c_void_p()
            ipc = _IpcHandle()
            ctypes.memmove(ipc.reserved, handle, _IPC_HANDLE_BYTES)
            self._cudart.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p), _IpcHandle,
                                                         ctypes.c_uint]
            err = self._cudart.cudaIpcOpenMemHandle(ctypes.byref(ptr), ipc, _LAZY_ENABLE_PEER_ACCESS)
        if err != 0:
            raise _precondition(f"cudaIpcOpenMemHandle failed with cudaError {err}")
        self._base: int | None = ptr.value

    def _range(self, handle: types_pb2.BlockHandle, argument: str) -> tuple[int, int, int]:
        """(offset, size, arena base address) of a checked handle; the base is
        read once, so a close() from another thread cannot make it None here."""
        if int(handle.arena_id) != self.arena_id:
            raise _precondition(f"{argument}: arena_id {handle.arena_id} is not the opened arena "
                                f"{self.arena_id} (the daemon restarted: reopen the arena)")
        offset, size, base = int(handle.offset_bytes), int(handle.size_bytes), self._base
        if base is None:
            raise _precondition("the arena was closed")
        if size <= 0 or offset < 0 or offset + size > self.size_bytes:
            raise invalid_argument(argument, f"range [{offset}, {offset + size}) is empty or outside "
                                   f"the {self.size_bytes}-byte arena")
        return offset, size, base

    def torch_view(self, handle: types_pb2.BlockHandle, profile: Profile, argument: str = "handle") -> torch.Tensor:
        """CUDA tensor [layers, 2, kv_heads, tokens, head_dim] over the block."""
        import torch

        offset, size, base = self._range(handle, argument)
        if size != profile.block_size_bytes:
            raise invalid_argument(argument, f"{size} bytes; profile {profile.profile_id} blocks "
                                   f"are {profile.block_size_bytes}")

        class _View:
            __cuda_array_interface__ = {
                "shape": tuple(profile.block_shape), "typestr": _TYPESTR[profile.dtype],
                "data": (base + offset, True), "version": 2, "strides": None}

        tensor = torch.as_tensor(_View(), device=self.device)
        return tensor.view(torch.bfloat16) if profile.dtype == "bf16" else tensor

    def view(self, handle: types_pb2.BlockHandle, profile: Profile, argument: str = "handle") -> NoReturn:
        raise _precondition("numpy cannot view device memory; use torch_view")

    def close(self) -> None:
        if self._base is not None:
            self._cudart.cudaIpcCloseMemHandle(ctypes.c_void_p(self._base))
            self._base = None
