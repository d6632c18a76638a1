"""Which pool rows a captured verify step reads, and SGLang's index lists remapped to them (pure tensor code, the
same on CPU and CUDA; docs/capture.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StepRows:
    """Which pool rows one verify step reads, and SGLang's index lists remapped to them.

    Rows are laid out request by request, prefix then drafts: that is the order a correct marshaling reads them,
    built here straight from SGLang's lists (not from the running release's marshaling, which may be the bug)."""

    rows: torch.Tensor  # int64 [R]: pool rows, R = sum(prefix) + bs * q_len
    kv_indices: torch.Tensor  # int32 [sum(prefix)]: positions in rows
    out_cache_loc: torch.Tensor  # int64 [bs * q_len]: positions in rows


def step_rows(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, out_cache_loc: torch.Tensor, q_len: int) -> StepRows:
    """Gather plan of one step (one host read: the prefix total)."""
    bs = kv_indptr.numel() - 1
    device = kv_indptr.device
    indptr = kv_indptr.long()
    n_prefix = int(indptr[-1])
    tokens = bs * q_len
    prefix_lens = indptr[1:] - indptr[:-1]
    req_of_prefix = torch.repeat_interleave(torch.arange(bs, device=device), prefix_lens, output_size=n_prefix)
    prefix_pos = torch.arange(n_prefix, device=device) + req_of_prefix * q_len
    token = torch.arange(tokens, device=device)
    draft_pos = indptr[1:][token // q_len] + (token // q_len) * q_len + token % q_len
    rows = torch.empty(n_prefix + tokens, dtype=torch.long, device=device)
    rows[prefix_pos] = kv_indices[:n_prefix].long()
    rows[draft_pos] = out_cache_loc[:tokens].long()
    return StepRows(rows=rows, kv_indices=prefix_pos.to(torch.int32), out_cache_loc=draft_pos)


def remap_keys(keys: torch.Tensor, rows: torch.Tensor, pool_rows: int) -> torch.Tensor:
    """Pool rows in ``keys`` -> their positions in ``rows``; -1 for a row the step does not read."""
    inverse = torch.full((pool_rows,), -1, dtype=torch.int32, device=rows.device)
    inverse[rows] = torch.arange(rows.numel(), dtype=torch.int32, device=rows.device)
    return inverse[keys.long().clamp(0, pool_rows - 1)]


def nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def storage_view(pool: torch.Tensor) -> torch.Tensor:
    """A float8 pool as bytes (not every device build indexes or copies float8 tensors); others as they are."""
    return pool.view(torch.uint8) if pool.element_size() == 1 and pool.dtype.is_floating_point else pool


def gather_rows(pool: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``pool[rows]``; a float8 pool is gathered as bytes (not every device build indexes float8 tensors)."""
    return storage_view(pool)[rows].view(pool.dtype)
