"""Reads safetensors files with numpy alone (no safetensors package on Debian).

Format: 8-byte little-endian header length N, N bytes of JSON mapping each
tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets from
the first byte after the header), optional "__metadata__" (strings), then the
raw little-endian data. The file is memory-mapped; arrays are read-only views.
"""

import json
import mmap
import os
import struct

import numpy as np

_DTYPES = {
    "F16": np.float16,
    "F32": np.float32,
    "F64": np.float64,
    "I32": np.int32,
    "I64": np.int64,
    "U8": np.uint8,
    "I8": np.int8,
}
_HEADER_BYTES_MAX = 100 << 20


class SafetensorsError(ValueError):
    """A malformed or truncated file; the message names the file and the problem."""


def read(path):
    """Returns (tensors: dict name -> read-only np.ndarray, metadata: dict of str)."""
    with open(path, "rb") as f:
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if len(data) < 8:
        raise SafetensorsError(f"{path}: shorter than the 8-byte header length")
    (header_len,) = struct.unpack("<Q", data[:8])
    if header_len > _HEADER_BYTES_MAX or 8 + header_len > len(data):
        raise SafetensorsError(f"{path}: header length {header_len} exceeds the file")
    try:
        header = json.loads(bytes(data[8 : 8 + header_len]))
    except ValueError as e:
        raise SafetensorsError(f"{path}: header is not JSON: {e}") from None
    metadata = header.pop("__metadata__", {}) or {}
    base = 8 + header_len
    tensors = {}
    for name, spec in header.items():
        dtype = _DTYPES.get(spec.get("dtype"))
        if dtype is None:
            raise SafetensorsError(f"{path}: tensor {name}: unsupported dtype {spec.get('dtype')}")
        shape = [int(s) for s in spec["shape"]]
        begin, end = (int(o) for o in spec["data_offsets"])
        count = int(np.prod(shape)) if shape else 1
        if end - begin != count * np.dtype(dtype).itemsize or base + end > len(data):
            raise SafetensorsError(f"{path}: tensor {name}: data_offsets {begin}..{end} "
                                   f"do not hold shape {shape} or lie outside the file")
        tensors[name] = np.frombuffer(data, dtype=dtype, count=count,
                                      offset=base + begin).reshape(shape)
    return tensors, metadata


def write(path, tensors, metadata=None):
    """Writes tensors (dict name -> np.ndarray of a dtype read() knows, in
    the dict's order) and metadata (values written as strings) to path.

    Written to path + ".tmp" and renamed, so a reader never sees half a file.
    """
    names = {np.dtype(v): k for k, v in _DTYPES.items()}
    header, blobs, offset = {}, [], 0
    for name, array in tensors.items():
        a = np.ascontiguousarray(array)
        if a.dtype not in names:
            raise SafetensorsError(f"{path}: tensor {name}: unsupported dtype {a.dtype}")
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        blobs.append(a.tobytes())
        offset += a.nbytes
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
