"""Forward pass of the small byte-level models in shared/data/models (torch, CPU).

Architecture (shared/data/realkv/README.md, "The model's weights"): pre-norm
transformer, byte vocabulary 256, d_model 256, 4 layers, 4 query heads,
2 KV heads (grouped-query attention), head_dim 64, half-split rotary
embedding (theta 10000), exact GELU MLP, LayerNorm eps 1e-5, no dropout.
Every weight is [out_features, in_features] (y = x W^T + b).

Two entry points share every weight and the rotary table:
  prefill(tokens)            full causal attention over one sequence; returns
                             logits and the post-rotary keys and values
  decode_step(tokens, pos, kv)  one token for each of B sequences; the caller
                             (an engine) keeps the KV cache and computes
                             attention through kv.append / kv.attend, so it
                             decides which cached blocks each step reads.
"""

import math

import numpy as np
import torch
import torch.nn.functional as F

import safetensors_io

_LN_EPS = 1e-5


class ByteModel:
    """Weights and forward pass. Not thread-safe (torch ops are, the caller's
    KV callbacks need not be)."""

    def __init__(self, weights, meta):
        self.num_layers = int(meta.get("layers", 4))
        self.num_q_heads = int(meta.get("q_heads", 4))
        self.num_kv_heads = int(meta.get("kv_heads", 2))
        self.head_dim = int(meta.get("head_dim", 64))
        self.d_model = int(meta.get("d_model", 256))
        self.context_tokens = int(meta.get("train_ctx", 1024))
        self.rope_theta = float(meta.get("rope_theta", 10000))
        self.group = self.num_q_heads // self.num_kv_heads
        self.w = weights
        half = self.head_dim // 2
        freqs = self.rope_theta ** (-torch.arange(half, dtype=torch.float64) / half)
        angles = torch.arange(self.context_tokens, dtype=torch.float64)[:, None] * freqs[None, :]
        self._cos = torch.cos(angles).float()  # [context, half]
        self._sin = torch.sin(angles).float()

    @classmethod
    def load(cls, path):
        tensors, meta = safetensors_io.read(path)
        weights = {name: torch.from_numpy(np.array(t, dtype=np.float32)) for name, t in tensors.items()}
        for name in ("emb.weight", "nf.weight", "nf.bias", "head.weight"):
            if name not in weights:
                raise ValueError(f"{path}: missing weight {name}")
        return cls(weights, meta)

    def _p(self, layer, name):
        return self.w[f"blocks.{layer}.{name}"]

    def rope(self, x, positions):
        """x [..., N, H, head_dim] with positions [N] -> rotated, same shape."""
        half = self.head_dim // 2
        cos = self._cos[positions][:, None, :]
        sin = self._sin[positions][:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)

    def _qkv(self, layer, x, positions):
        """x [N, d_model] -> q [N, Hq, d], k [N, Hkv, d], v [N, Hkv, d] (rotary applied)."""
        h = F.layer_norm(x, (self.d_model,), self._p(layer, "n1.weight"), self._p(layer, "n1.bias"), _LN_EPS)
        n = x.shape[0]
        q = (h @ self._p(layer, "q.weight").T).view(n, self.num_q_heads, self.head_dim)
        k = (h @ self._p(layer, "k.weight").T).view(n, self.num_kv_heads, self.head_dim)
        v = (h @ self._p(layer, "v.weight").T).view(n, self.num_kv_heads, self.head_dim)
        return self.rope(q, positions), self.rope(k, positions), v

    def _finish_layer(self, layer, x, attn):
        """attn [N, Hq, d] -> x after the output projection and the MLP."""
        x = x + attn.reshape(x.shape[0], -1) @ self._p(layer, "o.weight").T
        h = F.layer_norm(x, (self.d_model,), self._p(layer, "n2.weight"), self._p(layer, "n2.bias"), _LN_EPS)
        h = F.gelu(h @ self._p(layer, "f1.weight").T + self._p(layer, "f1.bias"))
        return x + h @ self._p(layer, "f2.weight").T + self._p(layer, "f2.bias")

    def _logits(self, x):
        h = F.layer_norm(x, (self.d_model,), self.w["nf.weight"], self.w["nf.bias"], _LN_EPS)
        return h @ self.w["head.weight"].T

    def prefill(self, tokens, past_k=None, past_v=None):
        """Causal forward over one sequence.

        tokens: int tensor [T]. past_k/past_v: optional [L, Hkv, P, d] keys and
        values of the P tokens before (a loaded prefix); positions continue at P.
        Returns (logits [T, 256], q [L, Hq, T, d], k [L, Hkv, T, d], v [L, Hkv, T, d])
        for the T new tokens.
        """
        past = 0 if past_k is None else past_k.shape[2]
        n = tokens.shape[0]
        if past + n > self.context_tokens:
            raise ValueError(f"tokens: {past + n} positions exceed the model context {self.context_tokens}")
        positions = torch.arange(past, past + n)
        x = self.w["emb.weight"][tokens.long()]
        mask = torch.ones(n, past + n, dtype=torch.bool).tril(diagonal=past)
        qs, ks, vs = [], [], []
        for layer in range(self.num_layers):
            q, k, v = self._qkv(layer, x, positions)
            qs.append(q.transpose(0, 1))
            ks.append(k.transpose(0, 1))
            vs.append(v.transpose(0, 1))
            kk, vv = ks[-1], vs[-1]
            if past:
                kk = torch.cat([past_k[layer].float(), kk], dim=1)
                vv = torch.cat([past_v[layer].float(), vv], dim=1)
            kk = kk.repeat_interleave(self.group, dim=0)  # [Hq, P+T, d]
            vv = vv.repeat_interleave(self.group, dim=0)
            scores = qs[-1] @ kk.transpose(1, 2) / math.sqrt(self.head_dim)
            p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            x = self._finish_layer(layer, x, (p @ vv).transpose(0, 1))
        return self._logits(x), torch.stack(qs), torch.stack(ks), torch.stack(vs)

    def decode_step(self, tokens, positions, kv):
        """One decode step for B sequences.

        tokens, positions: int tensors [B]. kv: the engine's cache, called per
        layer as kv.append(layer, k [B, Hkv, d], v [B, Hkv, d]) and then
        kv.attend(layer, q [B, Hq, d]) -> [B, Hq, d] (attention over whatever
        the engine chose to read, including the token just appended).
        Returns logits [B, 256].
        """
        x = self.w["emb.weight"][tokens.long()]
        for layer in range(self.num_layers):
            q, k, v = self._qkv(layer, x, positions.long())
            kv.append(layer, k, v)
            x = self._finish_layer(layer, x, kv.attend(layer, q))
        return self._logits(x)


def attention_over(q, k, v, valid, group):
    """Grouped-query attention of one query per sequence over padded keys.

    q [B, Hq, d]; k, v [B, Hkv, N, d]; valid: bool [B, N] (False = padding).
    Returns [B, Hq, d]. Used by engines for decode steps.
    """
    b, hq, d = q.shape
    hkv = k.shape[1]
    qg = q.view(b, hkv, group, d)
    scores = qg @ k.transpose(2, 3) / math.sqrt(d)  # [B, Hkv, G, N]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return (p @ v).reshape(b, hq, d)


def next_byte_loss(logits, targets):
    """Per-position next-byte loss in nats: logits [N, 256], targets [N]."""
    return F.cross_entropy(logits, targets.long(), reduction="none")
