"""Draft-tree masks: the dense ancestor mask of a tree, and its packed form (bit j of word j // 64 in row t says
query token t sees draft token j)."""

from __future__ import annotations

import torch

WORD_BITS = 64


def mask_words(q_len: int) -> int:
    """Number of int64 words per query row for a draft block of ``q_len`` tokens."""
    if q_len < 1:
        raise ValueError(f"q_len must be >= 1, got {q_len}")
    return (q_len + WORD_BITS - 1) // WORD_BITS


def pack_draft_mask(dense: torch.Tensor) -> torch.Tensor:
    """Pack a boolean draft mask ``[T, q_len]`` (row t: which drafts of its own request query t sees)
    into int64 words ``[T, mask_words(q_len)]``. Works on any device; no host synchronisation."""
    if dense.dim() != 2:
        raise ValueError(f"dense draft mask must be [T, q_len], got shape {tuple(dense.shape)}")
    t, q_len = dense.shape
    words = mask_words(q_len)
    padded = torch.zeros(t, words * WORD_BITS, dtype=torch.int64, device=dense.device)
    padded[:, :q_len] = dense.to(torch.int64)
    shifts = torch.arange(WORD_BITS, device=dense.device, dtype=torch.int64)
    # Distinct powers of two: the sum equals the bitwise OR, and int64 wrap-around makes bit 63 come out right.
    return (padded.view(t, words, WORD_BITS) << shifts).sum(dim=-1)


def unpack_draft_mask(packed: torch.Tensor, q_len: int) -> torch.Tensor:
    """Inverse of :func:`pack_draft_mask`: ``[T, words]`` int64 -> bool ``[T, q_len]``."""
    t, words = packed.shape
    if words != mask_words(q_len):
        raise ValueError(f"packed mask has {words} words per row, q_len={q_len} needs {mask_words(q_len)}")
    shifts = torch.arange(WORD_BITS, device=packed.device, dtype=torch.int64)
    bits = (packed.unsqueeze(-1) >> shifts) & 1
    return bits.view(t, words * WORD_BITS)[:, :q_len].bool()


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """bool [n, n]: row i sees column j iff j is i or one of its ancestors."""
    n = len(parents)
    visible = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            visible[i, j] = True
            j = parents[j]
    return visible
