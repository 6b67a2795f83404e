"""Python enums of the proto enums of kvtier.v1, for arguments and results.

    client.get_blocks(pid, ids, mode=kvtier.ReturnMode.HANDLES)
    client.list_blocks(tier=kvtier.Tier.NVME)
    kvtier.SelectEntry(ctx, max_blocks=8, scorer=kvtier.Scorer.KEY_KEY, anchor=a)
    [b for b in selection.blocks if b.residency == kvtier.Residency.RESIDENT]

Each is an IntEnum whose members are the proto values without the enum's
prefix (SCORER_KEY_KEY -> Scorer.KEY_KEY, TIER_NVME -> Tier.NVME), with the
same numbers: a member is the int the message field holds, so it compares
equal to a field read from a response (block.residency == Residency.RESIDENT)
and to the generated constants (kvtier_pb2.SCORER_KEY_KEY == Scorer.KEY_KEY).
Turn a field back into a member with the class: Tier(result.tier).

Names as strings ("nvme", "key_key", "handles") are still accepted where the
client took them before, but are deprecated: a typo in a string is only
found when the call runs, a typo in a member by the type checker.
tests/test_package.py checks that these enums and the proto's agree.
"""

from __future__ import annotations

import enum
from typing import TypeVar, cast

from kvtier.errors import invalid_argument


class DType(enum.IntEnum):
    """kvtier.v1.DType: element type of a profile's K and V."""

    UNSPECIFIED = 0
    FP16 = 1
    BF16 = 2
    FP32 = 3


class Tier(enum.IntEnum):
    """kvtier.v1.Tier: where a block lives (REMOTE: where it was served from)."""

    UNSPECIFIED = 0
    DEVICE = 1
    HOST = 2
    NVME = 3
    REMOTE = 4


class ReturnMode(enum.IntEnum):
    """kvtier.v1.ReturnMode of GetBlocks: BYTES (data in the results) or
    HANDLES (promoted into the device arena; UNSPECIFIED = BYTES)."""

    UNSPECIFIED = 0
    BYTES = 1
    HANDLES = 2


class Scorer(enum.IntEnum):
    """kvtier.v1.Scorer of a Select (UNSPECIFIED: the daemon's select.default_scorer)."""

    UNSPECIFIED = 0
    KEY_KEY = 1
    KEY_KEY_WEIGHTED = 2
    QUEST = 3
    ARKVALE = 4
    KEYDIFF = 5
    RECENCY = 6
    RANDOM = 7
    MASS = 8


class Residency(enum.IntEnum):
    """kvtier.v1.Residency of a selected block: RESIDENT (its handle is valid
    now) or PENDING (ask again next step)."""

    UNSPECIFIED = 0
    RESIDENT = 1
    PENDING = 2


class CompactImportance(enum.IntEnum):
    """kvtier.v1.CompactImportance (UNSPECIFIED: KEYDIFF, or SNAPKV with observation queries)."""

    UNSPECIFIED = 0
    KEYDIFF = 1
    SNAPKV = 2


class CompactMerge(enum.IntEnum):
    """kvtier.v1.CompactMerge (UNSPECIFIED = GATED)."""

    UNSPECIFIED = 0
    GATED = 1
    UNIFORM = 2
    NONE = 3


class CompactBias(enum.IntEnum):
    """kvtier.v1.CompactBias (UNSPECIFIED = ATTENTION_RATIO)."""

    UNSPECIFIED = 0
    ATTENTION_RATIO = 1
    NONE = 2


_E = TypeVar("_E", bound=enum.IntEnum)
_P = TypeVar("_P", bound=int)


def to_proto(member: int, proto_enum: type[_P]) -> _P:
    """A member's number (or a number) as the generated enum type a message field declares:
    kvtier_pb2.GetBlocksRequest(mode=to_proto(ReturnMode.HANDLES, kvtier_pb2.ReturnMode)).
    (At run time the field takes the int; the generated stubs type it as
    their own enum class.)"""
    return cast(_P, int(member))


def _key(text: str) -> str:
    return text.upper().replace("_", "").replace("-", "")


def coerce(cls: type[_E], value: _E | int | str, argument: str,
           aliases: dict[str, _E] | None = None) -> _E:
    """A member of cls from a member, its number, or (deprecated) its name:
    case, '_' and '-' ignored, with or without the proto prefix
    ("key_key", "SCORER_KEY_KEY", "KeyKey"). Anything else is
    INVALID_ARGUMENT naming `argument` and listing the members."""
    if isinstance(value, cls):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return cls(value)
        except ValueError:
            pass
    elif isinstance(value, str):
        if aliases and value.lower() in aliases:
            return aliases[value.lower()]
        prefix = _key(_PREFIXES.get(cls.__name__, cls.__name__))
        key = _key(value)
        key = key.removeprefix(prefix) if key != prefix else key
        for member in cls:
            if _key(member.name) == key:
                return member
    known = ", ".join(f"{cls.__name__}.{m.name}" for m in cls)
    raise invalid_argument(argument, f"{value!r} is not a {cls.__name__} ({known})")


# The proto prefix of each enum's value names, where it is not the class name.
_PREFIXES = {"CompactImportance": "COMPACT_IMPORTANCE", "CompactMerge": "COMPACT_MERGE",
             "CompactBias": "COMPACT_BIAS", "ReturnMode": "RETURN_MODE"}

# The proto enum (full name) that each Python enum mirrors.
PROTO_ENUMS: dict[type[enum.IntEnum], str] = {
    DType: "kvtier.v1.DType", Tier: "kvtier.v1.Tier", ReturnMode: "kvtier.v1.ReturnMode",
    Scorer: "kvtier.v1.Scorer", Residency: "kvtier.v1.Residency",
    CompactImportance: "kvtier.v1.CompactImportance", CompactMerge: "kvtier.v1.CompactMerge",
    CompactBias: "kvtier.v1.CompactBias",
}
