"""Python client of kvtierd, the KV-cache storage daemon (gRPC over a Unix socket).

    import kvtier
    client = kvtier.Client("./var/kvtier/kvtierd.sock")
    print(client.health(), client.stats().version)
    blocks = client.list_blocks(tier=kvtier.Tier.NVME).blocks
    with client.select_session() as session:
        answers = session.select([kvtier.SelectEntry(ctx, max_blocks=8, scorer=kvtier.Scorer.RECENCY)])

Modules: client (Client, every RPC), profile (Profile, payload checks),
select (streamed Select sessions, SelectEntry), enums (Tier, ReturnMode,
Scorer, Residency, DType, CompactImportance/Merge/Bias: the proto enums as
IntEnums), arena / cuda_arena (zero-copy block views), fd_passing (the arena
and staging descriptors of a daemon with tenants), chain_hash (reference
block ids), connector (a vLLM KV-connector-shaped adapter), errors
(KvTierError). Generated modules: kvtier.v1.*_pb2 (messages; typed by the
*_pb2.pyi stubs generated with them) and *_pb2_grpc.

Typing: the package is annotated (PEP 561, py.typed) and checked with
mypy --strict; responses are the generated message classes. Enum arguments
take the enums; their names as strings ("nvme", "recency") still work but
are deprecated. Select entries are SelectEntry objects, or dicts of
ContextSelect fields.
"""

from kvtier.arena import ShmArena, StagingFile
from kvtier.chain_hash import CHAIN_HASH_BYTES, chain_hash, chain_hash_sequence
from kvtier.client import Client, GetBlocksResult, normalize_target
from kvtier.enums import (CompactBias, CompactImportance, CompactMerge, DType, Residency, ReturnMode, Scorer,
                          Tier)
from kvtier.errors import KvTierError
from kvtier.local_daemon import LocalDaemon
from kvtier.profile import Profile
from kvtier.select import SelectEntry, Selection, SelectSession, scorer_value

__version__ = "0.1.0"

__all__ = [
    "CHAIN_HASH_BYTES", "Client", "CompactBias", "CompactImportance", "CompactMerge", "DType",
    "GetBlocksResult", "KvTierError", "LocalDaemon", "Profile", "Residency", "ReturnMode", "Scorer",
    "SelectEntry", "Selection", "SelectSession", "ShmArena", "StagingFile", "Tier", "chain_hash",
    "chain_hash_sequence", "normalize_target", "scorer_value",
]
