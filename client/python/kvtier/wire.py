"""Block messages as protobuf wire format, without copying payloads through messages.

put_blocks_message() joins a PutBlocksRequest's field heads and the caller's
payload buffers in one copy (bytes.join over memoryviews), where building
kvtier_pb2.BlockPut messages and serialising them copies every payload two or
three times. parse_get_blocks_response() reads a GetBlocksResponse where it
lies: each block's data comes back as a memoryview of the received bytes.
Field numbers are those of proto/kvtier/v1/kvtier.proto; tests/test_client.py
checks both against the generated classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from kvtier.profile import Payload

# PutBlocksRequest: profile_id = 1, blocks = 2, durable = 3, retain = 4.
# BlockPut: block_id = 1, data = 2, xxh3 = 4.
_VARINT, _LENGTH = 0, 2


def varint(value: int) -> bytes:
    """The varint encoding of a non-negative integer below 2**64."""
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"varint: {value} is not a uint64")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


def put_blocks_message(profile_id: int, durable: bool, retain: bool,
                       blocks: Iterable[tuple[bytes, Payload, int]]) -> bytes:
    """bytes of a PutBlocksRequest; blocks: (block_id bytes, payload buffer, xxh3 int) triples.

    A payload is any object with the buffer protocol (bytes, a contiguous
    numpy array or memoryview); it is read once, by the join.
    """
    parts: list[bytes | memoryview] = []
    if profile_id:
        parts += [_key(1, _VARINT), varint(profile_id)]
    if durable:
        parts += [_key(3, _VARINT), b"\x01"]
    if retain:
        parts += [_key(4, _VARINT), b"\x01"]
    for block_id, payload, xxh3 in blocks:
        # An array's .data is its buffer (typeshed does not know arrays have one).
        data = payload.data if isinstance(payload, np.ndarray) else memoryview(payload)
        data = data.cast("B") if data.c_contiguous else memoryview(data.tobytes())
        inner: list[bytes] = [_key(1, _LENGTH), varint(len(block_id)), bytes(block_id)]
        if xxh3:
            inner += [_key(4, _VARINT), varint(xxh3)]
        inner += [_key(2, _LENGTH), varint(data.nbytes)]
        head = b"".join(inner)
        parts += [_key(2, _LENGTH), varint(len(head) + data.nbytes), head, data]
    return b"".join(parts)


class WireError(ValueError):
    """Bytes that are not the message they were read as."""


def _read_varint(buf: memoryview, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end:
            raise WireError(f"at byte {pos}: truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if value >= 1 << 64:
                raise WireError(f"at byte {pos}: varint longer than 64 bits")
            return value, pos
        shift += 7
        if shift >= 70:
            raise WireError(f"at byte {pos}: varint longer than 10 bytes")


def _fields(buf: memoryview, pos: int, end: int) -> Iterator[tuple[int, int, Any]]:
    """(field, wire type, value) of a message in buf[pos:end]; value: an int
    (varint), or (start, stop) of a length-delimited or fixed field."""
    while pos < end:
        key, pos = _read_varint(buf, pos, end)
        field, wire_type = key >> 3, key & 7
        value: int | tuple[int, int]
        if field == 0:
            raise WireError(f"at byte {pos}: field number 0")
        if wire_type == _VARINT:
            value, pos = _read_varint(buf, pos, end)
        elif wire_type == _LENGTH:
            length, pos = _read_varint(buf, pos, end)
            if length > end - pos:
                raise WireError(f"at byte {pos}: length {length} runs past the end")
            value, pos = (pos, pos + length), pos + length
        elif wire_type in (1, 5):
            size = 8 if wire_type == 1 else 4
            if size > end - pos:
                raise WireError(f"at byte {pos}: truncated")
            value, pos = (pos, pos + size), pos + size
        else:
            raise WireError(f"at byte {pos}: wire type {wire_type} is not supported")
        yield field, wire_type, value


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


class BlockResultView:
    """One BlockResult of a GetBlocksResponse: block_id, status code and
    message, tier, and data as a memoryview of the received bytes (None when
    the result carried none)."""

    __slots__ = ("block_id", "code", "message", "tier", "data")

    block_id: bytes
    code: int
    message: str
    tier: int
    data: memoryview | None

    def __init__(self) -> None:
        self.block_id, self.code, self.message, self.tier, self.data = b"", 0, "", 0, None


def parse_get_blocks_response(raw: bytes) -> list[BlockResultView]:
    """BlockResultViews of a serialised GetBlocksResponse (raw: bytes)."""
    buf = memoryview(raw).cast("B")
    results: list[BlockResultView] = []
    for field, wire_type, value in _fields(buf, 0, len(buf)):
        if field != 1:
            continue
        if wire_type != _LENGTH:
            raise WireError(f"results: wire type {wire_type}, expected 2")
        r = BlockResultView()
        for f, t, v in _fields(buf, value[0], value[1]):
            if f == 1 and t == _LENGTH:
                r.block_id = bytes(buf[v[0]:v[1]])
            elif f == 2 and t == _LENGTH:
                for sf, st, sv in _fields(buf, v[0], v[1]):
                    if sf == 1 and st == _VARINT:
                        r.code = _int32(sv)
                    elif sf == 2 and st == _LENGTH:
                        r.message = bytes(buf[sv[0]:sv[1]]).decode("utf-8", "replace")
            elif f == 3 and t == _VARINT:
                r.tier = _int32(v)
            elif f == 4 and t == _LENGTH:
                r.data = buf[v[0]:v[1]]
            elif f in (1, 2, 3, 4):
                raise WireError(f"results[{len(results)}]: field {f} has wire type {t}")
        results.append(r)
    return results
