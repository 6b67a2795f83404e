"""An example decode engine on kvtierd: block storage and per-step selection.

The engine runs B sequences in lockstep (teacher-forced: the next input is the
text's next byte). It keeps, like a serving engine, the partial block of each
sequence in its own memory and a host copy of every finished block (the fallback
when the daemon is gone); finished 16-token blocks are stored in kvtierd
(PutBlocks, fp16 payloads in the profile's layout) and appended to the
sequence's context. Prompt blocks are named by the chained token hash; decode
blocks also carry a per-run salt (their contents depend on the policy).

Policies (what attention reads at each decode step):
  full     every finished block, chosen by Select (recency scorer, budget = all
           blocks) and read zero-copy from the daemon's arena, plus the partial
           block: the reference, through the same code path as "select".
  select   the blocks Select chose for this step (scorer, budget = a fraction of
           the visible blocks), read zero-copy from the arena, plus the partial
           block. Select runs one step ahead: the request for step t+1 is sent
           during step t as soon as its keys (and queries) exist, batched over
           all sequences in one message, and awaited at the start of t+1.
  window   the last `budget` blocks (partial included) from the host copies: the
           sliding-window baseline of the same budget.
  local    every block from the host copies (what "full" falls back to).
  oracle   the blocks that hold the most of this step's attention, from the
           host copies: the step is first run over every block, and each
           finished block's attention (summed over layers, averaged over
           query heads) ranks it; the budget's best are read. Not realisable
           (it needs the step's own queries at every layer before choosing);
           it bounds what any selection by attention mass can reach.

Budget at a step with n visible blocks (finished + partial), as in
bench/quality: max(ceil(fraction * n), forced + 1) capped at n, with forced =
sink + local block + partial block = 3; the daemon's max_blocks is that minus
the partial block, which the engine holds.

If a Select or a put fails (daemon gone, stream broken), the engine logs it
once and continues on the "local" policy; `fallback_step` records when.
"""

import math
import time
import uuid

import numpy as np
import torch

import kvtier
from byte_model import attention_over, next_byte_loss

FORCED_BLOCKS = 3  # sink, one local block, the partial block
ANCHOR_TOKENS = 8


def attention_two_part(q, kb, vb, valid_b, kp, vp, valid_p, group):
    """Attention of q [B, Hq, d] over finished blocks kb, vb [B, Hkv, N, d]
    (valid_b [B, N]) and the partial block kp, vp [B, Hkv, bs, d] (valid_p
    [B, bs]) under one softmax, without concatenating the keys."""
    b, hq, d = q.shape
    hkv = kb.shape[1]
    qg = q.view(b, hkv, group, d) / math.sqrt(d)
    s1 = (qg @ kb.transpose(2, 3)).masked_fill(~valid_b[:, None, None, :], float("-inf"))
    s2 = (qg @ kp.transpose(2, 3)).masked_fill(~valid_p[:, None, None, :], float("-inf"))
    p = torch.softmax(torch.cat([s1, s2], dim=-1), dim=-1)
    n = kb.shape[2]
    return (p[..., :n] @ vb + p[..., n:] @ vp).reshape(b, hq, d)


def step_budget(fraction, visible_blocks):
    b = math.ceil(fraction * visible_blocks - 1e-9)
    return min(visible_blocks, max(b, FORCED_BLOCKS + 1))


class PrefillCache:
    """Prefill results of one model over texts, shared by every run."""

    def __init__(self, model, texts, prompt_tokens):
        self.prompt_tokens = prompt_tokens
        self.losses, self.k, self.v = [], [], []
        with torch.no_grad():
            for text in texts:
                logits, _, k, v = model.prefill(text[:prompt_tokens])
                self.losses.append(next_byte_loss(logits, text[1 : prompt_tokens + 1]))
                self.k.append(k)
                self.v.append(v)


class RunResult:
    def __init__(self, batch, length):
        self.losses = torch.full((batch, length - 1), float("nan"))  # [b, t] = -log p(x[t+1])
        self.step_s = []          # wall time of each decode step
        self.select_s = []        # time a step spent inside Select calls (send + wait)
        self.select_rtt_s = []    # send -> answer, per request
        self.blocks_read = 0      # finished blocks attention read, summed over steps and sequences
        self.pending_blocks = 0   # chosen but not resident: read from the host copy
        self.fallback_step = None
        self.fallback_error = None
        self.steps = 0


