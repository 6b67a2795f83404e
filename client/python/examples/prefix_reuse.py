#!/usr/bin/python3
"""Prefix reuse through the vLLM-shaped connector (kvtier.connector).

A small paged engine (one KV pool tensor per layer, slots of 16 tokens)
serves two requests that share a prefix. Request A is computed in full and
its prompt blocks are saved through the connector. For request B the
scheduler asks the connector how many tokens are stored, allocates slots, and
the worker loads those blocks from kvtierd's arena into its pool; only B's
suffix is computed, attending to the loaded prefix. The logits must equal
those of computing B from scratch.

    /usr/bin/python3 client/python/examples/prefix_reuse.py --kvtierd build/test/daemon/kvtierd

With an fp32 profile the loaded keys and values are the computed ones bit for
bit, so the logits agree to float rounding; --dtype fp16 shows the cost of
storing fp16.
"""

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import byte_model  # noqa: E402
import safetensors_io  # noqa: E402
import kvtier  # noqa: E402
from kvtier.connector import KvTierConnector, Request  # noqa: E402

TORCH_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


class PagedEngine:
    """Prefill-only engine over a paged KV pool, driving the connector's hooks
    in the order vLLM does (scheduler: match, allocate, build metadata;
    worker: load, forward with per-layer saves, wait for saves)."""

    def __init__(self, model, connector, num_slots, dtype):
        self.m = model
        self.connector = connector
        self.bs = connector.profile.block_size_tokens
        self.layer_names = [f"layers.{i}" for i in range(model.num_layers)]
        self.kv_caches = {name: torch.zeros(2, num_slots, model.num_kv_heads, self.bs, model.head_dim,
                                            dtype=dtype) for name in self.layer_names}
        self.free = list(range(num_slots))

    def serve(self, request):
        """Returns (logits of the computed tokens, number of tokens loaded)."""
        tokens = torch.tensor(request.prompt_token_ids)
        n = len(tokens)
        # Scheduler step.
        external, _ = self.connector.get_num_new_matched_tokens(request, 0)
        slots = [self.free.pop(0) for _ in range((n + self.bs - 1) // self.bs)]
        self.connector.update_state_after_alloc(request, slots, external)
        meta = self.connector.build_connector_meta()
        # Worker step.
        self.connector.bind_connector_metadata(meta)
        self.connector.start_load_kv(self.kv_caches)
        past_k = past_v = None
        if external:
            loaded = slots[: external // self.bs]
            for name in self.layer_names:
                self.connector.wait_for_layer_load(name)
            stack = torch.stack([self.kv_caches[name][:, loaded] for name in self.layer_names])
            # [L, 2, blocks, H, bs, d] -> [L, H, blocks * bs, d]
            kv = stack.permute(1, 0, 3, 2, 4, 5).reshape(2, self.m.num_layers, self.m.num_kv_heads, -1,
                                                         self.m.head_dim)
            past_k, past_v = kv[0].float(), kv[1].float()
        with torch.no_grad():
            logits, _, k, v = self.m.prefill(tokens[external:], past_k, past_v)
        # Write the computed tokens into their slots, layer by layer, and save.
        for i, name in enumerate(self.layer_names):
            pool = self.kv_caches[name]
            for j in range(k.shape[2]):
                pos = external + j
                slot = slots[pos // self.bs]
                pool[0, slot, :, pos % self.bs] = k[i, :, j]
                pool[1, slot, :, pos % self.bs] = v[i, :, j]
            self.connector.save_kv_layer(name, pool)
        self.connector.wait_for_save()
        self.connector.clear_connector_metadata()
        self.connector.get_finished({request.request_id})
        self.connector.request_finished(request, slots)
        self.free.extend(slots)
        return logits, external


def run(client, model, text, prefix_tokens, suffix_tokens, dtype="fp32"):
    profile = client.register_profile(kvtier.Profile(
        f"prefix-reuse-{dtype}", model.num_layers, model.num_kv_heads, model.head_dim, 16, dtype))
    connector = KvTierConnector(client, profile, [f"layers.{i}" for i in range(model.num_layers)])
    engine = PagedEngine(model, connector, num_slots=128, dtype=TORCH_DTYPES[dtype])
    prefix = text[:prefix_tokens].tolist()
    a = Request("A", prefix + text[prefix_tokens : prefix_tokens + suffix_tokens].tolist())
    b = Request("B", prefix + text[-suffix_tokens:].tolist())
    _, loaded_a = engine.serve(a)
    started = time.perf_counter()
    logits_b, loaded_b = engine.serve(b)
    reuse_s = time.perf_counter() - started
    started = time.perf_counter()
    with torch.no_grad():
        full = model.prefill(torch.tensor(b.prompt_token_ids))[0]
    full_s = time.perf_counter() - started
    diff = (logits_b - full[loaded_b:]).abs().max().item()
    same_argmax = bool((logits_b.argmax(-1) == full[loaded_b:].argmax(-1)).all())
    return {"dtype": dtype, "loaded_a": loaded_a, "loaded_b": loaded_b, "computed_b": len(b.prompt_token_ids) - loaded_b,
            "max_abs_logit_diff": diff, "same_argmax": same_argmax, "reuse_s": reuse_s, "recompute_s": full_s}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=os.environ.get("KVTIER_SHARED_DATA", "/work/shared/data"))
    p.add_argument("--kvtierd", required=True)
    p.add_argument("--model", default="model-austen-copy")
    p.add_argument("--prefix", type=int, default=512)
    p.add_argument("--suffix", type=int, default=40)
    args = p.parse_args(argv)
    model = byte_model.ByteModel.load(os.path.join(args.data, "models", args.model + ".safetensors"))
    tensors, _ = safetensors_io.read(os.path.join(args.data, "realkv", "rkc-persuasion-window-00.safetensors"))
    text = torch.from_numpy(np.array(tensors["tokens"], dtype=np.int64))
    with kvtier.LocalDaemon(args.kvtierd) as daemon:
        client = daemon.client()
        for dtype in ("fp32", "fp16"):
            r = run(client, model, text, args.prefix, args.suffix, dtype)
            print(f"{dtype}: B loaded {r['loaded_b']} tokens from kvtierd, computed {r['computed_b']}; "
                  f"max |logit diff| vs recompute {r['max_abs_logit_diff']:.2e}, same argmax {r['same_argmax']}; "
                  f"{1000 * r['reuse_s']:.0f} ms vs {1000 * r['recompute_s']:.0f} ms recomputing")
        client.close()


if __name__ == "__main__":
    main()
