"""Python client of kvtierd, the KV-cache storage daemon (gRPC over a Unix socket).

    import kvtier
    client = kvtier.Client("./var/kvtier/kvtierd.sock")
    print(client.health(), client.stats().version)

Modules: client (Client, every RPC), profile (Profile, payload checks),
select (streamed Select sessions), arena / cuda_arena (zero-copy block views),
fd_passing (the arena and staging descriptors of a daemon with tenants),
chain_hash (reference block ids), connector (a vLLM KV-connector-shaped
adapter), errors (KvTierError). Generated stubs: kvtier.v1.*_pb2.
"""

from kvtier.arena import ShmArena, StagingFile
from kvtier.chain_hash import CHAIN_HASH_BYTES, chain_hash, chain_hash_sequence
from kvtier.client import Client, GetBlocksResult, normalize_target
from kvtier.errors import KvTierError
from kvtier.local_daemon import LocalDaemon
from kvtier.profile import Profile
from kvtier.select import Selection, SelectSession, scorer_value

__all__ = [
    "CHAIN_HASH_BYTES", "Client", "GetBlocksResult", "KvTierError", "LocalDaemon", "Profile", "Selection",
    "SelectSession", "ShmArena", "StagingFile", "chain_hash", "chain_hash_sequence",
    "normalize_target", "scorer_value",
]
