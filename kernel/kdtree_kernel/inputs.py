"""Checks of the verify inputs that need their values (a host read), run outside CUDA-graph capture.

Under capture nothing can be read back, so the kernel guards itself instead: a request whose ``kv_indptr``
entries are malformed reads no key and gets zeros (LSE -inf) for its rows (``request_keys`` in
csrc/verify_attention.h). Outside capture the op refuses such a batch with this error before launching.
"""

from __future__ import annotations

import torch


class MalformedKeys(ValueError):
    """A request's ``kv_indptr`` range cannot hold its keys: fewer keys than ``q_len``, or outside ``kv_indices``."""


def key_lengths(kv_indptr: torch.Tensor, q_len: int, num_indices: int) -> list[int]:
    """Keys per request from ``kv_indptr`` (one host read); raises :class:`MalformedKeys` for a malformed one.

    Each request's keys are its prefix rows and then its ``q_len`` draft rows, so it must have at least ``q_len``
    keys; its range must lie inside ``kv_indices`` (``num_indices`` entries)."""
    ptr = [int(x) for x in kv_indptr.tolist()]
    if not ptr:
        raise MalformedKeys("kv_indptr is empty: it needs bs + 1 entries")
    if ptr[0] < 0:
        raise MalformedKeys(f"kv_indptr[0] = {ptr[0]} is negative")
    lens: list[int] = []
    for b in range(len(ptr) - 1):
        n = ptr[b + 1] - ptr[b]
        if n < q_len:
            raise MalformedKeys(
                f"request {b} has {n} keys (kv_indptr[{b}:{b + 2}] = {ptr[b]}, {ptr[b + 1]}) but q_len is {q_len}: "
                "kv_indptr must count each request's prefix and its q_len draft tokens"
            )
        lens.append(n)
    if ptr[-1] > num_indices:
        raise MalformedKeys(f"kv_indptr ends at {ptr[-1]}, past the {num_indices} entries of kv_indices")
    return lens
