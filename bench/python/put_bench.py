#!/usr/bin/python3
"""Python puts and gets over gRPC: put_blocks (wire format written from the
payloads, one copy) against the same blocks sent as generated protobuf messages,
and get_blocks_into (responses parsed in place, one copy into numpy arrays)
against get_blocks (protobuf results) plus the copy into the same arrays.

    PYTHONPATH=build/test/client/python /usr/bin/python3 bench/python/put_bench.py \
        --kvtierd build/test/daemon/kvtierd

Stores --blocks blocks of 256 KiB (8 layers x k|v x 8 KV heads x 16 tokens x
64 dims, fp16) per round, 16 per message, each method in turn with fresh ids
(the previous round's blocks deleted untimed), then reads them back both
ways (every read checked, untimed); prints the median GB/s of each method
over --rounds rounds and the median of the per-round ratios.
"""

import argparse
import statistics
import time

import numpy as np

import kvtier
from kvtier.v1 import kvtier_pb2


def protobuf_put(client, pid, ids, arrays, batch):
    """What put_blocks did before kvtier.wire: BlockPut messages, serialised by grpcio."""
    puts = [kvtier_pb2.BlockPut(block_id=i, data=memoryview(a).tobytes()) for i, a in zip(ids, arrays)]
    requests = [kvtier_pb2.PutBlocksRequest(profile_id=pid, blocks=puts[s : s + batch])
                for s in range(0, len(puts), batch)]
    resp = client._kvtier.PutBlocks(iter(requests), timeout=60)
    assert resp.blocks_stored == len(ids), resp


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--blocks", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    settings = {"tiers.host.capacity_bytes": "512MiB", "tiers.device.capacity_bytes": "64MiB"}
    with kvtier.LocalDaemon(args.kvtierd, settings=settings) as daemon:
        client = daemon.client()
        profile = client.register_profile(kvtier.Profile("put-bench", 8, 8, 64, 16, "fp16"))
        pid = profile.profile_id
        rng = np.random.default_rng(1)
        arrays = rng.standard_normal((args.blocks,) + profile.block_shape).astype(np.float16)
        nbytes = arrays.nbytes
        methods = {
            "wire (put_blocks)": lambda ids: client.put_blocks(pid, zip(ids, arrays), batch_blocks=16),
            "protobuf messages": lambda ids: protobuf_put(client, pid, ids, arrays, 16),
        }
        out = np.empty_like(arrays)

        def get_protobuf(ids):
            got = client.get_blocks(pid, ids).raise_for_status()
            for i, r in enumerate(got.results):
                out[i] = np.frombuffer(r.data, dtype=arrays.dtype).reshape(profile.block_shape)

        def get_into(ids):
            client.get_blocks_into(pid, ids, list(out), ids_per_call=16).raise_for_status()

        gets = {"get_blocks_into": get_into, "get_blocks + copy": get_protobuf}
        seconds = {name: [] for name in list(methods) + list(gets)}
        for r in range(args.rounds + 1):
            for name, put in methods.items():
                ids = kvtier.chain_hash_sequence(pid, list(range(16 * args.blocks)), 16, [f"{name}{r}"])
                started = time.perf_counter()
                put(ids)
                elapsed = time.perf_counter() - started
                if r > 0:  # round 0 warms up
                    seconds[name].append(elapsed)
                for get_name, get in gets.items():
                    out[:] = 0
                    started = time.perf_counter()
                    get(ids)
                    elapsed = time.perf_counter() - started
                    assert np.array_equal(out.view(np.uint16), arrays.view(np.uint16)), get_name
                    if r > 0 and name == list(methods)[0]:
                        seconds[get_name].append(elapsed)
                client.delete_blocks(pid, ids)
        for name, s in seconds.items():
            print(f"{name:20s} {nbytes / statistics.median(s) / 1e9:6.2f} GB/s")
        for a, b in (list(methods), list(gets)):
            ratio = statistics.median(y / x for x, y in zip(seconds[a], seconds[b]))
            print(f"{a} / {b}: {ratio:.2f}x ({args.blocks} blocks of {nbytes // args.blocks >> 10} KiB, "
                  f"median of {args.rounds} rounds)")

if __name__ == "__main__":
    main()
