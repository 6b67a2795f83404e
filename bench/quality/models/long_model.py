"""The byte models' forward pass for training at long contexts (torch).

Same math as client/python/examples/byte_model.py (and the architecture in
shared/data/realkv/README.md): pre-norm transformer, bytes in, LayerNorm eps
1e-5, grouped-query attention (query head h reads KV head h // group),
half-split rotary positions (theta 10000) over any number of positions, exact
GELU. Attention is computed in query chunks against every earlier key: the
same softmax as full causal attention, with at most chunk x T scores alive at
once, and (when training) each chunk recomputed in the backward pass instead
of being kept. Weights are a dict name -> tensor named as in the safetensors
files; save() writes them in the input's exact layout (names, order, dtype).
Not thread-safe; one model per process.
"""

import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "..", "..", "..", "client", "python", "examples"))
import safetensors_io  # noqa: E402  (the repo's reader)

LN_EPS = 1e-5


class Config:
    def __init__(self, meta):
        self.meta = dict(meta)
        self.layers = int(meta.get("layers", 4))
        self.q_heads = int(meta.get("q_heads", 4))
        self.kv_heads = int(meta.get("kv_heads", 2))
        self.head_dim = int(meta.get("head_dim", 64))
        self.d_model = int(meta.get("d_model", 256))
        self.rope_theta = float(meta.get("rope_theta", 10000))
        self.group = self.q_heads // self.kv_heads


def load(path, device="cpu"):
    """Returns (weights: dict name -> float32 tensor, Config, names in file order)."""
    tensors, meta = safetensors_io.read(path)
    weights = {n: torch.tensor(np.array(t, dtype=np.float32), device=device) for n, t in tensors.items()}
    return weights, Config(meta), list(tensors.keys())


def save(path, weights, names, meta):
    """Writes float32 safetensors with tensors in `names` order, metadata `meta` (strings).

    Written to path + ".tmp" and renamed, so a reader never sees half a file.
    """
    tensors = {name: weights[name].detach().to("cpu", torch.float32).contiguous().numpy() for name in names}
    safetensors_io.write(path, tensors, meta)


def rope_tables(cfg, positions, device):
    """cos, sin [T, head_dim/2] (float64 angles, as byte_model.py)."""
    half = cfg.head_dim // 2
    freqs = cfg.rope_theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * freqs[None, :]
    return torch.cos(angles).float().to(device), torch.sin(angles).float().to(device)


def rope(x, cos, sin):
    """x [B, H, T, d] -> rotated (half-split)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def _chunk_attention(q, k, v, start):
    """q [B, Hkv, G, C, d] at positions start..start+C-1; k, v [B, Hkv, E, d], E = start + C."""
    c, e = q.shape[3], k.shape[2]
    scores = q @ k[:, :, None].transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, Hkv, G, C, E]
    qpos = torch.arange(start, start + c, device=q.device)[:, None]
    mask = torch.arange(e, device=q.device)[None, :] <= qpos
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return p @ v[:, :, None], p


def causal_attention(q, k, v, group, chunk, probe=None, recompute=True):
    """Causal grouped-query attention in query chunks.

    q [B, Hq, T, d]; k, v [B, Hkv, T, d] -> [B, Hq, T, d]. chunk <= 0 means one
    chunk (full attention). probe: optional (q_lo, q_hi, k_lo, k_hi); returns
    also the attention mass [B, Hq] that queries q_lo..q_hi-1 put on keys
    k_lo..k_hi-1, averaged over those queries.
    """
    b, hq, t, d = q.shape
    hkv = k.shape[1]
    qg = q.view(b, hkv, group, t, d)
    chunk = t if chunk <= 0 else chunk
    outs, mass = [], torch.zeros(b, hkv, group, device=q.device)
    for s in range(0, t, chunk):
        e = min(t, s + chunk)
        args = (qg[:, :, :, s:e], k[:, :, :e], v[:, :, :e])
        if recompute and torch.is_grad_enabled() and probe is None:
            out = checkpoint(lambda a, b_, c, s=s: _chunk_attention(a, b_, c, s)[0], *args, use_reentrant=False)
        else:
            out, p = _chunk_attention(*args, s)
            if probe is not None:
                q_lo, q_hi, k_lo, k_hi = probe
                lo, hi = max(q_lo, s) - s, min(q_hi, e) - s
                if hi > lo:
                    mass += p[:, :, :, lo:hi, k_lo:min(k_hi, e)].sum(dim=(-1, -2))
        outs.append(out)
    out = torch.cat(outs, dim=3).reshape(b, hq, t, d)
    if probe is None:
        return out, None
    return out, (mass / (probe[1] - probe[0])).reshape(b, hq)


def forward(w, cfg, tokens, chunk=512, probe=None, rope_cache=None):
    """tokens [B, T] int -> logits [B, T, 256] (and, with probe, mass [L, B, Hq])."""
    b, t = tokens.shape
    cos, sin = rope_cache if rope_cache is not None else rope_tables(cfg, t, tokens.device)
    cos, sin = cos[:t], sin[:t]
    x = w["emb.weight"][tokens.long()]
    masses = []
    for i in range(cfg.layers):
        p = lambda n: w[f"blocks.{i}.{n}"]  # noqa: E731
        h = F.layer_norm(x, (cfg.d_model,), p("n1.weight"), p("n1.bias"), LN_EPS)
        q = (h @ p("q.weight").T).view(b, t, cfg.q_heads, cfg.head_dim).transpose(1, 2)
        k = (h @ p("k.weight").T).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = (h @ p("v.weight").T).view(b, t, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        a, mass = causal_attention(rope(q, cos, sin), rope(k, cos, sin), v, cfg.group, chunk, probe)
        masses.append(mass)
        x = x + a.transpose(1, 2).reshape(b, t, -1) @ p("o.weight").T
        h = F.layer_norm(x, (cfg.d_model,), p("n2.weight"), p("n2.bias"), LN_EPS)
        x = x + F.gelu(h @ p("f1.weight").T + p("f1.bias")) @ p("f2.weight").T + p("f2.bias")
    logits = F.layer_norm(x, (cfg.d_model,), w["nf.weight"], w["nf.bias"], LN_EPS) @ w["head.weight"].T
    if probe is None:
        return logits
    return logits, torch.stack(masses)


def head_slices(cfg, layer, head):
    """The weight slices that belong to query head `head` of `layer`: [(name, dim, lo, hi)].

    Its rows of q.weight, its columns of o.weight, and the rows of k.weight and
    v.weight of the KV head it reads (shared with the other heads of its group).
    """
    d = cfg.head_dim
    kvh = head // cfg.group
    pre = f"blocks.{layer}."
    return [(pre + "q.weight", 0, head * d, (head + 1) * d),
            (pre + "o.weight", 1, head * d, (head + 1) * d),
            (pre + "k.weight", 0, kvh * d, (kvh + 1) * d),
            (pre + "v.weight", 0, kvh * d, (kvh + 1) * d)]
