"""SGLang-shaped target-verify batches (0.5.23, triton backend, page size 1), built the way SGLang builds them,
and an independent dense attention over them. Used by the replay service and the tests.

What SGLang does, and what this module mirrors:
  * a token pool per layer ``[pool, 1, Dl + Dr]`` (slot 0 reserved for padding), a ``req_to_token`` table;
  * each request's committed prefix lives at ``req_to_token[req, :seq_len]``; ``kv_indices`` is the
    concatenation of those rows (prefix only), ``kv_indptr = cumsum(seq_lens)``;
  * the draft tokens get fresh slots ``out_cache_loc`` (also written to ``req_to_token[req, seq_len:]``), and
    their K/V are saved to the pool there before attention runs;
  * ``custom_mask`` per request is row-major ``[q_len, seq_len + q_len]``: prefix columns true, then the draft
    tree's ancestor mask; ``mask_indptr = cumsum(q_len * (seq_len + q_len))``;
  * ``sm_scale`` is the layer's scaling: ``qk_head_dim ** -0.5`` times the YaRN mscale squared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from kdtree_kernel.mask import ancestor_mask

DL = 512  # kv_lora_rank: the latent part, also the value
DR = 64  # qk_rope_head_dim
D = DL + DR


def mla_softmax_scale(qk_head_dim: int = 192, rope_factor: float = 64.0, mscale_all_dim: float = 1.0) -> float:
    """DeepSeek/Kimi ``layer.scaling`` (qk_head_dim 128 nope + 64 rope, YaRN): 0.14468 for the defaults."""
    mscale = 0.1 * mscale_all_dim * math.log(rope_factor) + 1.0 if rope_factor > 1 else 1.0
    return qk_head_dim**-0.5 * mscale * mscale


def draft_parents(q_len: int, kind: str, gen: torch.Generator) -> list[int]:
    """Parent of each draft node in topological order (node 0 is the root, parent -1).

    ``tree`` grows a DDTree-like tree: each new node hangs under one of the nodes so far, preferring recent
    ones (deep branches with side shoots, like a best-first expansion of draft distributions)."""
    if kind == "chain":
        return [i - 1 for i in range(q_len)]
    if kind == "star":
        return [-1] + [0] * (q_len - 1)
    if kind != "tree":
        raise ValueError(f"unknown tree kind {kind!r}: use tree, chain or star")
    parents = [-1]
    for i in range(1, q_len):
        lo = max(0, i - 4)
        parents.append(int(torch.randint(lo, i, (1,), generator=gen)))
    return parents


@dataclass
class VerifyBatch:
    """One target-verify step as SGLang's triton backend sees it, for several layers."""

    bs: int
    q_len: int
    heads: int
    layers: tuple[int, ...]
    seq_lens: torch.Tensor  # int64 [bs], prefix only
    req_pool_indices: torch.Tensor  # int64 [bs]
    req_to_token: torch.Tensor  # int32 [req pool, max context]
    kv_indptr: torch.Tensor  # int32 [bs + 1]
    kv_indices: torch.Tensor  # int64 [sum seq_lens], prefix only
    out_cache_loc: torch.Tensor  # int64 [T]
    qo_indptr: torch.Tensor  # int32 [bs + 1]
    custom_mask: torch.Tensor  # bool, flattened
    mask_indptr: torch.Tensor  # int64 [bs + 1]
    sm_scale: float
    kv_buffers: dict[int, torch.Tensor]  # layer -> [pool, 1, D]
    q: dict[int, torch.Tensor]  # layer -> [T, H, D]
    parents: list[list[int]]

    @property
    def tokens(self) -> int:
        return self.bs * self.q_len

    def metadata(self) -> dict[str, object]:
        """The verify metadata as SGLang's backend hands it to ``VerifyEngine.prepare`` (keyword arguments)."""
        return {
            "kv_indptr": self.kv_indptr,
            "kv_indices": self.kv_indices,
            "out_cache_loc": self.out_cache_loc,
            "custom_mask": self.custom_mask,
            "mask_indptr": self.mask_indptr,
            "qo_indptr": self.qo_indptr,
            "bs": self.bs,
        }

    def k_extend(self, layer: int) -> torch.Tensor:
        """The drafts' K as handed to forward_extend: ``[T, 1, D]`` (V is its first DL dims)."""
        return self.kv_buffers[layer][self.out_cache_loc]


