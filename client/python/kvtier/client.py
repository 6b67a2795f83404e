"""kvtier.Client: typed calls for every RPC of kvtier.v1.KvTier and kvtier.v1.Admin.

    client = kvtier.Client("./var/kvtier/kvtierd.sock")
    profile = client.register_profile(kvtier.Profile("my-model", num_layers=4,
        num_kv_heads=2, head_dim=64, block_size_tokens=16, dtype="fp16"))
    ids = kvtier.chain_hash_sequence(profile.profile_id, tokens, 16)
    client.put_blocks(profile.profile_id, zip(ids, arrays))

A target is a Unix socket path (anything with a '/' or ending in ".sock"),
"unix:..." or "host:port". Every failure raises KvTierError with the gRPC code
and the daemon's message; a per-item failure of a batched call raises the
first failed item (index set) unless check=False is passed, in which case the
per-item statuses are in the returned message. Responses are the generated
protobuf messages (kvtier.v1.*_pb2, typed by the kvtier/v1/*_pb2.pyi stubs
generated with them; fields documented in proto/kvtier/v1/).

Enum arguments take the enums of kvtier.enums (Tier, ReturnMode,
CompactImportance, CompactMerge, CompactBias); the names as strings the
client took before ("nvme", "handles", "snapkv") still work but are
deprecated.

Tenants: a daemon with auth.tenants_file wants a bearer token on every call.
Client(target, token=...) sends "authorization: Bearer <token>" with each one
(unary calls, the put and get streams, Select sessions, admin calls); token
None takes $KVTIER_TOKEN when set, "" sends none. The arena and staging file
of such a daemon come as descriptors from its fd socket, fetched with the same
token: arena() and put_blocks(staging=True) do it; nothing else changes.

Thread safety: a Client may be used from several threads (one gRPC channel).
"""

from __future__ import annotations

import collections
import math
import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt
from google.protobuf.message import Message

from kvtier import arena as arena_mod
from kvtier import wire
from kvtier._health import health_pb2
from kvtier.enums import CompactBias, CompactImportance, CompactMerge, ReturnMode, Tier, coerce, to_proto
from kvtier.errors import KvTierError, from_item_status, from_rpc_error, invalid_argument, raise_first_failed
from kvtier.fd_passing import valid_token
from kvtier.profile import BlockData, Profile, block_payload
from kvtier.select import Selection, SelectEntryLike, SelectSession
from kvtier.v1 import admin_pb2, admin_pb2_grpc, kvtier_pb2, kvtier_pb2_grpc, types_pb2

if TYPE_CHECKING:
    import torch

    from kvtier.cuda_arena import CudaArena

MAX_BLOCK_ID_BYTES = 32
_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_M = TypeVar("_M", bound=Message)
# The names each enum argument took as strings before the enums (deprecated),
# where they are not the member's name.
_BIAS_NAMES = {"ratio": CompactBias.ATTENTION_RATIO}


def _tier(value: Tier | str | None, allowed: tuple[Tier, ...], argument: str = "tier") -> Tier:
    """A Tier from a member, its number or (deprecated) its name; None and
    Tier.UNSPECIFIED mean none. INVALID_ARGUMENT unless it is one of `allowed`."""
    member = Tier.UNSPECIFIED if value is None else coerce(Tier, value, argument)
    if member != Tier.UNSPECIFIED and member not in allowed:
        names = ", ".join(f"Tier.{m.name}" for m in allowed)
        raise invalid_argument(argument, f"{value!r}: expected None or one of {names}")
    return member


def _flatten(values: Iterable[Any]) -> Iterator[Any]:
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flatten(v)
        else:
            yield v


def normalize_target(target: str) -> str:
    """Path -> 'unix:<absolute path>'; 'unix:', 'unix-abstract:', 'dns:', 'ipv4:',
    'ipv6:' pass; else host:port. The C++ client's NormalizeTarget does the
    same (client/testdata/normalize_target.txt is the table both test)."""
    if not isinstance(target, str) or not target:
        raise invalid_argument("target", "empty daemon address")
    if target.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")):
        return target
    if "/" in target or target.endswith(".sock"):
        return "unix:" + os.path.abspath(target)
    return target


