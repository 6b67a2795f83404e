"""An engine adapter shaped like vLLM's KV connector V1, on top of kvtier.Client.

It offers the hooks vLLM's KVConnectorBase_V1 defines, with the same names and
roles, for an engine whose paged KV pool holds one tensor per layer:

    kv_caches[layer_name]: [2, num_slots, num_kv_heads, block_size, head_dim]
                           (K then V; one slot = one engine block)

in the profile's dtype. A stored block is the profile's payload
[layer][k|v][kv_head][token][dim], i.e. the slot's [2, H, bs, d] of every
layer in layer_names order. Block ids are the chained token hash
(kvtier.chain_hash_sequence) of the request's full blocks, plus optional
extra keys (e.g. a LoRA name).

Scheduler side
  get_num_new_matched_tokens(request, num_computed_tokens) -> (tokens, False)
      Lookup of the prompt's block ids; tokens that can be loaded beyond
      num_computed_tokens. At least one prompt token is always left to compute
      (the engine needs logits), as vLLM requires. Loads are synchronous, so
      the second value (load asynchronously) is False.
  update_state_after_alloc(request, slots, num_external_tokens)
      the engine's slots for the request; the first num_external_tokens /
      block_size of them receive stored blocks, the others' full prompt
      blocks are saved once computed.
  build_connector_meta(scheduler_output=None) -> KvTierConnectorMetadata
      the loads and saves of this step (and forgets them).
  request_finished(request, slots) -> (False, None)   (no delayed freeing)
Worker side
  bind_connector_metadata(meta) / clear_connector_metadata()
  start_load_kv(kv_caches)        GetBlocks with handles, copies every block
                                  from the arena into its slot (all layers),
                                  releases the lease
  wait_for_layer_load(layer_name) returns at once: start_load_kv finished
                                  every layer before returning
  save_kv_layer(layer_name, kv_layer, attn_metadata=None)
                                  copies this layer of every block to save
  wait_for_save()                 PutBlocks of the blocks whose layers all
                                  arrived (identical re-puts are no-ops)
  get_finished(finished_req_ids) -> (done_sending, done_recving)
                                  request ids whose saves / loads completed
                                  since the last call (None when empty)

Errors are KvTierError (kvtier.errors); a failed load leaves the engine to
recompute (get_num_new_matched_tokens is only a hint of what is stored).
Not thread-safe: the engine calls each side from one thread, as vLLM does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from kvtier.chain_hash import chain_hash_sequence
from kvtier.errors import invalid_argument

if TYPE_CHECKING:
    from kvtier.client import Client
    from kvtier.profile import Profile


@dataclasses.dataclass
class Request:
    """What the connector needs of an engine request."""

    request_id: str
    prompt_token_ids: list[int]


@dataclasses.dataclass
class BlockTransfer:
    request_id: str
    block_ids: list[bytes]   # kvtier ids, in token order
    slots: list[int]         # the engine's slots, same order


@dataclasses.dataclass
class KvTierConnectorMetadata:
    loads: list[BlockTransfer] = dataclasses.field(default_factory=list)
    saves: list[BlockTransfer] = dataclasses.field(default_factory=list)


class KvTierConnector:
    def __init__(self, client: Client, profile: Profile, layer_names: Sequence[str],
                 extra_keys: Iterable[bytes | str] = (), lease_ttl_ms: int = 0) -> None:
        if len(layer_names) != profile.num_layers:
            raise invalid_argument("layer_names", f"{len(layer_names)} names for a profile of "
                                   f"{profile.num_layers} layers")
        self.client = client
        self.profile = profile
        self.layer_index = {name: i for i, name in enumerate(layer_names)}
        self.extra_keys = list(extra_keys)
        self.lease_ttl_ms = lease_ttl_ms
        self._ids: dict[str, list[bytes]] = {}   # request_id -> ids of its full prompt blocks
        self._pending = KvTierConnectorMetadata()
        self._meta: KvTierConnectorMetadata | None = None
        # block id -> (request_id, payload tensor, set of layers copied)
        self._save_buffers: dict[bytes, tuple[str, torch.Tensor, set[int]]] = {}
        self._done_sending: set[str] = set()
        self._done_recving: set[str] = set()

    # ---- scheduler side ----------------------------------------------------
    def _block_ids(self, request: Request) -> list[bytes]:
        ids = self._ids.get(request.request_id)
        if ids is None:
            ids = chain_hash_sequence(self.profile.profile_id, request.prompt_token_ids,
                                      self.profile.block_size_tokens, self.extra_keys)
            self._ids[request.request_id] = ids
        return ids

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        bs = self.profile.block_size_tokens
        ids = self._block_ids(request)
        loadable = (len(request.prompt_token_ids) - 1) // bs  # leave a token to compute
        if loadable == 0:
            return 0, False
        prefix = self.client.lookup(self.profile.profile_id, ids[:loadable]).prefix_blocks
        return max(0, prefix * bs - num_computed_tokens), False

    def update_state_after_alloc(self, request: Request, slots: Sequence[int], num_external_tokens: int) -> None:
        bs = self.profile.block_size_tokens
        if num_external_tokens % bs:
            raise invalid_argument("num_external_tokens", f"{num_external_tokens} is not a multiple of "
                                   f"the block size {bs}")
        ids = self._block_ids(request)
        loaded = num_external_tokens // bs
        if loaded > len(slots) or loaded > len(ids):
            raise invalid_argument("slots", f"{len(slots)} slots for {loaded} blocks to load")
        if loaded:
            self._pending.loads.append(BlockTransfer(request.request_id, ids[:loaded], list(slots[:loaded])))
        full = min(len(ids), len(slots))
        if full > loaded:
            self._pending.saves.append(BlockTransfer(request.request_id, ids[loaded:full],
                                                     list(slots[loaded:full])))

    def build_connector_meta(self, scheduler_output: object = None) -> KvTierConnectorMetadata:
        meta, self._pending = self._pending, KvTierConnectorMetadata()
        return meta

    def request_finished(self, request: Request, slots: Sequence[int]) -> tuple[bool, None]:
        self._ids.pop(request.request_id, None)
        return False, None

    # ---- worker side -------------------------------------------------------
    def bind_connector_metadata(self, meta: KvTierConnectorMetadata) -> None:
        self._meta = meta

    def clear_connector_metadata(self) -> None:
        self._meta = None

    def start_load_kv(self, kv_caches: Mapping[str, torch.Tensor], **kwargs: object) -> None:
        if self._meta is None or not self._meta.loads:
            return
        arena = self.client.arena()
        names = sorted(self.layer_index, key=self.layer_index.__getitem__)
        for load in self._meta.loads:
            got = self.client.get_blocks(self.profile.profile_id, load.block_ids, mode="handles",
                                         lease_ttl_ms=self.lease_ttl_ms)
            try:
                got.raise_for_status()
                for result, slot in zip(got.results, load.slots):
                    block = arena.torch_view(result.handle, self.profile)  # [L, 2, H, bs, d]
                    for i, name in enumerate(names):
                        kv_caches[name][:, slot].copy_(block[i])
            finally:
                if got.lease_id:
                    self.client.release(lease_id=got.lease_id)
            self._done_recving.add(load.request_id)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: object = None,
                      **kwargs: object) -> None:
        if self._meta is None:
            return
        layer = self.layer_index.get(layer_name)
        if layer is None:
            raise invalid_argument("layer_name", f"unknown layer {layer_name!r}")
        for save in self._meta.saves:
            for block_id, slot in zip(save.block_ids, save.slots):
                entry = self._save_buffers.get(block_id)
                if entry is None:
                    payload = torch.empty(self.profile.block_shape, dtype=kv_layer.dtype)
                    entry = self._save_buffers[block_id] = (save.request_id, payload, set())
                entry[1][layer].copy_(kv_layer[:, slot])
                entry[2].add(layer)

    def wait_for_save(self) -> None:
        ready = [(bid, e) for bid, e in self._save_buffers.items() if len(e[2]) == self.profile.num_layers]
        if not ready:
            return
        self.client.put_blocks(self.profile.profile_id, [(bid, e[1]) for bid, e in ready])
        for bid, e in ready:
            del self._save_buffers[bid]
            self._done_sending.add(e[0])

    def get_finished(self, finished_req_ids: Iterable[str]) -> tuple[set[str] | None, set[str] | None]:
        finished = set(finished_req_ids)
        sending = {r for r in self._done_sending if r in finished}
        recving = {r for r in self._done_recving if r in finished}
        self._done_sending -= sending
        self._done_recving -= recving
        return (sending or None), (recving or None)
