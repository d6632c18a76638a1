"""A torch stand-in for SGLang's Triton ``extend_attention_fwd`` in target-verify use (CPU tests): prefix keys
from ``kv_indices``, the drafts from ``k_extend``/``v_extend``, mask rows from ``custom_mask``; requests with
zero query rows (``qo_indptr``) are skipped, as the Triton programs return at once for them."""

from __future__ import annotations

import torch


def extend_attention_emulated(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor,
    v_extend: torch.Tensor,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    custom_mask: torch.Tensor,
    is_causal: bool,
    mask_indptr: torch.Tensor,
    max_len_extend: int,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    sm_scale: float | None = None,
    **_: object,
) -> None:
    qo, kv, mp = qo_indptr.tolist(), kv_indptr.tolist(), mask_indptr.tolist()
    keys_pool = k_buffer.reshape(k_buffer.shape[0], -1).float()
    vals_pool = v_buffer.reshape(v_buffer.shape[0], -1).float()
    dv = o_extend.shape[-1]
    for b in range(len(qo) - 1):
        n = qo[b + 1] - qo[b]
        if n <= 0:
            continue
        rows = kv_indices[kv[b] : kv[b + 1]].long()
        prefix = rows.numel()
        keys = torch.cat([keys_pool[rows], k_extend[qo[b] : qo[b + 1]].reshape(n, -1).float()])
        vals = torch.cat([vals_pool[rows][:, :dv], v_extend[qo[b] : qo[b + 1]].reshape(n, -1).float()[:, :dv]])
        visible = custom_mask[mp[b] : mp[b] + n * (prefix + n)].view(n, prefix + n).bool()
        scores = torch.einsum("thd,sd->ths", q_extend[qo[b] : qo[b + 1]].float(), keys) * float(sm_scale or 1.0)
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        o_extend[qo[b] : qo[b + 1]] = torch.einsum("ths,sd->thd", scores.softmax(-1), vals).to(o_extend.dtype)
