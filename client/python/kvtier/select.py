"""A streamed Select session: one bidirectional stream, many steps.

    with client.select_session() as session:
        pending = session.send([
            SelectEntry(c1, max_blocks=8, anchor=a1),
            SelectEntry(c2, max_blocks=8, anchor=a2, scorer=Scorer.KEY_KEY),
        ])                        # returns at once (one step ahead)
        ...                       # compute the current step meanwhile
        for sel in pending.result():   # in the order sent
            sel.raise_for_status()
            for block in sel.blocks: arena.view(block.handle, profile)

Each entry of send() is one ContextSelect: a SelectEntry (typed fields, one
per ContextSelect field), or a dict of ContextSelect fields by name
({"context_id": c1, "anchor": a1, "max_blocks": 8, "scorer": "key_key"}),
which also reaches fields a newer proto adds before SelectEntry has them.
numpy arrays, torch tensors and lists fill repeated float fields (anchor,
query, head_queries); scorer is a Scorer (kvtier.enums), or, deprecated, its
name ("recency", "key_key", "SCORER_KEY_KEY") or number; the budget is
max_blocks or max_tokens. Entries are checked before sending; a bad one
raises KvTierError naming contexts[i].<field> and nothing is sent.

Responses arrive in order on a reader thread. If the daemon goes away, every
pending and later result raises KvTierError(UNAVAILABLE) saying so; the
session is then broken (`broken` holds that error) and must be replaced.

Thread safety: send() may be called from several threads; each result
belongs to the request that produced it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import queue
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypeAlias, Union

import grpc

from kvtier.enums import Residency, Scorer, coerce, to_proto
from kvtier.errors import KvTierError, from_item_status, from_rpc_error, invalid_argument
from kvtier.profile import FloatVector, float_vector, set_fields
from kvtier.v1 import kvtier_pb2

if TYPE_CHECKING:
    from kvtier.v1 import kvtier_pb2_grpc

_CLOSE = object()


def scorer_value(scorer: Scorer | int | str, argument: str = "scorer") -> Scorer:
    """The Scorer of a member, its number, or (deprecated) its name (case,
    '_' and '-' ignored, "SCORER_" optional). INVALID_ARGUMENT naming
    `argument` otherwise."""
    return coerce(Scorer, scorer, argument)


@dataclasses.dataclass
class SelectEntry:
    """One context of a Select request (the ContextSelect message, typed).

        SelectEntry(ctx, max_blocks=8, scorer=Scorer.KEY_KEY, anchor=anchor)

    context_id: an open context. Budget: max_blocks or max_tokens (one of
    them; neither: the daemon refuses). scorer: a Scorer; None = the
    daemon's default (select.default_scorer).
    anchor, query, head_queries: float vectors (list, numpy array, torch
    tensor); anchor is head_dim (pooled) or num_layers * head_dim (per
    layer) floats. recency_weight, centered: None = the daemon's setting.
    step, wait_ms: as in proto/kvtier/v1/kvtier.proto. Every field but
    context_id is keyword-only.
    """

    context_id: int
    _: dataclasses.KW_ONLY
    max_blocks: int | None = None
    max_tokens: int | None = None
    scorer: Scorer | None = None
    anchor: FloatVector | None = None
    query: FloatVector | None = None
    head_queries: FloatVector | None = None
    step: int = 0
    wait_ms: int = 0
    recency_weight: float | None = None
    centered: bool | None = None

    def _fields(self) -> dict[str, object]:
        """The ContextSelect fields this entry sets, by name (None: unset)."""
        out: dict[str, object] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                out[field.name] = value
        return out


#: An entry of SelectSession.send(): a SelectEntry, or a mapping of
#: ContextSelect fields by name.
SelectEntryLike: TypeAlias = Union[SelectEntry, Mapping[str, object]]


class Selection:
    """One context's answer: context_id, error (KvTierError or None), blocks
    (SelectedBlock messages in position order: position, block_id,
    residency, handle, score, stability)."""

    __slots__ = ("context_id", "error", "blocks")

    def __init__(self, msg: kvtier_pb2.ContextSelection, index: int) -> None:
        self.context_id: int = msg.context_id
        self.blocks: Sequence[kvtier_pb2.SelectedBlock] = msg.blocks
        self.error: KvTierError | None = None
        if msg.status.code != 0:
            self.error = from_item_status(msg.status, f"contexts[{index}]", index)

    @property
    def ok(self) -> bool:
        return self.error is None

    def raise_for_status(self) -> None:
        if self.error is not None:
            raise self.error

    def resident(self) -> list[kvtier_pb2.SelectedBlock]:
        """Blocks whose handle is valid now (residency Residency.RESIDENT)."""
        return [b for b in self.blocks if Residency(b.residency) is Residency.RESIDENT]


def build_entry(entry: SelectEntryLike, index: int,
                context_shapes: Mapping[int, tuple[int, int, int]]) -> kvtier_pb2.ContextSelect:
    """ContextSelect from a SelectEntry or a mapping of fields; checks the
    anchor length against the context's profile when this client opened the
    context."""
    where = f"contexts[{index}]"
    if isinstance(entry, SelectEntry):
        fields = entry._fields()
    elif isinstance(entry, Mapping):
        fields = dict(entry)
    else:
        raise invalid_argument(where, f"expected a kvtier.SelectEntry or a dict of ContextSelect fields, "
                               f"got {type(entry).__name__}")
    if "context_id" not in fields:
        raise invalid_argument(f"{where}.context_id", "missing")
    if "max_blocks" in fields and "max_tokens" in fields:
        raise invalid_argument(where, "give one budget: max_blocks or max_tokens")
    msg = kvtier_pb2.ContextSelect()
    if "scorer" in fields:
        scorer = fields.pop("scorer")
        if not isinstance(scorer, (int, str)):
            raise invalid_argument(f"{where}.scorer", f"expected a kvtier.Scorer, got {type(scorer).__name__}")
        msg.scorer = to_proto(scorer_value(scorer, f"{where}.scorer"), kvtier_pb2.Scorer)
    anchor = fields.pop("anchor", None)
    if anchor is not None:
        vec = float_vector(anchor, f"{where}.anchor")
        context_id = fields["context_id"]
        shape = context_shapes.get(context_id) if isinstance(context_id, int) else None
        if shape is not None:
            layers, _heads, dim = shape
            # The daemon's layouts (docs/API.md): pooled, or one row per layer.
            allowed = (dim, layers * dim)
            if vec.size not in allowed:
                raise invalid_argument(f"{where}.anchor", f"{vec.size} floats; the context's profile "
                                       f"takes head_dim {dim} (pooled) or num_layers*head_dim "
                                       f"{layers * dim} (per layer)")
        msg.anchor.extend(vec.tolist())
    set_fields(msg, fields, where)
    return msg


class SelectFuture:
    """The pending answer of one send()."""

    def __init__(self, request_id: int, count: int) -> None:
        self.request_id = request_id
        self._count = count
        self._future: concurrent.futures.Future[list[Selection]] = concurrent.futures.Future()

    def result(self, timeout_s: float | None = None) -> list[Selection]:
        """[Selection] in the order of the entries sent. Raises KvTierError when
        the stream broke, DEADLINE_EXCEEDED after timeout_s."""
        try:
            return self._future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError as e:
            raise KvTierError(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"Select request {self.request_id}: no answer within {timeout_s} s") from e

    def done(self) -> bool:
        return self._future.done()


class SelectSession:
    """A Select stream. Create with Client.select_session()."""

    def __init__(self, stub: kvtier_pb2_grpc.KvTierStub, target: str,
                 context_shapes: Mapping[int, tuple[int, int, int]]) -> None:
        self._target = target
        self._context_shapes = context_shapes
        self._requests: queue.SimpleQueue[kvtier_pb2.SelectRequest | object] = queue.SimpleQueue()
        self._pending: collections.deque[SelectFuture] = collections.deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.broken: KvTierError | None = None
        self._call = stub.Select(iter(self._requests.get, _CLOSE))
        self._reader = threading.Thread(target=self._read, name="kvtier-select", daemon=True)
        self._reader.start()

    def send(self, entries: Iterable[SelectEntryLike]) -> SelectFuture:
        """Queues one SelectRequest holding every entry (SelectEntry, or a
        dict of ContextSelect fields); returns a SelectFuture."""
        entry_list = list(entries)
        if not entry_list:
            raise invalid_argument("contexts", "empty: give at least one context")
        msgs = [build_entry(e, i, self._context_shapes) for i, e in enumerate(entry_list)]
        with self._lock:
            if self.broken is not None:
                raise self.broken
            future = SelectFuture(next(self._ids), len(msgs))
            self._pending.append(future)
            self._requests.put(kvtier_pb2.SelectRequest(request_id=future.request_id, contexts=msgs))
        return future

    def select(self, entries: Iterable[SelectEntryLike], timeout_s: float | None = None) -> list[Selection]:
        """send() and wait for its answer."""
        return self.send(entries).result(timeout_s)

    def _read(self) -> None:
        response: kvtier_pb2.SelectResponse
        try:
            for response in self._call:
                with self._lock:
                    future = self._pending.popleft() if self._pending else None
                if future is None or response.request_id != future.request_id:
                    raise KvTierError(grpc.StatusCode.INTERNAL,
                                      f"Select stream: response {response.request_id} does not answer "
                                      f"request {future.request_id if future else 'none'}")
                if len(response.contexts) != future._count:
                    raise KvTierError(grpc.StatusCode.INTERNAL,
                                      f"Select request {future.request_id}: {len(response.contexts)} "
                                      f"answers for {future._count} contexts")
                future._future.set_result([Selection(c, i) for i, c in enumerate(response.contexts)])
            error = KvTierError(grpc.StatusCode.UNAVAILABLE,
                                f"Select stream to kvtierd at {self._target} ended")
        except grpc.RpcError as e:
            error = from_rpc_error(e, "Select stream", self._target)
        except KvTierError as e:
            error = e
        with self._lock:
            self.broken = error
            pending, self._pending = list(self._pending), collections.deque()
        for future in pending:
            future._future.set_exception(error)

    def close(self) -> None:
        """Half-closes the stream and waits for the daemon to finish it."""
        self._requests.put(_CLOSE)
        self._reader.join(timeout=10)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join()

    def __enter__(self) -> SelectSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