def make_verify_batch(
    *,
    bs: int,
    prefix: int,
    q_len: int,
    heads: int,
    layers: tuple[int, ...] = (0,),
    tree: str = "tree",
    ragged: bool = True,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
    seed: int = 0,
    sm_scale: float | None = None,
    draft_affinity: float = 6.0,
    query_noise: float = 0.5,
) -> VerifyBatch:
    """A random SGLang-shaped verify batch. Request 0 has the full ``prefix``; with ``ragged`` the others
    draw theirs from ``[max(1, prefix // 2), prefix]``.

    Queries are ``query_noise * N(0, 1)`` plus ``draft_affinity`` times the (normalised) sum of their request's
    draft keys: like a real LM attending to its most recent tokens, a good share of the attention mass falls
    on the drafts, so that a verify path which loses or mis-masks them (the classic bug) shows rel ~ 1 instead
    of drowning in attention spread over random prefix keys."""
    if bs < 1 or prefix < 1 or q_len < 1 or heads < 1:
        raise ValueError(f"bs, prefix, q_len and heads must be >= 1, got {bs}, {prefix}, {q_len}, {heads}")
    gen = torch.Generator().manual_seed(seed)
    prefix_lens = [prefix] + [
        int(torch.randint(max(1, prefix // 2), prefix + 1, (1,), generator=gen)) if ragged else prefix
        for _ in range(bs - 1)
    ]
    tokens = bs * q_len
    used = sum(prefix_lens) + tokens
    # Pool size depends on the arguments only (not on the drawn prefixes), so shapes stay stable per service.
    pool = (bs * (prefix + q_len)) * 3 // 2 + 1
    # Slots as an allocator hands them out after some churn: a random permutation, slot 0 never used.
    free = (torch.randperm(pool - 1, generator=gen) + 1)[:used]
    req_pool = bs + 3
    req_pool_indices = (torch.randperm(req_pool, generator=gen)[:bs]).long()
    max_context = prefix + q_len
    req_to_token = torch.zeros(req_pool, max_context, dtype=torch.int32)

    cursor = 0
    prefix_rows = []
    for b, plen in enumerate(prefix_lens):
        rows = free[cursor : cursor + plen]
        cursor += plen
        req_to_token[req_pool_indices[b], :plen] = rows.int()
        prefix_rows.append(rows)
    out_cache_loc = free[cursor : cursor + tokens].long()
    for b, plen in enumerate(prefix_lens):  # prepare_for_verify: drafts follow the prefix in req_to_token
        req_to_token[req_pool_indices[b], plen : plen + q_len] = out_cache_loc[b * q_len : (b + 1) * q_len].int()

    seq_lens = torch.tensor(prefix_lens, dtype=torch.long)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0).int()
    kv_indices = torch.cat([req_to_token[req_pool_indices[b], :plen] for b, plen in enumerate(prefix_lens)]).long()
    qo_indptr = torch.arange(0, (bs + 1) * q_len, q_len, dtype=torch.int32)

    parents = [draft_parents(q_len, tree, gen) for _ in range(bs)]
    blocks = []
    for b, plen in enumerate(prefix_lens):
        block = torch.ones(q_len, plen + q_len, dtype=torch.bool)
        block[:, plen:] = ancestor_mask(parents[b])
        blocks.append(block.reshape(-1))
    custom_mask = torch.cat(blocks)
    mask_indptr = torch.zeros(bs + 1, dtype=torch.long)
    mask_indptr[1:] = torch.cumsum(q_len * (seq_lens + q_len), 0)

    kv_buffers: dict[int, torch.Tensor] = {}
    q: dict[int, torch.Tensor] = {}
    for layer in layers:
        buf = torch.randn(pool, 1, D, generator=gen).to(dtype)
        buf[0] = 0
        draft_k = torch.randn(tokens, 1, D, generator=gen).to(dtype)
        buf[out_cache_loc] = draft_k  # "save KV cache first": drafts are in the pool before attention
        kv_buffers[layer] = buf.to(device)
        drafts_dir = draft_k.float().view(bs, q_len, D).sum(1, keepdim=True) / math.sqrt(q_len * D)
        noise = torch.randn(bs, q_len, heads, D, generator=gen)
        queries = query_noise * noise + draft_affinity * drafts_dir[:, :, None, :]
        q[layer] = queries.reshape(tokens, heads, D).to(dtype).to(device)

    def dev(t: torch.Tensor) -> torch.Tensor:
        return t.to(device)

    return VerifyBatch(
        bs=bs,
        q_len=q_len,
        heads=heads,
        layers=tuple(layers),
        seq_lens=dev(seq_lens),
        req_pool_indices=dev(req_pool_indices),
        req_to_token=dev(req_to_token),
        kv_indptr=dev(kv_indptr),
        kv_indices=dev(kv_indices),
        out_cache_loc=dev(out_cache_loc),
        qo_indptr=dev(qo_indptr),
        custom_mask=dev(custom_mask),
        mask_indptr=dev(mask_indptr),
        sm_scale=mla_softmax_scale() if sm_scale is None else sm_scale,
        kv_buffers=kv_buffers,
        q=q,
        parents=parents,
    )


def dense_verify_attention(batch: VerifyBatch, layer: int) -> torch.Tensor:
    """Independent fp32 attention straight from SGLang's layout (req_to_token rows ++ out_cache_loc, the
    request's ``[q_len, seq_len + q_len]`` mask block). Returns float32 ``[T, H, DL]``."""
    q_all = batch.q[layer].float()
    pool = batch.kv_buffers[layer].reshape(batch.kv_buffers[layer].shape[0], -1).float()
    out = torch.empty(batch.tokens, batch.heads, DL, dtype=torch.float32, device=q_all.device)
    seq_lens = batch.seq_lens.tolist()
    mask_ptr = batch.mask_indptr.tolist()
    for b, seq_len in enumerate(seq_lens):
        req = int(batch.req_pool_indices[b])
        drafts = batch.out_cache_loc[b * batch.q_len : (b + 1) * batch.q_len]
        rows = torch.cat([batch.req_to_token[req, :seq_len].long(), drafts.long()])
        keys = pool[rows]
        visible = batch.custom_mask[mask_ptr[b] : mask_ptr[b + 1]].view(batch.q_len, seq_len + batch.q_len)
        queries = q_all[b * batch.q_len : (b + 1) * batch.q_len]
        scores = torch.einsum("thd,sd->ths", queries, keys) * batch.sm_scale
        scores = scores.masked_fill(~visible.bool()[:, None, :], float("-inf"))
        out[b * batch.q_len : (b + 1) * batch.q_len] = torch.einsum(
            "ths,sd->thd", torch.softmax(scores, dim=-1), keys[:, :DL]
        )
    return out
