"""Model profiles and the checks the client runs on block payloads before sending.

A block of a profile holds K and V of every layer and KV head for
block_size_tokens tokens, row-major [layer][k|v][kv_head][token][dim]
(proto/kvtier/v1/types.proto), so its size is

    num_layers * 2 * num_kv_heads * block_size_tokens * head_dim * itemsize.

A payload is accepted as bytes of exactly that size, or as a numpy array /
torch tensor of the profile's dtype that is either flat or shaped exactly
block_shape; anything else is refused with INVALID_ARGUMENT naming the
argument, before any request is sent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, Union

import numpy as np
import numpy.typing as npt

from kvtier.enums import DType, to_proto
from kvtier.errors import invalid_argument
from kvtier.v1 import types_pb2

if TYPE_CHECKING:
    import torch
    from google.protobuf.message import Message

#: Element type of block arrays: float16, bfloat16 as uint16 bit patterns, float32.
BlockScalar: TypeAlias = Union[np.float16, np.uint16, np.float32]
#: A numpy array of a profile's blocks (the dtype is the profile's numpy_dtype).
BlockArray: TypeAlias = npt.NDArray[BlockScalar]
#: A vector of floats: a list, a floating-point numpy array or a torch tensor.
FloatVector: TypeAlias = Union[Sequence[float], npt.NDArray[Union[np.float16, np.float32, np.float64]],
                               "torch.Tensor"]
#: One block's payload: bytes-like of block_size_bytes, or an array / tensor
#: of the profile's dtype, flat or shaped block_shape.
BlockData: TypeAlias = Union[bytes, bytearray, memoryview, npt.NDArray[np.generic], "torch.Tensor"]
#: A checked payload (block_payload's result), ready to be written.
Payload: TypeAlias = Union[bytes, bytearray, memoryview, npt.NDArray[np.uint8]]

# dtype name -> (proto enum, numpy dtype of the payload, torch dtype name)
# bf16 has no numpy dtype: its numpy views are uint16 bit patterns.
DTYPES: dict[str, tuple[DType, np.dtype[BlockScalar], str]] = {
    "fp16": (DType.FP16, np.dtype(np.float16), "float16"),
    "bf16": (DType.BF16, np.dtype(np.uint16), "bfloat16"),
    "fp32": (DType.FP32, np.dtype(np.float32), "float32"),
}
_NAME_BY_ENUM: dict[int, str] = {enum: name for name, (enum, _, _) in DTYPES.items()}


def dtype_name(dtype: object) -> str:
    """'fp16' | 'bf16' | 'fp32' from a name, a DType (or its number), a numpy or torch dtype."""
    if isinstance(dtype, str):
        name = dtype.lower().removeprefix("dtype_")
        aliases = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}
        name = aliases.get(name, name)
        if name in DTYPES:
            return name
        raise invalid_argument("dtype", f"unknown dtype {dtype!r} (fp16, bf16, fp32)")
    if isinstance(dtype, int) and dtype in _NAME_BY_ENUM:
        return _NAME_BY_ENUM[dtype]
    text = str(dtype).removeprefix("torch.")
    if text in ("float16", "bfloat16", "float32"):
        return dtype_name(text)
    raise invalid_argument("dtype", f"unknown dtype {dtype!r} (fp16, bf16, fp32)")


@dataclasses.dataclass(frozen=True)
class Profile:
    """A model's KV shape. profile_id is 0 until the daemon assigned one.

    Derived (read-only attributes): block_shape [layers, 2, kv_heads, tokens,
    head_dim], numpy_dtype, itemsize, block_elements, block_size_bytes.
    """

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size_tokens: int
    dtype: str = "fp16"
    revision: str = ""
    profile_id: int = 0

    if TYPE_CHECKING:
        # Set by __post_init__ (not dataclass fields): declared for type checkers only.
        @property
        def block_shape(self) -> tuple[int, int, int, int, int]: ...
        @property
        def numpy_dtype(self) -> np.dtype[BlockScalar]: ...
        @property
        def itemsize(self) -> int: ...
        @property
        def block_elements(self) -> int: ...
        @property
        def block_size_bytes(self) -> int: ...

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        for field in ("num_layers", "num_kv_heads", "head_dim", "block_size_tokens"):
            value = getattr(self, field)
            if not isinstance(value, (int, np.integer)) or value <= 0:
                raise invalid_argument(f"profile.{field}", f"{value!r} must be a positive integer")
        # Derived once: views of many blocks per step read these.
        shape = (self.num_layers, 2, self.num_kv_heads, self.block_size_tokens, self.head_dim)
        numpy_dtype = DTYPES[self.dtype][1]
        object.__setattr__(self, "block_shape", shape)
        object.__setattr__(self, "numpy_dtype", numpy_dtype)
        object.__setattr__(self, "itemsize", numpy_dtype.itemsize)
        object.__setattr__(self, "block_elements", int(np.prod(shape)))
        object.__setattr__(self, "block_size_bytes", int(np.prod(shape)) * numpy_dtype.itemsize)

    def to_proto(self, **extra_fields: object) -> types_pb2.ModelProfile:
        """ModelProfile message; extra_fields are further ModelProfile fields by name."""
        msg = types_pb2.ModelProfile(
            name=self.name, revision=self.revision, num_layers=self.num_layers,
            num_kv_heads=self.num_kv_heads, head_dim=self.head_dim,
            block_size_tokens=self.block_size_tokens, dtype=to_proto(DTYPES[self.dtype][0], types_pb2.DType))
        set_fields(msg, extra_fields, "profile")
        return msg

    @classmethod
    def from_proto(cls, msg: types_pb2.ModelProfile, profile_id: int = 0) -> Profile:
        return cls(name=msg.name, revision=msg.revision, num_layers=msg.num_layers,
                   num_kv_heads=msg.num_kv_heads, head_dim=msg.head_dim,
                   block_size_tokens=msg.block_size_tokens, dtype=dtype_name(int(msg.dtype)),
                   profile_id=profile_id)


def set_fields(msg: Message, fields: Mapping[str, object], argument: str) -> None:
    """Sets message fields by name from plain Python values (numbers, strings,
    sequences or arrays for repeated fields, dicts for messages). Unknown names
    and wrong types are refused naming `argument.field`."""
    descriptor = msg.DESCRIPTOR
    for name, given in fields.items():
        value: Any = given  # checked by protobuf as it is set
        field = descriptor.fields_by_name.get(name)
        where = f"{argument}.{name}"
        if field is None:
            raise invalid_argument(where, f"{descriptor.full_name} has no field {name!r} in this "
                                   "build's proto (rebuild the Python package after a proto change)")
        try:
            if field.label == field.LABEL_REPEATED:
                target = getattr(msg, name)
                del target[:]
                if field.message_type is not None:
                    for item in value:
                        target.add(**item) if isinstance(item, dict) else target.add().CopyFrom(item)
                elif field.cpp_type == field.CPPTYPE_FLOAT or field.cpp_type == field.CPPTYPE_DOUBLE:
                    target.extend(float_vector(value, where).tolist())
                else:
                    target.extend(value)
            elif field.message_type is not None:
                sub = getattr(msg, name)
                sub.Clear()
                if isinstance(value, dict):
                    set_fields(sub, value, where)
                else:
                    sub.CopyFrom(value)
            else:
                setattr(msg, name, value)
        except (TypeError, ValueError) as e:
            raise invalid_argument(where, str(e)) from e


def float_vector(given: FloatVector | object, argument: str) -> npt.NDArray[np.float32]:
    """A 1-D float32 numpy array from a FloatVector (list, numpy array or
    CPU/GPU torch tensor); refuses anything else, non-float dtypes, other
    ranks, NaN and Inf, naming `argument`."""
    value: Any = given
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch.Tensor
        if not value.is_floating_point():
            raise invalid_argument(argument, f"dtype {value.dtype}, expected a floating-point tensor")
        value = value.detach().float().cpu().numpy()
    elif isinstance(value, np.ndarray) and value.dtype.kind != "f":
        raise invalid_argument(argument, f"dtype {value.dtype}, expected a floating-point array")
    try:
        arr = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise invalid_argument(argument, "expected a vector of numbers") from e
    if arr.ndim != 1:
        raise invalid_argument(argument, f"shape {arr.shape}, expected a 1-D vector")
    if not np.isfinite(arr).all():
        raise invalid_argument(argument, "holds NaN or Inf")
    return arr


def block_payload(given: BlockData, profile: Profile, argument: str) -> Payload:
    """The bytes-like payload of one block after checking it against the profile.

    data: bytes / bytearray / memoryview of block_size_bytes, or a numpy array or
    torch tensor of the profile's dtype, flat or shaped block_shape.
    Returns a contiguous object supporting the buffer protocol.
    """
    data: Any = given
    want = profile.block_size_bytes
    if isinstance(data, (bytes, bytearray, memoryview)):
        size = memoryview(data).nbytes
        if size != want:
            raise invalid_argument(argument, f"{size} bytes; blocks of profile {profile.profile_id} "
                                   f"({profile.name}) are {want} bytes")
        return data
    if hasattr(data, "detach") and hasattr(data, "cpu"):  # torch.Tensor
        got = str(data.dtype).removeprefix("torch.")
        if got != DTYPES[profile.dtype][2]:
            raise invalid_argument(argument, f"dtype {got}; profile {profile.profile_id} "
                                   f"({profile.name}) stores {profile.dtype}")
        tensor = data.detach().cpu().contiguous()
        if profile.dtype == "bf16":
            import torch  # only reached with a torch tensor in hand
            tensor = tensor.view(torch.int16)
        arr: npt.NDArray[np.generic] = tensor.numpy()
        shape = tuple(tensor.shape)
    elif isinstance(data, np.ndarray):
        if data.dtype != profile.numpy_dtype:
            raise invalid_argument(argument, f"dtype {data.dtype}; profile {profile.profile_id} "
                                   f"({profile.name}) stores {profile.dtype} "
                                   f"(numpy {profile.numpy_dtype})")
        arr = np.ascontiguousarray(data)
        shape = data.shape
    else:
        raise invalid_argument(argument, f"expected bytes, a numpy array or a torch tensor, "
                               f"got {type(data).__name__}")
    if arr.nbytes != want or (len(shape) != 1 and tuple(shape) != profile.block_shape):
        raise invalid_argument(argument, f"shape {tuple(shape)} ({arr.nbytes} bytes); profile "
                               f"{profile.profile_id} ({profile.name}) blocks are "
                               f"{list(profile.block_shape)} {profile.dtype} = {want} bytes")
    return arr.reshape(-1).view(np.uint8)
