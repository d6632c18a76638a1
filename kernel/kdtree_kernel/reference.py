"""Pure-torch reference of the DDTree verify attention (fp32 math). The contract every path must meet.

Inputs (all on one device):
  q           [T, H, D]         D = Dl + Dr (576 for Kimi K2.6 / DeepSeek MLA, absorbed)
  kv_buffer   [pool, D] or [pool, 1, D]  keys; values are the first Dl dims of the same rows
  kv_indptr   [bs + 1] int32    request b's keys are kv_indices[kv_indptr[b]:kv_indptr[b+1]]
  kv_indices  [nnz] int32       per request: prefix rows, then its q_len draft rows (topological order)
  qo_indptr   [bs + 1] int32    request b's queries are q[qo_indptr[b]:qo_indptr[b+1]] (q_len each)
  draft_mask  [T, W] int64      bit j of row t: query t sees draft j of its own request (see mask.py)
  sm_scale    float
  k_scale, v_scale  descales of an fp8 pool (float8_e4m3fn): keys = rows * k_scale, values = rows[:Dl] * v_scale
Output [T, H, Dl] in q's dtype; optionally the natural-log LSE [T, H] float32 of the scaled scores.
"""

from __future__ import annotations

import torch

from .mask import unpack_draft_mask


def verify_attention_reference(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    qo_indptr: torch.Tensor,
    draft_mask: torch.Tensor,
    sm_scale: float,
    *,
    v_head_dim: int = 512,
    return_lse: bool = False,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    kv = kv_buffer.reshape(kv_buffer.shape[0], -1)
    t_total, heads, _ = q.shape
    out = torch.empty(t_total, heads, v_head_dim, dtype=q.dtype, device=q.device)
    lse = torch.empty(t_total, heads, dtype=torch.float32, device=q.device)
    kv_ptr = kv_indptr.tolist()
    qo_ptr = qo_indptr.tolist()
    for b in range(len(qo_ptr) - 1):
        q0, q1 = qo_ptr[b], qo_ptr[b + 1]
        q_len = q1 - q0
        if q_len == 0:
            continue
        rows = kv_indices[kv_ptr[b] : kv_ptr[b + 1]].long()
        prefix = rows.numel() - q_len
        if prefix < 0:
            raise ValueError(f"request {b}: {rows.numel()} keys < q_len {q_len}; keys must include the drafts")
        stored = kv[rows].float()  # [S, D]: dequantized exactly (an fp8 pool widens to fp32 without rounding)
        keys = stored * k_scale
        values = stored[:, :v_head_dim] * v_scale
        scores = torch.einsum("thd,sd->ths", q[q0:q1].float(), keys) * sm_scale
        visible = torch.ones(q_len, rows.numel(), dtype=torch.bool, device=q.device)
        visible[:, prefix:] = unpack_draft_mask(draft_mask[q0:q1], q_len)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        lse[q0:q1] = torch.logsumexp(scores, dim=-1)
        out[q0:q1] = torch.einsum("ths,sd->thd", torch.softmax(scores, dim=-1), values).to(q.dtype)
    return (out, lse) if return_lse else out