def _block_ids(ids: Iterable[bytes | bytearray], argument: str = "block_ids") -> list[bytes]:
    out = list(ids)
    if not out:
        raise invalid_argument(argument, "empty")
    for i, block_id in enumerate(out):
        if not isinstance(block_id, (bytes, bytearray)):
            raise invalid_argument(f"{argument}[{i}]", f"expected bytes, got {type(block_id).__name__}")
        if not 1 <= len(block_id) <= MAX_BLOCK_ID_BYTES:
            raise invalid_argument(f"{argument}[{i}]", f"{len(block_id)} bytes, expected 1..{MAX_BLOCK_ID_BYTES}")
    return [bytes(b) for b in out]


def _writable_block(given: object, size: int, argument: str) -> memoryview:
    """A writable byte view of one destination buffer of exactly `size` bytes."""
    buf: Any = given
    if hasattr(buf, "detach") and hasattr(buf, "is_contiguous"):  # torch.Tensor
        if buf.device.type != "cpu" or not buf.is_contiguous():
            raise invalid_argument(argument, "a torch tensor must be contiguous and on the CPU")
        import torch  # only reached with a torch tensor in hand
        buf = buf.detach().reshape(-1).view(torch.uint8).numpy()
    try:
        view = memoryview(buf)
    except TypeError as e:
        raise invalid_argument(argument, f"{type(buf).__name__} is not a writable buffer") from e
    if view.readonly or not view.c_contiguous:
        raise invalid_argument(argument, "must be writable and contiguous")
    view = view.cast("B")
    if view.nbytes != size:
        raise invalid_argument(argument, f"{view.nbytes} bytes; the profile's blocks are {size} bytes")
    return view


_CallDetails = collections.namedtuple(
    "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"))


