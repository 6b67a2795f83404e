"""The training text of the byte models: Jane Austen's novels from Debian's
r-cran-janeaustenr (an R data package; no R needed to read it here).

The package keeps each novel as an R character vector (one element per line
of the Project Gutenberg text) in a lazy-load database, data/Rdata.rdx (the
index: gzip'd R serialization of a named list of [offset, length]) and
data/Rdata.rdb (the objects, each a 4-byte big-endian length, then, for
zlib, the compressed serialization; for bzip2/xz/none a type byte '2', 'Z'
or '0' comes first). This module reads the XDR ("X\\n") serialization of
the few types those files use.

The austen models were trained on Emma, Mansfield Park, Pride and Prejudice
and Sense and Sensibility (~3.1 MB); Persuasion is their held-out book.
"""

import bz2
import gzip
import lzma
import os
import struct
import zlib

DEFAULT_DIR = "/usr/lib/R/site-library/janeaustenr/data"
TRAIN_BOOKS = ("emma", "mansfieldpark", "prideprejudice", "sensesensibility")
HELD_OUT_BOOK = "persuasion"

_NIL, _SYM, _LIST, _CHAR, _LGL, _INT, _REAL, _STR, _VEC = 254, 1, 2, 9, 10, 13, 14, 16, 19
_REF, _GLOBALENV, _EMPTYENV, _BASEENV, _MISSING, _UNBOUND = 255, 253, 242, 241, 251, 252


class _Reader:
    def __init__(self, data):
        self.d, self.i, self.refs = data, 0, []

    def int(self):
        (v,) = struct.unpack_from(">i", self.d, self.i)
        self.i += 4
        return v

    def bytes(self, n):
        b = self.d[self.i:self.i + n]
        self.i += n
        return b

    def header(self):
        if self.bytes(2) != b"X\n":
            raise ValueError("not an XDR R serialization")
        version = self.int()
        self.int(), self.int()
        if version == 3:
            self.bytes(self.int())  # native encoding name

    def item(self):
        flags = self.int()
        kind = flags & 0xFF
        has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if kind in (_NIL, _GLOBALENV, _EMPTYENV, _BASEENV, _MISSING, _UNBOUND):
            return None
        if kind == _REF:
            return self.refs[(flags >> 8) - 1]
        if kind == _SYM:
            name = self.item()
            self.refs.append(name)
            return name
        if kind == _CHAR:
            n = self.int()
            return None if n == -1 else self.bytes(n).decode("utf-8", "replace")
        if kind == _LIST:
            attr = self.item() if has_attr else None
            tag = self.item() if has_tag else None
            head = self.item()
            tail = self.item()
            return [(tag, head)] + (tail or [])
        if kind in (_STR, _VEC):
            n = self.int()
            value = [self.item() for _ in range(n)]
        elif kind in (_INT, _LGL):
            n = self.int()
            value = list(struct.unpack_from(f">{n}i", self.d, self.i))
            self.i += 4 * n
        elif kind == _REAL:
            n = self.int()
            value = list(struct.unpack_from(f">{n}d", self.d, self.i))
            self.i += 8 * n
        else:
            raise ValueError(f"R serialization type {kind} is not supported")
        if has_attr:
            attrs = dict(self.item())
            names = attrs.get("names")
            if names is not None and kind == _VEC:
                return dict(zip(names, value))
        return value


def _unserialize(data):
    r = _Reader(data)
    r.header()
    return r.item()


def _blob(rdb, offset, length):
    raw = rdb[offset:offset + length]
    (size,) = struct.unpack(">I", raw[:4])
    kind = raw[4:5]
    if kind == b"Z":
        out = lzma.decompress(raw[5:])
    elif kind == b"2":
        out = bz2.decompress(raw[5:])
    elif kind == b"0":
        out = raw[5:]
    else:
        out = zlib.decompress(raw[4:])
    if len(out) != size:
        raise ValueError(f"Rdata.rdb: object at {offset} inflates to {len(out)} bytes, not {size}")
    return out


def read_books(data_dir=DEFAULT_DIR):
    """Returns {book name: text} for every novel in the package (lines joined with newlines)."""
    with open(os.path.join(data_dir, "Rdata.rdx"), "rb") as f:
        index = _unserialize(gzip.decompress(f.read()))
    with open(os.path.join(data_dir, "Rdata.rdb"), "rb") as f:
        rdb = f.read()
    books = {}
    for name, (offset, length) in index["variables"].items():
        lines = _unserialize(_blob(rdb, offset, length))
        books[name] = "\n".join(line or "" for line in lines)
    return books


def training_bytes(data_dir=DEFAULT_DIR, books=TRAIN_BOOKS):
    """The four training novels as one byte string (UTF-8), separated by blank lines."""
    texts = read_books(data_dir)
    missing = [b for b in books if b not in texts]
    if missing:
        raise ValueError(f"{data_dir}: no book named {', '.join(missing)} (has {', '.join(sorted(texts))})")
    return "\n\n\n".join(texts[b] for b in books).encode("utf-8")
