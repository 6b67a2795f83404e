"""Reference block ids: the chained content hash of client/chain_hash.h.

    id_0 = chain_hash(profile_id, parent=b"", tokens of block 0, extra_keys)
    id_i = chain_hash(profile_id, parent=id_{i-1}, tokens of block i, extra_keys)

SHA-256 over a domain tag and tagged, length-prefixed fields, byte for byte
what the C++ client computes (tests/test_chain_hash.py checks both on the same
inputs):

    b"kvtier.chain.v1"
    b"P" u64le(8)            u64le(profile_id)
    b"A" u64le(len(parent))  parent bytes
    b"T" u64le(4*n)          n token ids as u32le
    b"X" u64le(k)            k x (u64le(len) bytes)   extra keys, in order
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from typing import SupportsInt

from kvtier.errors import invalid_argument

CHAIN_HASH_BYTES = 32
_DOMAIN = b"kvtier.chain.v1"
_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1


def _field(tag: bytes, data: bytes) -> bytes:
    return tag + struct.pack("<Q", len(data)) + data


def _token_bytes(tokens: Iterable[SupportsInt]) -> bytes:
    try:
        values = [int(t) for t in tokens]
    except (TypeError, ValueError) as e:
        raise invalid_argument("tokens", "expected a sequence of integers") from e
    for i, t in enumerate(values):
        if t < 0 or t > _U32_MAX:
            raise invalid_argument(f"tokens[{i}]", f"{t} is not a 32-bit unsigned token id")
    return struct.pack(f"<{len(values)}I", *values)


def _extra_bytes(extra_keys: Sequence[bytes | bytearray | str]) -> bytes:
    out = [b"X", struct.pack("<Q", len(extra_keys))]
    for i, key in enumerate(extra_keys):
        if isinstance(key, str):
            key = key.encode()
        if not isinstance(key, (bytes, bytearray)):
            raise invalid_argument(f"extra_keys[{i}]", f"expected bytes or str, got {type(key).__name__}")
        out.append(struct.pack("<Q", len(key)) + bytes(key))
    return b"".join(out)


def chain_hash(profile_id: SupportsInt, parent: bytes | bytearray, tokens: Iterable[SupportsInt],
               extra_keys: Iterable[bytes | bytearray | str] = ()) -> bytes:
    """Id (32 bytes) of one block: its tokens, its parent's id (b"" for the first)."""
    if not 0 <= int(profile_id) <= _U64_MAX:
        raise invalid_argument("profile_id", f"{profile_id} is not a 64-bit unsigned integer")
    if not isinstance(parent, (bytes, bytearray)):
        raise invalid_argument("parent", f"expected bytes, got {type(parent).__name__}")
    h = hashlib.sha256(_DOMAIN)
    h.update(_field(b"P", struct.pack("<Q", int(profile_id))))
    h.update(_field(b"A", bytes(parent)))
    h.update(_field(b"T", _token_bytes(tokens)))
    h.update(_extra_bytes(list(extra_keys)))
    return h.digest()


def chain_hash_sequence(profile_id: SupportsInt, tokens: Iterable[SupportsInt], block_size_tokens: SupportsInt,
                        extra_keys: Iterable[bytes | bytearray | str] = (),
                        parent: bytes | bytearray = b"") -> list[bytes]:
    """Ids of consecutive blocks of block_size_tokens tokens; a trailing partial
    block gets no id (it is not finished). `parent` continues an existing chain."""
    if int(block_size_tokens) <= 0:
        raise invalid_argument("block_size_tokens", f"{block_size_tokens} must be positive")
    tokens = [int(t) for t in tokens]
    n = int(block_size_tokens)
    ids = []
    for start in range(0, len(tokens) - n + 1, n):
        parent = chain_hash(profile_id, parent, tokens[start : start + n], extra_keys)
        ids.append(parent)
    return ids
