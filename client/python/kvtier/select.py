"""A streamed Select session: one bidirectional stream, many steps.

    with client.select_session() as session:
        pending = session.send([
            {"context_id": c1, "anchor": a1, "max_blocks": 8},
            {"context_id": c2, "anchor": a2, "max_blocks": 8, "scorer": "key_key"},
        ])                        # returns at once (one step ahead)
        ...                       # compute the current step meanwhile
        for sel in pending.result():   # in the order sent
            sel.raise_for_status()
            for block in sel.blocks: arena.view(block.handle, profile)

Each entry of send() is one ContextSelect given by field name; numpy arrays,
torch tensors and lists fill repeated float fields (anchor, query, and any
float field a newer proto adds, e.g. head_queries); scorer accepts a Scorer
value or its name ("recency", "key_key", "SCORER_KEY_KEY"); budget is
max_blocks or max_tokens. Entries are checked before sending; a bad one raises
KvTierError naming contexts[i].<field> and nothing is sent.

Responses arrive in order on a reader thread. If the daemon goes away, every
pending and later result raises KvTierError(UNAVAILABLE) saying so; the
session is then broken (`broken` holds that error) and must be replaced.

Thread safety: send() may be called from several threads; each result
belongs to the request that produced it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import queue
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import grpc

from kvtier.errors import KvTierError, from_item_status, from_rpc_error, invalid_argument
from kvtier.profile import float_vector, set_fields
from kvtier.v1 import kvtier_pb2

_CLOSE = object()


def scorer_value(scorer: int | str, argument: str = "scorer") -> int:
    """Scorer enum value from an int or a name (case and underscores ignored)."""
    names = kvtier_pb2.Scorer.keys()
    if isinstance(scorer, int) and not isinstance(scorer, bool):
        if scorer in kvtier_pb2.Scorer.values():
            return scorer
        raise invalid_argument(argument, f"unknown scorer value {scorer}")
    if isinstance(scorer, str):
        key = scorer.upper().removeprefix("SCORER_").replace("_", "").replace("-", "")
        for name in names:
            if name.removeprefix("SCORER_").replace("_", "") == key:
                return kvtier_pb2.Scorer.Value(name)
    known = ", ".join(n.removeprefix("SCORER_").lower() for n in names)
    raise invalid_argument(argument, f"unknown scorer {scorer!r} (known: {known})")


class Selection:
    """One context's answer: context_id, error (KvTierError or None), blocks
    (SelectedBlock messages in position order: position, block_id,
    residency, handle, score, stability)."""

    __slots__ = ("context_id", "error", "blocks")

    def __init__(self, msg: Any, index: int) -> None:
        self.context_id = msg.context_id
        self.blocks = msg.blocks
        self.error: KvTierError | None = None
        if msg.status.code != 0:
            self.error = from_item_status(msg.status, f"contexts[{index}]", index)

    @property
    def ok(self) -> bool:
        return self.error is None

    def raise_for_status(self) -> None:
        if self.error is not None:
            raise self.error

    def resident(self) -> list[Any]:
        """Blocks whose handle is valid now."""
        return [b for b in self.blocks if b.residency == kvtier_pb2.RESIDENCY_RESIDENT]


def build_entry(entry: dict[str, Any], index: int,
                context_shapes: Mapping[int, tuple[int, int, int]]) -> Any:
    """ContextSelect from a dict of fields; checks the anchor length against the
    context's profile when this client opened the context."""
    where = f"contexts[{index}]"
    if not isinstance(entry, dict):
        raise invalid_argument(where, f"expected a dict of ContextSelect fields, got {type(entry).__name__}")
    if "context_id" not in entry:
        raise invalid_argument(f"{where}.context_id", "missing")
    if "max_blocks" in entry and "max_tokens" in entry:
        raise invalid_argument(where, "give one budget: max_blocks or max_tokens")
    fields = dict(entry)
    msg = kvtier_pb2.ContextSelect()
    if "scorer" in fields:
        msg.scorer = scorer_value(fields.pop("scorer"), f"{where}.scorer")
    anchor = fields.pop("anchor", None)
    if anchor is not None:
        vec = float_vector(anchor, f"{where}.anchor")
        shape = context_shapes.get(int(fields["context_id"]))
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

    def __init__(self, stub: Any, target: str, context_shapes: Mapping[int, tuple[int, int, int]]) -> None:
        self._target = target
        self._context_shapes = context_shapes
        self._requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._pending: collections.deque[SelectFuture] = collections.deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self.broken: KvTierError | None = None
        self._call = stub.Select(iter(self._requests.get, _CLOSE))
        self._reader = threading.Thread(target=self._read, name="kvtier-select", daemon=True)
        self._reader.start()

    def send(self, entries: Iterable[dict[str, Any]]) -> SelectFuture:
        """Queues one SelectRequest holding every entry; returns a SelectFuture."""
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

    def select(self, entries: Iterable[dict[str, Any]], timeout_s: float | None = None) -> list[Selection]:
        """send() and wait for its answer."""
        return self.send(entries).result(timeout_s)

    def _read(self) -> None:
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
