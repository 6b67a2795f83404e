#!/usr/bin/python3
"""Reading a block zero-copy from kvtierd's arena against a numpy view of local memory.

    PYTHONPATH=build/test/client/python /usr/bin/python3 bench/python/zero_copy_bench.py \
        --kvtierd build/test/daemon/kvtierd

Stores N blocks of 32 KiB (4 layers x k|v x 2 KV heads x 16 tokens x 64 dims,
fp16: the example engine's profile), gets their handles (GetBlocks with
handles: promoted into the arena and pinned), then times per block, over
the N blocks in turn (N x 32 KiB exceeds the L2 cache, so both sides read
from memory):

  view   handle -> numpy array over the arena  |  local array -> slice view
  read   view + copy into a preallocated buffer (every byte read once)
  sum    view + float32 sum (a read with arithmetic, as attention does)

The gRPC round trip of GetBlocks is not part of the figure: an engine gets
handles once per step from Select and reads many blocks from them.
"""

import argparse
import json
import os
import sys
import time

import numpy as np

import kvtier


def best_ns_per_block(fn, items, repeats):
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter_ns()
        for item in items:
            fn(item)
        best = min(best, (time.perf_counter_ns() - started) / len(items))
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--blocks", type=int, default=512)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    with kvtier.LocalDaemon(args.kvtierd, settings={"tiers.device.capacity_bytes": "64MiB"}) as daemon:
        client = daemon.client()
        profile = client.register_profile(kvtier.Profile("zero-copy-bench", 4, 2, 64, 16, "fp16"))
        rng = np.random.default_rng(1)
        local = rng.standard_normal((args.blocks,) + profile.block_shape).astype(np.float16)
        ids = kvtier.chain_hash_sequence(profile.profile_id, list(range(16 * args.blocks)), 16)
        for s in range(0, args.blocks, 64):
            client.put_blocks(profile.profile_id, zip(ids[s : s + 64], local[s : s + 64]))
        got = client.get_blocks(profile.profile_id, ids, mode="handles").raise_for_status()
        handles = [r.handle for r in got.results]
        arena = client.arena()
        for h, block in zip(handles, local):
            if not np.array_equal(arena.view(h, profile), block):
                sys.exit("arena bytes differ from the stored block")
        out = np.empty(profile.block_shape, np.float16)
        indices = list(range(args.blocks))
        figures = {"block_bytes": profile.block_size_bytes, "blocks": args.blocks}
        cases = {
            "view": (lambda h: arena.view(h, profile), lambda i: local[i]),
            "read": (lambda h: np.copyto(out, arena.view(h, profile)), lambda i: np.copyto(out, local[i])),
            "sum": (lambda h: arena.view(h, profile).sum(dtype=np.float32),
                    lambda i: local[i].sum(dtype=np.float32)),
        }
        for name, (from_arena, from_local) in cases.items():
            a = best_ns_per_block(from_arena, handles, args.repeats)
            b = best_ns_per_block(from_local, indices, args.repeats)
            figures[name] = {"arena_ns": a, "local_ns": b, "ratio": a / b}
            print(f"{name:5s} arena {a / 1000:7.2f} us/block  local view {b / 1000:7.2f} us/block  "
                  f"ratio {a / b:.2f}")
        client.release(lease_id=got.lease_id)
        client.close()
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
