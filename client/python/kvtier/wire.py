"""PutBlocksRequest written as protobuf wire format straight from the payloads.

put_blocks_message() joins a message's field heads and the caller's payload
buffers in one copy (bytes.join over memoryviews), where building
kvtier_pb2.BlockPut messages and serialising them copies every payload two or
three times. The bytes are exactly a PutBlocksRequest (field numbers of
proto/kvtier/v1/kvtier.proto); tests/test_client.py parses them back with the
generated class.
"""

# PutBlocksRequest: profile_id = 1, blocks = 2, durable = 3, retain = 4.
# BlockPut: block_id = 1, data = 2, xxh3 = 4.
_VARINT, _LENGTH = 0, 2


def varint(value):
    """The varint encoding of a non-negative integer below 2**64."""
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"varint: {value} is not a uint64")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field, wire_type):
    return varint((field << 3) | wire_type)


def put_blocks_message(profile_id, durable, retain, blocks):
    """bytes of a PutBlocksRequest; blocks: (block_id bytes, payload buffer, xxh3 int) triples.

    A payload is any object with the buffer protocol (bytes, a contiguous
    numpy array or memoryview); it is read once, by the join.
    """
    parts = []
    if profile_id:
        parts += [_key(1, _VARINT), varint(profile_id)]
    if durable:
        parts += [_key(3, _VARINT), b"\x01"]
    if retain:
        parts += [_key(4, _VARINT), b"\x01"]
    for block_id, payload, xxh3 in blocks:
        data = memoryview(payload)
        data = data.cast("B") if data.c_contiguous else memoryview(data.tobytes())
        inner = [_key(1, _LENGTH), varint(len(block_id)), bytes(block_id)]
        if xxh3:
            inner += [_key(4, _VARINT), varint(xxh3)]
        inner += [_key(2, _LENGTH), varint(data.nbytes)]
        head = b"".join(inner)
        parts += [_key(2, _LENGTH), varint(len(head) + data.nbytes), head, data]
    return b"".join(parts)
