"""Descriptors of the daemon's shared-memory files, fetched over its fd socket.

With authentication on (auth.tenants_file), a tenant's CPU arena and staging
file are mode 0600 in a folder only the daemon can enter. OpenArena and
ReserveSlots then leave shm_path / staging_path empty and name a Unix socket
(fd_socket_path) instead; the client asks it for an open descriptor of its own
file (protocol: daemon/auth/fd_server.h):

    client -> daemon   "<arena|staging> <token>\\n"   token "-" when none
    daemon -> client   "ok <size_bytes>\\n"           one fd (SCM_RIGHTS):
                                                     arena read-only,
                                                     staging read-write
                       "error <code> <message>\\n"    no fd; a gRPC code number

kvtier.arena maps the descriptor; nothing else needs to call this.

Thread safety: fetch_shared_fd may be called from several threads at once
(one connection per call).
"""

from __future__ import annotations

import array
import os
import socket
import time

import grpc

from kvtier.errors import KvTierError, code_from_value, invalid_argument

KINDS = ("arena", "staging")
MAX_LINE_BYTES = 512   # the daemon's limit on a line
_MAX_FDS = 4           # the protocol sends one; extras are received to be closed
_FD_SPACE = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)


def valid_token(token: object) -> bool:
    """True for a token that fits a metadata value and a protocol line:
    printable ASCII without spaces, at most 256 bytes (the C++ client's limit)."""
    return isinstance(token, str) and 0 < len(token) <= 256 and all("!" <= c <= "~" for c in token)


def _descriptors(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors of the SCM_RIGHTS messages in recvmsg's ancillary data."""
    out = array.array("i")
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            out.frombytes(data[: len(data) - len(data) % out.itemsize])
    return list(out)


def _parse_reply(line: str, fds: list[int], where: str) -> tuple[int, int]:
    """(fd, size) from an 'ok' line with its descriptors; raises otherwise. Closes
    every descriptor it does not return."""
    def close_all() -> None:
        for fd in fds:
            os.close(fd)

    if line.startswith("ok "):
        digits = line[3:]
        if not digits.isdigit() or not digits.isascii() or int(digits) >= 1 << 64:
            close_all()
            raise KvTierError(grpc.StatusCode.INTERNAL, f"{where}: malformed size in reply {line!r}")
        if len(fds) != 1:
            close_all()
            raise KvTierError(grpc.StatusCode.INTERNAL,
                              f"{where}: reply 'ok' came with {len(fds)} descriptors, expected 1")
        return fds[0], int(digits)
    close_all()
    if line.startswith("error "):
        number, _, message = line[6:].partition(" ")
        code = code_from_value(number) if number.isdigit() else grpc.StatusCode.UNKNOWN
        if code == grpc.StatusCode.OK:
            code = grpc.StatusCode.UNKNOWN  # an error line never reads as success
        raise KvTierError(code, f"{where}: {message}")
    raise KvTierError(grpc.StatusCode.INTERNAL, f"{where}: unexpected reply {line!r}")


def fetch_shared_fd(socket_path: str, kind: str, token: str | None = None,
                    timeout_s: float = 5.0) -> tuple[int, int]:
    """(fd, size_bytes) of the caller's `kind` file ("arena" or "staging").

    The caller owns fd (close-on-exec; os.close it, or let kvtier.arena map and
    close it). size_bytes is what the daemon announced. Raises KvTierError: the
    daemon's code and message for an "error" line (UNAUTHENTICATED for a bad
    token), UNAVAILABLE when the socket cannot be reached or closes early,
    DEADLINE_EXCEEDED after timeout_s, INTERNAL for a malformed reply,
    INVALID_ARGUMENT for a bad kind or token (nothing is sent).
    """
    where = f"fd socket {socket_path} ({kind})"
    if kind not in KINDS:
        raise invalid_argument("kind", f"{kind!r}, expected 'arena' or 'staging'")
    if token is not None and token != "" and not valid_token(token):
        raise invalid_argument("token", "must be printable ASCII without spaces, at most 256 bytes")
    deadline = time.monotonic() + timeout_s
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        try:
            sock.settimeout(timeout_s)
            sock.connect(socket_path)
            sock.sendall(f"{kind} {token or '-'}\n".encode("ascii"))
            data = b""
            while b"\n" not in data:
                if len(data) >= MAX_LINE_BYTES:
                    raise KvTierError(grpc.StatusCode.INTERNAL,
                                      f"{where}: reply longer than {MAX_LINE_BYTES} bytes without a newline")
                sock.settimeout(max(deadline - time.monotonic(), 1e-3))
                # recvmsg, not socket.recv_fds: Python 3.11's recv_fds drops its flags
                # argument, and the descriptors must arrive close-on-exec.
                msg, ancdata, flags, _ = sock.recvmsg(MAX_LINE_BYTES - len(data), _FD_SPACE,
                                                      socket.MSG_CMSG_CLOEXEC)
                fds.extend(_descriptors(ancdata))
                if flags & socket.MSG_CTRUNC:
                    raise KvTierError(grpc.StatusCode.INTERNAL,
                                      f"{where}: the daemon sent more descriptors than the protocol's one")
                if not msg:
                    got = f" (got {data.decode('ascii', 'replace')!r})" if data else ""
                    raise KvTierError(grpc.StatusCode.UNAVAILABLE,
                                      f"{where}: the daemon closed the connection without a reply{got}")
                data += msg
        except socket.timeout as e:
            raise KvTierError(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"{where}: no reply within {timeout_s} s") from e
        except OSError as e:
            raise KvTierError(grpc.StatusCode.UNAVAILABLE, f"{where}: {e.strerror or e}") from e
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    finally:
        sock.close()
    line = data[: data.index(b"\n")].decode("ascii", "replace")
    return _parse_reply(line, fds, where)