class DecodeEngine:
    def __init__(self, model, client=None, profile=None, policy="full", fraction=1.0,
                 scorer="recency", anchor="pooled", retrieval_heads=(), select_fields=None, log=print):
        if policy not in ("full", "select", "window", "local", "oracle"):
            raise ValueError(f"policy: unknown {policy!r}")
        if policy in ("full", "select") and (client is None or profile is None):
            raise ValueError(f"policy {policy!r} needs a client and a registered profile")
        if anchor not in ("pooled", "layer", "head"):
            raise ValueError(f"anchor: {anchor!r}, expected pooled, layer or head")
        self.m = model
        self.client = client
        self.profile = profile
        self.policy = policy
        self.fraction = fraction
        self.scorer = scorer
        self.anchor = anchor
        # (layer, q_head) pairs whose current queries go with every Select as
        # head_queries (R * head_dim floats, in this order, after the rotary
        # embedding): the retrieval heads of the profile's calibration.
        self.retrieval_heads = [tuple(h) for h in retrieval_heads]
        self.select_fields = select_fields  # fn(engine, q_by_layer) -> extra ContextSelect fields
        self.log = log
        self.bs = profile.block_size_tokens if profile else 16

    # ---- setup ------------------------------------------------------------
    def _start(self, texts, cache):
        m, b = self.m, len(texts)
        self.texts = torch.stack(texts)
        self.length = self.texts.shape[1]
        p = cache.prompt_tokens
        if p % self.bs or p < 2 * self.bs:
            raise ValueError(f"prompt_tokens: {p} must be a multiple of {self.bs}, at least 2 blocks")
        max_blocks = self.length // self.bs + 1
        shape = (m.num_layers, 2, m.num_kv_heads, self.bs, m.head_dim)
        self.host = torch.zeros((b, max_blocks) + shape, dtype=torch.float16)
        self.partial = torch.zeros((b,) + shape)
        self.recent = torch.zeros(b, ANCHOR_TOKENS, m.num_layers, m.num_kv_heads, m.head_dim)
        self.num_blocks = p // self.bs
        for i in range(b):
            k, v = cache.k[i], cache.v[i]  # [L, H, P, d]
            kv = torch.stack([k, v], dim=1)  # [L, 2, H, P, d]
            blocks = kv.view(m.num_layers, 2, m.num_kv_heads, self.num_blocks, self.bs, m.head_dim)
            self.host[i, : self.num_blocks] = blocks.permute(3, 0, 1, 2, 4, 5).half()
            self.recent[i] = k[:, :, p - ANCHOR_TOKENS : p].permute(2, 0, 1, 3)
        self.ids = [[] for _ in range(b)]
        # Decode-time keys and values depend on what attention read, not only
        # on the tokens: a sparse run's block differs from a full run's for the
        # same tokens. Its ids therefore carry a salt unique to this run; the
        # prompt's blocks (full-attention prefill) are shared by every run.
        self.salt = f"decode:{self.policy}:{self.scorer}:{self.fraction}:{uuid.uuid4().hex}"
        self.contexts = [None] * b
        self.session = None
        self.pending = None
        self.t = p
        if self.policy in ("full", "select"):
            try:
                for i in range(b):
                    self.ids[i] = kvtier.chain_hash_sequence(
                        self.profile.profile_id, self.texts[i, :p].tolist(), self.bs)
                    self.client.put_blocks(self.profile.profile_id,
                                           zip(self.ids[i], self.host[i, : self.num_blocks].numpy()))
                    self.contexts[i] = self.client.open_context(self.profile.profile_id,
                                                                [self.ids[i]]).context_id
                self.arena = self.client.arena()
                self.arena_t = self.arena.torch_elements(self.profile)
                self.session = self.client.select_session()
            except kvtier.KvTierError as e:
                self._fall_back(e)

    def _fall_back(self, error):
        if self.result.fallback_step is None:
            self.result.fallback_step = self.t
            self.result.fallback_error = str(error)
            self.log(f"engine: kvtierd failed at step {self.t} ({error}); continuing on full attention "
                     "from the host copies")
        self.policy = "local"
        self.pending = None

    # ---- selection --------------------------------------------------------
    def _anchor(self):
        keys = self.recent.mean(dim=1)  # [B, L, H, d]
        if self.anchor == "pooled":
            return keys.mean(dim=(1, 2))
        if self.anchor == "layer":
            return keys.mean(dim=2).flatten(1)
        return keys.flatten(1)

    def _send_select(self, next_t, q_by_layer):
        visible = next_t // self.bs + 1
        complete = next_t // self.bs
        if self.policy == "full":
            budget, scorer = complete, "recency"
        else:
            budget, scorer = step_budget(self.fraction, visible) - 1, self.scorer
        anchors = self._anchor()
        extra = self.select_fields(self, q_by_layer) if self.select_fields else [{}] * len(self.contexts)
        entries = [dict({"context_id": c, "anchor": anchors[i], "max_blocks": budget, "scorer": scorer},
                        **extra[i]) for i, c in enumerate(self.contexts)]
        # The first request (right after the prefill) has no decode queries
        # yet and goes without head_queries: the scorer's prior alone.
        if self.retrieval_heads and self.policy == "select" and q_by_layer[self.retrieval_heads[0][0]] is not None:
            queries = torch.stack([q_by_layer[layer][:, head] for layer, head in self.retrieval_heads], dim=1)
            for i, entry in enumerate(entries):
                entry["head_queries"] = queries[i].reshape(-1)
        started = time.perf_counter()
        try:
            self.pending = (self.session.send(entries), started)
        except kvtier.KvTierError as e:
            self._fall_back(e)
        self.select_time += time.perf_counter() - started

    def _await_select(self):
        future, sent = self.pending
        started = time.perf_counter()
        try:
            selections = future.result(timeout_s=30)
            for s in selections:
                s.raise_for_status()
        except kvtier.KvTierError as e:
            self.select_time += time.perf_counter() - started
            self._fall_back(e)
            return None
        now = time.perf_counter()
        self.select_time += now - started
        self.result.select_rtt_s.append(now - sent)
        return selections

    # ---- the attention inputs of one step ----------------------------------
    def _rows_for_step(self):
        """Per sequence, the finished blocks attention reads this step, as flat
        fp16 tensors (arena views or host copies)."""
        complete = self.t // self.bs
        b = len(self.contexts)
        if self.policy in ("full", "select") and self.pending is not None:
            selections = self._await_select()
            if selections is not None:
                rows = []
                for i, sel in enumerate(selections):
                    seq_rows = []
                    for blk in sel.blocks:
                        if blk.residency == kvtier.v1.kvtier_pb2.RESIDENCY_RESIDENT:
                            start = self.arena.element_offset(blk.handle, self.profile)
                            seq_rows.append(self.arena_t[start : start + self.block_elems])
                        elif blk.position < complete:
                            self.result.pending_blocks += 1
                            seq_rows.append(self.host[i, blk.position].view(-1))
                    rows.append(seq_rows)
                return rows
        if self.policy == "oracle":
            keep = step_budget(self.fraction, complete + 1) - 1
            mass = self._probe_mass(complete)
            rows = []
            for i in range(b):
                best = sorted(torch.topk(mass[i], keep).indices.tolist()) if keep < complete else range(complete)
                rows.append([self.host[i, j].view(-1) for j in best])
            return rows
        if self.policy == "window":
            keep = step_budget(self.fraction, complete + 1) - 1
            return [[self.host[i, j].view(-1) for j in range(complete - keep, complete)] for i in range(b)]
        return [[self.host[i, j].view(-1) for j in range(complete)] for i in range(b)]

    def _probe_mass(self, complete):
        """Per sequence and finished block, the attention this step puts on
        it over every block (oracle policy): [B, complete]."""
        engine = self

        class Probe:
            def __init__(self):
                self.partial = engine.partial.clone()
                self.mass = torch.zeros(len(engine.contexts), complete)

            def append(self, layer, k, v):
                j = engine.t % engine.bs
                self.partial[:, layer, 0, :, j] = k
                self.partial[:, layer, 1, :, j] = v

            def attend(self, layer, q):
                m, bs = engine.m, engine.bs
                b, hq, d = q.shape
                hkv = m.num_kv_heads
                kb = engine.host[:, :complete, layer, 0].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).float()
                vb = engine.host[:, :complete, layer, 1].permute(0, 2, 1, 3, 4).reshape(b, hkv, -1, d).float()
                j = engine.t % bs
                k = torch.cat([kb, self.partial[:, layer, 0, :, : j + 1]], dim=2)
                v = torch.cat([vb, self.partial[:, layer, 1, :, : j + 1]], dim=2)
                qg = q.view(b, hkv, m.group, d) / math.sqrt(d)
                p = torch.softmax(qg @ k.transpose(2, 3), dim=-1)  # [B, Hkv, G, N]
                n = complete * bs
                self.mass += p[..., :n].reshape(b, hkv * m.group, complete, bs).sum(-1).mean(1)
                return (p @ v).reshape(b, hq, d)

        probe = Probe()
        positions = torch.full((len(self.contexts),), self.t, dtype=torch.long)
        self.m.decode_step(self.texts[:, self.t], positions, probe)
        return probe.mass

    def _gather(self, rows):
        m, b = self.m, len(rows)
        n = max(len(r) for r in rows)
        self.result.blocks_read += sum(len(r) for r in rows)
        if n == 0:
            self.kb = None
            return
        pad = rows[0][0] if rows[0] else next(r[0] for r in rows if r)
        flat = torch.stack([r[j] if j < len(r) else pad for r in rows for j in range(n)])
        # [B, n, L, 2, H, bs, d] in fp16; attend() takes one layer's K and V
        # (reordering in fp16 before widening is several times faster on CPU).
        self.kb = flat.view(b, n, m.num_layers, 2, m.num_kv_heads, self.bs, m.head_dim)
        valid = torch.zeros(b, n, dtype=torch.bool)
        for i, r in enumerate(rows):
            valid[i, : len(r)] = True
        self.valid_b = valid.repeat_interleave(self.bs, dim=1)

    # ---- kv callbacks of ByteModel.decode_step ------------------------------
    def append(self, layer, k, v):
        j = self.t % self.bs
        self.partial[:, layer, 0, :, j] = k
        self.partial[:, layer, 1, :, j] = v
        self.recent[:, self.t % ANCHOR_TOKENS, layer] = k

    def attend(self, layer, q):
        self.q_by_layer[layer] = q
        if layer == self.m.num_layers - 1:
            self._end_of_keys()
        j = self.t % self.bs
        b = q.shape[0]
        kp = self.partial[:, layer, 0]  # [B, H, bs, d]
        vp = self.partial[:, layer, 1]
        valid_p = torch.zeros(b, self.bs, dtype=torch.bool)
        valid_p[:, : j + 1] = True
        if self.kb is None:
            return attention_over(q, kp, vp, valid_p, self.m.group)
        shape = (b, self.m.num_kv_heads, -1, self.m.head_dim)
        kb = self.kb[:, :, layer, 0].transpose(1, 2).reshape(shape).float()
        vb = self.kb[:, :, layer, 1].transpose(1, 2).reshape(shape).float()
        return attention_two_part(q, kb, vb, self.valid_b, kp, vp, valid_p, self.m.group)

    def _end_of_keys(self):
        """Every key of step t exists: store a finished block, then ask for t+1."""
        j = self.t % self.bs
        if j == self.bs - 1:
            block = self.partial.half()
            self.host[:, self.num_blocks] = block
            if self.policy in ("full", "select"):
                try:
                    for i in range(len(self.contexts)):
                        parent = self.ids[i][-1] if self.ids[i] else b""
                        tokens = self.texts[i, self.t - self.bs + 1 : self.t + 1].tolist()
                        block_id = kvtier.chain_hash(self.profile.profile_id, parent, tokens,
                                                     [self.salt])
                        self.ids[i].append(block_id)
                        self.client.put_blocks(self.profile.profile_id, [(block_id, block[i].numpy())])
                        self.client.append_blocks(self.contexts[i], [block_id])
                except kvtier.KvTierError as e:
                    self._fall_back(e)
            self.num_blocks += 1
        if self.policy in ("full", "select") and self.t + 1 < self.length - 1:
            self._send_select(self.t + 1, self.q_by_layer)

    # ---- the loop -----------------------------------------------------------
    def run(self, texts, cache, max_steps=None, on_step=None):
        """Teacher-forced decode of texts (equal-length int tensors) after the
        cached prompt. Returns a RunResult; prompt positions hold the prefill's
        (full attention) losses."""
        self.result = r = RunResult(len(texts), texts[0].shape[0])
        self._start(texts, cache)
        for i, losses in enumerate(cache.losses):
            r.losses[i, : cache.prompt_tokens] = losses
        self.block_elems = int(np.prod(self.host.shape[2:]))
        self.select_time = 0.0
        if self.policy in ("full", "select"):
            self.q_by_layer = [None] * self.m.num_layers
            self._send_select(self.t, self.q_by_layer)
        end = self.length - 1 if max_steps is None else min(self.length - 1, self.t + max_steps)
        positions = torch.empty(len(texts), dtype=torch.long)
        with torch.no_grad():
            while self.t < end:
                started = time.perf_counter()
                self.select_time = 0.0
                self.q_by_layer = [None] * self.m.num_layers
                self._gather(self._rows_for_step())
                positions.fill_(self.t)
                logits = self.m.decode_step(self.texts[:, self.t], positions, self)
                r.losses[:, self.t] = next_byte_loss(logits, self.texts[:, self.t + 1])
                r.step_s.append(time.perf_counter() - started)
                r.select_s.append(self.select_time)
                r.steps += 1
                self.t += 1
                if on_step is not None:
                    on_step(self)
        self._finish()
        return r

    def _finish(self):
        if self.session is not None:
            if self.pending is not None:
                try:
                    self.pending[0].result(timeout_s=30)
                except kvtier.KvTierError:
                    pass  # the daemon is gone: nothing left to release
            self.session.close()
        if self.result.fallback_step is None and self.policy in ("full", "select"):
            for c in self.contexts:
                if c is not None:
                    self.client.close_context(c)
