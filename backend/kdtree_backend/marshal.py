"""SGLang target-verify metadata -> the kernel's inputs. The one place where keys and mask rows are built.

SGLang (0.5.23, triton backend, TARGET_VERIFY) hands the attention backend:
  * ``kv_indptr`` / ``kv_indices``: the committed **prefix only** of each request (seq_lens excludes drafts);
  * the draft tokens' pool rows as ``out_cache_loc`` (``q_len`` per request, K/V already written there);
  * ``custom_mask``: per request a row-major ``[q_len, prefix + q_len]`` block (prefix columns all true,
    then the tree's ancestor mask), blocks laid back to back at ``mask_indptr``.
The kernel wants, per request, keys = prefix rows ++ draft rows, and a ``[T, q_len]`` draft mask.

Both functions are pure tensor code with static output shapes: no host synchronisation, so they run in
SGLang's CUDA-graph metadata hooks, on CPU in the replay service, and in the tests alike.

The classic bug (docs/sglang-verify.md) is one line away, on purpose, so that the deploy tests can build a broken
release by editing a copy of this file. Each marked line is a complete statement of its own: delete it, or
replace it by ``pass`` (keeping the indentation), and the code still runs, wrongly:
  * the line tagged kdtree:drafts-appended (``key_lens += q_len``): without it the keys are the prefix only; the kernel
    then takes the last q_len prefix rows for the drafts and the shapes line shows ``kv_len_max`` = prefix;
  * the line tagged kdtree:row-stride (``row_stride += q_len``): without it the mask rows are read with stride prefix
    instead of prefix + q_len.
Either edit makes parity report rel ~ 1 (tests/backend/test_marshal.py and test_replay.py check both).
"""

from __future__ import annotations

import torch


def _prefix_lens(kv_indptr: torch.Tensor) -> torch.Tensor:
    return (kv_indptr[1:] - kv_indptr[:-1]).long()


def _non_empty(values: torch.Tensor) -> torch.Tensor:
    """``values`` with one zero appended, so that clamped gathers stay in bounds when it is empty."""
    return torch.cat([values.reshape(-1), values.new_zeros(1)])


def verify_keys_capacity(kv_indices: torch.Tensor, bs: int, q_len: int) -> int:
    """A key-list length that always suffices: every prefix slot SGLang allocated plus the drafts."""
    return kv_indices.numel() + bs * q_len


def build_verify_keys(
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    q_len: int,
    capacity: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per request keys = prefix ``kv_indices`` ++ the request's ``q_len`` ``out_cache_loc`` slots.

    Args:
      kv_indptr: ``[bs + 1]`` prefix offsets into ``kv_indices`` (SGLang's, prefix only).
      kv_indices: pool rows of the prefixes (may be longer than ``kv_indptr[-1]``: SGLang over-allocates).
      out_cache_loc: ``[bs * q_len]`` pool rows of the drafts, request-major.
      capacity: length of the returned key list (static, for CUDA graphs); default
        :func:`verify_keys_capacity`. Entries past the last request are 0.
    Returns:
      ``(key_indptr int32 [bs + 1], keys int32 [capacity])``.
    """
    bs = kv_indptr.numel() - 1
    device = kv_indptr.device
    if capacity is None:
        capacity = verify_keys_capacity(kv_indices, bs, q_len)
    prefix_lens = _prefix_lens(kv_indptr)
    key_lens = prefix_lens.clone()
    key_lens += q_len  # kdtree:drafts-appended
    key_indptr = torch.zeros(bs + 1, dtype=torch.long, device=device)
    key_indptr[1:] = torch.cumsum(key_lens, dim=0)

    pos = torch.arange(capacity, dtype=torch.long, device=device)
    req = torch.searchsorted(key_indptr[1:], pos, right=True).clamp_(max=max(bs - 1, 0))
    offset = pos - key_indptr[req]
    prefix_rows = _non_empty(kv_indices.long())
    draft_rows = _non_empty(out_cache_loc.long())
    from_prefix = offset < prefix_lens[req]
    prefix_at = (kv_indptr.long()[req] + offset).clamp_(0, prefix_rows.numel() - 1)
    draft_at = (req * q_len + offset - prefix_lens[req]).clamp_(0, draft_rows.numel() - 1)
    keys = torch.where(from_prefix, prefix_rows[prefix_at], draft_rows[draft_at])
    keys = torch.where(pos < key_indptr[-1], keys, torch.zeros_like(keys))
    return key_indptr.to(torch.int32), keys.to(torch.int32)


def extract_draft_mask(
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    q_len: int,
) -> torch.Tensor:
    """The draft block of SGLang's flattened ``custom_mask``: bool ``[bs * q_len, q_len]``.

    Row ``t`` of request ``b`` starts at ``mask_indptr[b] + t * (prefix_b + q_len)``; its draft columns
    follow the ``prefix_b`` prefix columns. ``custom_mask`` may be bool (eager) or uint8 (CUDA graphs) and
    longer than the batch needs (SGLang's preallocated graph buffer).
    """
    bs = kv_indptr.numel() - 1
    device = kv_indptr.device
    prefix_lens = _prefix_lens(kv_indptr)
    row_stride = prefix_lens.clone()
    row_stride += q_len  # kdtree:row-stride
    token = torch.arange(bs * q_len, dtype=torch.long, device=device)
    req = token // q_len
    row = token % q_len
    start = mask_indptr.long()[req] + row * row_stride[req] + prefix_lens[req]
    at = start[:, None] + torch.arange(q_len, dtype=torch.long, device=device)[None, :]
    flat = _non_empty(custom_mask)
    return flat[at.clamp_(0, flat.numel() - 1)] != 0
