"""The one exception type of the kvtier client, and the one place that makes it.

Every failure the client reports is a KvTierError carrying a grpc.StatusCode
and a message: errors the daemon returned (call status or a per-item
ItemStatus), a broken connection, and input the client refuses before sending
(code INVALID_ARGUMENT, the message naming the argument).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import grpc

if TYPE_CHECKING:
    from kvtier.v1 import types_pb2

_CODES_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


class KvTierError(Exception):
    """A failed kvtier call.

    code: grpc.StatusCode. message: the daemon's message unchanged, or the
    client's own naming the argument. index: position of the failed item in a
    batched call (None for call-level errors).
    """

    def __init__(self, code: grpc.StatusCode, message: str, index: int | None = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.index = index


def code_from_value(value: int | str) -> grpc.StatusCode:
    """google.rpc.Code integer -> grpc.StatusCode (UNKNOWN for values gRPC does not know)."""
    return _CODES_BY_VALUE.get(int(value), grpc.StatusCode.UNKNOWN)


def invalid_argument(argument: str, problem: str) -> KvTierError:
    """A client-side refusal: 'argument: problem' with INVALID_ARGUMENT."""
    return KvTierError(grpc.StatusCode.INVALID_ARGUMENT, f"{argument}: {problem}")


def from_rpc_error(error: grpc.RpcError, what: str, target: str) -> KvTierError:
    """grpc.RpcError of a call named `what` to `target` -> KvTierError.

    UNAVAILABLE says that the daemon is unreachable or went away, since gRPC's
    own text for it ("failed to connect to all addresses") does not.
    """
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    if code == grpc.StatusCode.UNAVAILABLE:
        details = f"{what}: kvtierd at {target} is unreachable or went away ({details})"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        details = f"{what}: no answer from kvtierd at {target} before the deadline ({details})"
    return KvTierError(code, details)


def from_item_status(status: types_pb2.ItemStatus, argument: str, index: int) -> KvTierError:
    """A per-item ItemStatus that is not OK -> KvTierError naming the item."""
    return KvTierError(code_from_value(status.code), f"{argument}: {status.message}", index)


def raise_first_failed(statuses: Iterable[types_pb2.ItemStatus], argument: str = "block_ids") -> None:
    """Raises the first item of a batched call that failed, as a KvTierError
    naming it (argument[i]); returns when every item is OK."""
    for i, status in enumerate(statuses):
        if status.code != 0:
            raise from_item_status(status, f"{argument}[{i}]", i)