# grpc has no type information here (its classes read as Any).
class _ClientCallDetails(_CallDetails, grpc.ClientCallDetails):  # type: ignore[misc]
    pass


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Adds "authorization: Bearer <token>" to every call on the channel."""

    def __init__(self, token: str) -> None:
        self._pair = ("authorization", f"Bearer {token}")

    def _with_token(self, d: Any) -> _ClientCallDetails:
        metadata = list(d.metadata or ()) + [self._pair]
        return _ClientCallDetails(d.method, d.timeout, metadata, d.credentials,
                                  getattr(d, "wait_for_ready", None), getattr(d, "compression", None))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._with_token(details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, details: Any, request_iterator: Any) -> Any:
        return continuation(self._with_token(details), request_iterator)


def resolve_token(token: str | None) -> str | None:
    """The token a Client sends: token itself; None -> $KVTIER_TOKEN (unset or
    empty: none); "" -> none. Returns None for none; INVALID_ARGUMENT for a
    token that cannot be a metadata value (the message never quotes it)."""
    if token is None:
        token = os.environ.get("KVTIER_TOKEN") or ""
        where = "KVTIER_TOKEN"
    else:
        where = "token"
    if not isinstance(token, str):
        raise invalid_argument("token", f"expected str, got {type(token).__name__}")
    if token == "":
        return None
    if not valid_token(token):
        raise invalid_argument(where, "must be printable ASCII without spaces, at most 256 bytes")
    return token


class GetBlocksResult:
    """results: BlockResult messages in request order (status, tier, data or
    handle); lease_id: the HANDLES lease (release with Client.release)."""

    def __init__(self, results: list[kvtier_pb2.BlockResult], lease_id: int) -> None:
        self.results = results
        self.lease_id = lease_id

    def raise_for_status(self) -> GetBlocksResult:
        for i, r in enumerate(self.results):
            if r.status.code != 0:
                raise from_item_status(r.status, f"block_ids[{i}]", i)
        return self


class Client:
    def __init__(self, target: str, call_timeout_s: float = 10.0, max_message_bytes: int = 64 << 20,
                 token: str | None = None) -> None:
        self.target = normalize_target(target)
        self.call_timeout_s = call_timeout_s
        self._token = resolve_token(token)
        self._channel = grpc.insecure_channel(self.target, options=[
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ])
        if self._token is not None:
            self._channel = grpc.intercept_channel(self._channel, _BearerToken(self._token))
        self._kvtier = kvtier_pb2_grpc.KvTierStub(self._channel)  # type: ignore[no-untyped-call]
        # PutBlocks with messages already serialised by kvtier.wire (payloads
        # copied once, not through protobuf objects).
        self._put_wire = self._channel.stream_unary(
            "/kvtier.v1.KvTier/PutBlocks", request_serializer=None,
            response_deserializer=kvtier_pb2.PutBlocksResponse.FromString)
        # GetBlocks whose responses are parsed by kvtier.wire (get_blocks_into).
        self._get_wire = self._channel.unary_stream(
            "/kvtier.v1.KvTier/GetBlocks",
            request_serializer=kvtier_pb2.GetBlocksRequest.SerializeToString,
            response_deserializer=None)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)  # type: ignore[no-untyped-call]
        self._health = self._channel.unary_unary(
            _HEALTH_CHECK, request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString)
        self._profiles: dict[int, Profile] = {}
        # context_id -> (layers, kv_heads, head_dim)
        self._context_shapes: dict[int, tuple[int, int, int]] = {}
        self._arena: arena_mod.ShmArena | CudaArena | None = None

    def close(self) -> None:
        if self._arena is not None:
            self._arena.close()
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _timeout(self, timeout_s: float | None, default_s: float | None = None) -> float:
        """timeout_s as given (None: default_s, else call_timeout_s).
        INVALID_ARGUMENT naming timeout_s unless it is a finite number > 0."""
        if timeout_s is None:
            return self.call_timeout_s if default_s is None else default_s
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise invalid_argument("timeout_s", f"{timeout_s!r}: expected seconds > 0, or None for the default")
        return float(timeout_s)

    def _response(self, response: object, want: type[_M], what: str) -> _M:
        """response, checked to be a `want` message (as the stubs declare)."""
        if not isinstance(response, want):
            raise KvTierError(grpc.StatusCode.INTERNAL, f"{what}: got a {type(response).__name__}, "
                              f"expected {want.DESCRIPTOR.full_name}")
        return response

    def _call(self, method: Callable[..., object], request: Message, want: type[_M], what: str,
              timeout_s: float | None = None, wait_for_ready: bool | None = None) -> _M:
        """One unary call: the `want` response, or KvTierError."""
        timeout = self._timeout(timeout_s)
        try:
            response = method(request, timeout=timeout, wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise from_rpc_error(e, what, self.target) from e
        return self._response(response, want, what)

    def _stream(self, method: Callable[..., Iterable[object]], request: Message, want: type[_M], what: str,
                timeout_s: float | None = None) -> list[_M]:
        """Every response of a server-streaming call, or KvTierError."""
        try:
            responses = list(method(request, timeout=self._timeout(timeout_s)))
        except grpc.RpcError as e:
            raise from_rpc_error(e, what, self.target) from e
        return [self._response(r, want, what) for r in responses]

    # ---- health -------------------------------------------------------------
    def health(self, timeout_s: float | None = None, wait_for_ready: bool = False) -> str:
        """'SERVING', 'NOT_SERVING' or 'UNKNOWN' (grpc.health.v1, whole server).
        wait_for_ready=True waits (up to timeout_s) for the socket to accept."""
        resp = self._call(self._health, health_pb2.HealthCheckRequest(), health_pb2.HealthCheckResponse,
                          "Health.Check", timeout_s, wait_for_ready)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    # ---- profiles -----------------------------------------------------------
    def register_profile(self, profile: Profile, **extra_fields: object) -> Profile:
        """Registers a Profile (extra_fields: further ModelProfile fields by name,
        passed through). Returns the Profile with its profile_id."""
        if not isinstance(profile, Profile):
            raise invalid_argument("profile", f"expected kvtier.Profile, got {type(profile).__name__}")
        request = kvtier_pb2.RegisterProfileRequest(profile=profile.to_proto(**extra_fields))
        resp = self._call(self._kvtier.RegisterProfile, request, kvtier_pb2.RegisterProfileResponse,
                          "RegisterProfile")
        registered = Profile.from_proto(request.profile, resp.profile_id)
        if resp.block_size_bytes != registered.block_size_bytes:
            raise KvTierError(grpc.StatusCode.INTERNAL, f"RegisterProfile: daemon block size "
                              f"{resp.block_size_bytes} != client's {registered.block_size_bytes}")
        self._profiles[resp.profile_id] = registered
        return registered

    def get_profile(self, profile_id: int) -> kvtier_pb2.GetProfileResponse:
        """GetProfileResponse (profile, block size, head weights and version)."""
        return self._call(self._kvtier.GetProfile, kvtier_pb2.GetProfileRequest(profile_id=profile_id),
                          kvtier_pb2.GetProfileResponse, "GetProfile")

    def profile(self, profile_id: int, argument: str = "profile_id") -> Profile:
        """The Profile of profile_id (cached; asks the daemon once). Unknown ids
        raise INVALID_ARGUMENT naming `argument`."""
        if not isinstance(profile_id, int) or profile_id <= 0:
            raise invalid_argument(argument, f"{profile_id!r} is not a registered profile id")
        cached = self._profiles.get(profile_id)
        if cached is not None:
            return cached
        try:
            resp = self.get_profile(profile_id)
        except KvTierError as e:
            if e.code == grpc.StatusCode.NOT_FOUND:
                raise invalid_argument(argument, f"profile {profile_id} is not registered with the daemon") from e
            raise
        self._profiles[profile_id] = Profile.from_proto(resp.profile, profile_id)
        return self._profiles[profile_id]

    # ---- arena and staging --------------------------------------------------
    @property
    def has_token(self) -> bool:
        """True when this client sends a bearer token."""
        return self._token is not None

    def open_arena(self) -> kvtier_pb2.OpenArenaResponse:
        """OpenArenaResponse: shm_path or fd_socket_path (CPU arena), or
        cuda_ipc_handle + device_uuid."""
        return self._call(self._kvtier.OpenArena, kvtier_pb2.OpenArenaRequest(), kvtier_pb2.OpenArenaResponse,
                          "OpenArena")

    def arena(self) -> arena_mod.ShmArena | CudaArena:
        """The mapped device arena (kvtier.ShmArena or kvtier.CudaArena), mapped on first use."""
        if self._arena is None:
            info = self.open_arena()
            mapped: arena_mod.ShmArena | CudaArena
            if info.cuda_ipc_handle:
                from kvtier.cuda_arena import CudaArena

                mapped = CudaArena(info)
            elif info.shm_path or info.fd_socket_path:
                mapped = arena_mod.ShmArena(info, token=self._token)
            else:
                raise KvTierError(grpc.StatusCode.FAILED_PRECONDITION, "OpenArena: the daemon named no arena")
            self._arena = mapped
        return self._arena

    def reserve_slots(self, profile_id: int, count: int, lease_ttl_ms: int = 0) -> kvtier_pb2.ReserveSlotsResponse:
        """ReserveSlotsResponse: staging_path (or fd_socket_path and
        staging_size_bytes) and slots for the zero-copy put path."""
        self.profile(profile_id)
        if not isinstance(count, int) or count <= 0:
            raise invalid_argument("count", f"{count!r} must be a positive integer")
        request = kvtier_pb2.ReserveSlotsRequest(profile_id=profile_id, count=count, lease_ttl_ms=lease_ttl_ms)
        return self._call(self._kvtier.ReserveSlots, request, kvtier_pb2.ReserveSlotsResponse, "ReserveSlots")

    # ---- blocks -------------------------------------------------------------
    def put_blocks(self, profile_id: int, blocks: Iterable[tuple[bytes | bytearray, BlockData]], durable: bool = False,
                   staging: bool = False, batch_blocks: int = 64, check: bool = True,
                   retain: bool = False) -> kvtier_pb2.PutBlocksResponse:
        """Stores (block_id, payload) pairs; payloads as in kvtier.profile.block_payload.

        durable=True acknowledges each block once it is synced to NVMe (it then
        survives a crash until evicted or deleted). retain=True keeps the blocks
        until deleted: the cache never evicts them (tenant quota
        retained_bytes).

        staging=True writes each payload into a ReserveSlots slot and sends only
        the slot (one copy, no bytes through gRPC). Otherwise each message is
        written as wire format straight from the payloads (kvtier.wire: one
        copy into the message), one message at a time as gRPC sends them.
        Every payload is checked before anything is sent. Returns the
        PutBlocksResponse.
        """
        profile = self.profile(profile_id)
        pairs = list(blocks)
        if not pairs:
            raise invalid_argument("blocks", "empty")
        for i, p in enumerate(pairs):
            _block_ids([p[0]], f"blocks[{i}].block_id")
        ids = [bytes(p[0]) for p in pairs]
        payloads = [block_payload(p[1], profile, f"blocks[{i}].data") for i, p in enumerate(pairs)]
        if not isinstance(batch_blocks, int) or batch_blocks < 1:
            raise invalid_argument("batch_blocks", f"{batch_blocks!r} must be a positive integer")
        starts = range(0, len(pairs), batch_blocks)
        if staging:
            reserved = self.reserve_slots(profile_id, len(pairs))
            stage = arena_mod.StagingFile.open(reserved, token=self._token)
            puts = []
            for i, (slot, payload) in enumerate(zip(reserved.slots, payloads)):
                stage.write(slot, payload, f"blocks[{i}].slot")
                puts.append(kvtier_pb2.BlockPut(block_id=ids[i], slot=slot))
            method = self._kvtier.PutBlocks
            requests: Iterator[kvtier_pb2.PutBlocksRequest | bytes] = (
                kvtier_pb2.PutBlocksRequest(profile_id=profile_id, durable=durable, retain=retain,
                                            blocks=puts[s : s + batch_blocks]) for s in starts)
        else:
            method = self._put_wire
            requests = (wire.put_blocks_message(profile_id, durable, retain,
                                                [(ids[j], payloads[j], 0) for j in range(s, min(s + batch_blocks, len(pairs)))])
                        for s in starts)
        try:
            response = method(requests, timeout=self.call_timeout_s)
        except grpc.RpcError as e:
            raise from_rpc_error(e, "PutBlocks", self.target) from e
        resp = self._response(response, kvtier_pb2.PutBlocksResponse, "PutBlocks")
        # The daemon counts every message it read; a client compares it with
        # what it sent.
        if resp.messages_received != len(starts):
            raise KvTierError(
                grpc.StatusCode.DATA_LOSS,
                f"PutBlocks: the daemon read {resp.messages_received} of the {len(starts)} "
                "messages sent")
        if check:
            for i, r in enumerate(resp.results):
                if r.status.code != 0:
                    raise from_item_status(r.status, f"blocks[{i}] ({ids[i].hex()})", i)
        return resp

    def get_blocks(self, profile_id: int, block_ids: Iterable[bytes | bytearray],
                   mode: ReturnMode | str = ReturnMode.BYTES, lease_ttl_ms: int = 0) -> GetBlocksResult:
        """GetBlocksResult; mode ReturnMode.BYTES (data in the results) or
        ReturnMode.HANDLES (promoted into the device arena, pinned under
        lease_id); the strings 'bytes' and 'handles' are deprecated. Misses
        are per-item NOT_FOUND statuses, not exceptions (see raise_for_status)."""
        self.profile(profile_id)
        return_mode = coerce(ReturnMode, mode, "mode")
        request = kvtier_pb2.GetBlocksRequest(profile_id=profile_id, block_ids=_block_ids(block_ids),
                                              mode=to_proto(return_mode, kvtier_pb2.ReturnMode), lease_ttl_ms=lease_ttl_ms)
        results: list[kvtier_pb2.BlockResult] = []
        lease_id = 0
        for resp in self._stream(self._kvtier.GetBlocks, request, kvtier_pb2.GetBlocksResponse, "GetBlocks"):
            results.extend(resp.results)
            lease_id = resp.lease_id or lease_id
        return GetBlocksResult(results, lease_id)

    def get_blocks_into(self, profile_id: int, block_ids: Iterable[bytes | bytearray],
                        out: Iterable[bytearray | memoryview | npt.NDArray[np.generic] | torch.Tensor],
                        ids_per_call: int = 1024) -> GetBlocksResult:
        """Reads blocks (bytes mode) straight into the caller's buffers.

        out: one writable, contiguous buffer per id of exactly block_size_bytes
        (bytearray, numpy array, CPU torch tensor). Each response is parsed
        where it was received (kvtier.wire) and each block copied once, into
        its buffer. Returns a GetBlocksResult whose results carry block_id,
        status and tier but no data; a block whose status is not OK (a miss:
        NOT_FOUND) leaves its buffer untouched. ids_per_call: ids per
        GetBlocks call (at most the daemon's limits.max_batch_blocks).
        """
        profile = self.profile(profile_id)
        ids = _block_ids(block_ids)
        outs = list(out)
        if len(outs) != len(ids):
            raise invalid_argument("out", f"{len(outs)} buffers for {len(ids)} block ids")
        if not isinstance(ids_per_call, int) or ids_per_call < 1:
            raise invalid_argument("ids_per_call", f"{ids_per_call!r} must be a positive integer")
        views = [_writable_block(b, profile.block_size_bytes, f"out[{i}]") for i, b in enumerate(outs)]
        results: list[kvtier_pb2.BlockResult] = []
        for first in range(0, len(ids), ids_per_call):
            chunk = ids[first : first + ids_per_call]
            request = kvtier_pb2.GetBlocksRequest(profile_id=profile_id, block_ids=chunk,
                                                  mode=kvtier_pb2.RETURN_MODE_BYTES)
            got = 0
            try:
                raw: bytes
                for raw in self._get_wire(request, timeout=self.call_timeout_s):
                    for r in wire.parse_get_blocks_response(raw):
                        i = first + got
                        if got >= len(chunk) or r.block_id != ids[i]:
                            raise wire.WireError(f"result {got} is not for the id asked for in that place")
                        if r.code == 0:
                            if r.data is None or r.data.nbytes != profile.block_size_bytes:
                                raise wire.WireError(f"result {got} has {0 if r.data is None else r.data.nbytes} "
                                                     f"bytes, expected {profile.block_size_bytes}")
                            views[i][:] = r.data
                        results.append(kvtier_pb2.BlockResult(
                            block_id=r.block_id, tier=to_proto(r.tier, types_pb2.Tier),
                            status=types_pb2.ItemStatus(code=r.code, message=r.message)))
                        got += 1
            except grpc.RpcError as e:
                raise from_rpc_error(e, "GetBlocks", self.target) from e
            except wire.WireError as e:
                raise KvTierError(grpc.StatusCode.INTERNAL, f"GetBlocks: {e}") from e
            if got != len(chunk):
                raise KvTierError(grpc.StatusCode.DATA_LOSS,
                                  f"GetBlocks: the daemon answered {got} of {len(chunk)} blocks")
        return GetBlocksResult(results, 0)

    def lookup(self, profile_id: int, block_ids: Iterable[bytes | bytearray]) -> kvtier_pb2.LookupResponse:
        """LookupResponse: presence and tier per id, longest stored prefix."""
        self.profile(profile_id)
        request = kvtier_pb2.LookupRequest(profile_id=profile_id, block_ids=_block_ids(block_ids))
        return self._call(self._kvtier.Lookup, request, kvtier_pb2.LookupResponse, "Lookup")

    def delete_blocks(self, profile_id: int, block_ids: Iterable[bytes | bytearray],
                      check: bool = True) -> kvtier_pb2.DeleteBlocksResponse:
        """DeleteBlocksResponse; check raises the first failed id."""
        self.profile(profile_id)
        request = kvtier_pb2.DeleteBlocksRequest(profile_id=profile_id, block_ids=_block_ids(block_ids))
        resp = self._call(self._kvtier.DeleteBlocks, request, kvtier_pb2.DeleteBlocksResponse, "DeleteBlocks")
        if check:
            raise_first_failed(resp.statuses)
        return resp

    # ---- contexts and selection ---------------------------------------------
    def open_context(self, profile_id: int,
                     segments: Iterable[Iterable[bytes | bytearray] | tuple[str, Iterable[bytes | bytearray]]],
                     lease_ttl_ms: int = 0) -> kvtier_pb2.OpenContextResponse:
        """Opens a context over stored blocks. segments: a list of block-id lists,
        or of (label, block-id list) pairs. Returns the OpenContextResponse."""
        profile = self.profile(profile_id)
        msgs = []
        for i, seg in enumerate(segments):
            label, ids = seg if isinstance(seg, tuple) else ("", seg)
            msgs.append(kvtier_pb2.Segment(label=label, block_ids=_block_ids(ids, f"segments[{i}].block_ids")))
        if not msgs:
            raise invalid_argument("segments", "empty")
        request = kvtier_pb2.OpenContextRequest(profile_id=profile_id, segments=msgs, lease_ttl_ms=lease_ttl_ms)
        resp = self._call(self._kvtier.OpenContext, request, kvtier_pb2.OpenContextResponse, "OpenContext")
        self._context_shapes[resp.context_id] = (profile.num_layers, profile.num_kv_heads, profile.head_dim)
        return resp

    def append_blocks(self, context_id: int, block_ids: Iterable[bytes | bytearray]) -> kvtier_pb2.AppendBlocksResponse:
        """AppendBlocksResponse (num_blocks in the context after the append)."""
        request = kvtier_pb2.AppendBlocksRequest(context_id=context_id, block_ids=_block_ids(block_ids))
        return self._call(self._kvtier.AppendBlocks, request, kvtier_pb2.AppendBlocksResponse, "AppendBlocks")

    def close_context(self, context_id: int) -> kvtier_pb2.CloseContextResponse:
        """Closes a context (its Select set is unpinned): CloseContextResponse."""
        self._context_shapes.pop(context_id, None)
        return self._call(self._kvtier.CloseContext, kvtier_pb2.CloseContextRequest(context_id=context_id),
                          kvtier_pb2.CloseContextResponse, "CloseContext")

    def select_session(self) -> SelectSession:
        """A new streamed Select session (kvtier.select.SelectSession)."""
        return SelectSession(self._kvtier, self.target, self._context_shapes)

    def select(self, entries: Iterable[SelectEntryLike], timeout_s: float | None = None) -> list[Selection]:
        """One Select request on a short-lived stream: [Selection]. entries:
        kvtier.SelectEntry, or dicts of ContextSelect fields (kvtier.select)."""
        with self.select_session() as session:
            return session.select(entries, self._timeout(timeout_s))

    def release(self, context_id: int | None = None, lease_id: int | None = None) -> kvtier_pb2.ReleaseResponse:
        """Unpins a context's Select set or a GetBlocks lease: ReleaseResponse."""
        if (context_id is None) == (lease_id is None):
            raise invalid_argument("release", "give exactly one of context_id and lease_id")
        request = (kvtier_pb2.ReleaseRequest(context_id=context_id) if context_id is not None
                   else kvtier_pb2.ReleaseRequest(lease_id=lease_id))
        return self._call(self._kvtier.Release, request, kvtier_pb2.ReleaseResponse, "Release")

    # ---- compaction (SelKV) ---------------------------------------------------
    def compact_context(self, context_id: int, retention: float,
                        importance: CompactImportance | str | None = None,
                        merge: CompactMerge | str | None = None, bias: CompactBias | str | None = None,
                        observation_queries: npt.ArrayLike | None = None,
                        timeout_s: float | None = None) -> kvtier_pb2.CompactContextResponse:
        """Compacts an open context that Select is not using (docs/API.md,
        "Compaction"): keeps ceil(retention * tokens) slots per layer and KV
        head, merges the rest, stores them as a new version and demotes the
        originals to NVMe. importance, merge, bias: members of
        CompactImportance, CompactMerge, CompactBias (kvtier.enums); None is
        UNSPECIFIED, the daemon's default. Deprecated, as strings: importance
        'keydiff' | 'snapkv'; merge 'gated' | 'uniform' | 'none'; bias
        'ratio' | 'none'. observation_queries: optional floats
        [layers][kv_heads][W][head_dim] (a numpy array or any nested sequence;
        flattened row-major).
        Returns the CompactContextResponse (context_key, version, existed)."""
        chosen = (coerce(CompactImportance, importance or CompactImportance.UNSPECIFIED, "importance"),
                  coerce(CompactMerge, merge or CompactMerge.UNSPECIFIED, "merge"),
                  coerce(CompactBias, bias or CompactBias.UNSPECIFIED, "bias", _BIAS_NAMES))
        queries: list[float] = []
        if observation_queries is not None:
            given: Any = observation_queries
            flat = getattr(given, "reshape", None)
            queries = ([float(x) for x in given.reshape(-1)] if flat is not None
                       else [float(x) for x in _flatten(given)])
        request = kvtier_pb2.CompactContextRequest(
            context_id=context_id, retention=float(retention), observation_queries=queries,
            importance=to_proto(chosen[0], kvtier_pb2.CompactImportance),
            merge=to_proto(chosen[1], kvtier_pb2.CompactMerge), bias=to_proto(chosen[2], kvtier_pb2.CompactBias))
        return self._call(self._kvtier.CompactContext, request, kvtier_pb2.CompactContextResponse,
                          "CompactContext", self._timeout(timeout_s, 10 * self.call_timeout_s))

    def list_context_versions(self, profile_id: int,
                              context_key: bytes | bytearray = b"") -> kvtier_pb2.ListContextVersionsResponse:
        """ListContextVersionsResponse: the versions of one context (version 0 =
        the originals), or of every compacted context of the profile."""
        request = kvtier_pb2.ListContextVersionsRequest(profile_id=profile_id,
                                                        context_key=bytes(context_key))
        return self._call(self._kvtier.ListContextVersions, request, kvtier_pb2.ListContextVersionsResponse,
                          "ListContextVersions")

    def drop_context_version(self, profile_id: int, context_key: bytes | bytearray, version: int,
                             timeout_s: float | None = None) -> kvtier_pb2.DropContextVersionResponse:
        """Deletes one version's blocks (0 = the originals, only while a compacted
        version exists). DropContextVersionResponse (blocks_deleted)."""
        request = kvtier_pb2.DropContextVersionRequest(profile_id=profile_id,
                                                       context_key=bytes(context_key), version=version)
        return self._call(self._kvtier.DropContextVersion, request, kvtier_pb2.DropContextVersionResponse,
                          "DropContextVersion", self._timeout(timeout_s, 10 * self.call_timeout_s))

    # ---- admin --------------------------------------------------------------
    def stats(self) -> admin_pb2.StatsResponse:
        """StatsResponse: version, uptime, tiers, configuration, counts."""
        return self._call(self._admin.Stats, admin_pb2.StatsRequest(), admin_pb2.StatsResponse, "Stats")

    def list_blocks(self, profile_id: int = 0, tier: Tier | str | None = None,
                    limit: int = 0) -> admin_pb2.ListBlocksResponse:
        """ListBlocksResponse; tier None (every tier), Tier.DEVICE, Tier.HOST or
        Tier.NVME ('device' | 'host' | 'nvme': deprecated)."""
        chosen = _tier(tier, (Tier.DEVICE, Tier.HOST, Tier.NVME))
        request = admin_pb2.ListBlocksRequest(profile_id=profile_id, tier=to_proto(chosen, types_pb2.Tier), limit=limit)
        return self._call(self._admin.ListBlocks, request, admin_pb2.ListBlocksResponse, "ListBlocks")

    def list_contexts(self) -> admin_pb2.ListContextsResponse:
        """ListContextsResponse: every open context."""
        return self._call(self._admin.ListContexts, admin_pb2.ListContextsRequest(),
                          admin_pb2.ListContextsResponse, "ListContexts")

    def drain(self, tier: Tier | str | None = None, timeout_s: float | None = None) -> list[admin_pb2.DrainProgress]:
        """tier None: every block becomes durable on NVMe and memory copies are
        dropped; Tier.DEVICE ('device': deprecated): only device copies are
        given up. Returns the streamed DrainProgress messages."""
        chosen = _tier(tier, (Tier.DEVICE,))
        request = admin_pb2.DrainRequest(tier=to_proto(chosen, types_pb2.Tier))
        return self._stream(self._admin.Drain, request, admin_pb2.DrainProgress, "Drain", timeout_s)

    def list_profiles(self) -> admin_pb2.ListProfilesResponse:
        """ListProfilesResponse: every registered profile with its owner,
        block count and bytes."""
        return self._call(self._admin.ListProfiles, admin_pb2.ListProfilesRequest(),
                          admin_pb2.ListProfilesResponse, "ListProfiles")

    def evict(self, profile_id: int, block_ids: Iterable[bytes | bytearray], tier: Tier | str | None = None,
              tenant: str = "", check: bool = True) -> admin_pb2.EvictResponse:
        """Gives up one tier's copy of each block, as the cache would:
        Tier.DEVICE or Tier.HOST drop that copy (a last copy moves down
        first); None or Tier.NVME make the block leave this daemon ('device'
        | 'host' | 'nvme': deprecated). EvictResponse; check raises the first
        failed id (pinned or retained blocks stay)."""
        chosen = _tier(tier, (Tier.DEVICE, Tier.HOST, Tier.NVME))
        request = admin_pb2.EvictRequest(tenant=tenant, profile_id=profile_id,
                                         block_ids=_block_ids(block_ids), tier=to_proto(chosen, types_pb2.Tier))
        resp = self._call(self._admin.Evict, request, admin_pb2.EvictResponse, "Evict")
        if check:
            raise_first_failed(resp.statuses)
        return resp

    def verify(self, profile_id: int = 0, timeout_s: float | None = None) -> list[admin_pb2.VerifyProgress]:
        """Re-reads and checksums every durable block; the VerifyProgress messages."""
        return self._stream(self._admin.Verify, admin_pb2.VerifyRequest(profile_id=profile_id),
                            admin_pb2.VerifyProgress, "Verify", timeout_s)
