"""Marshaling SGLang's target-verify metadata into the kernel's inputs, against straightforward constructions
and a dense attention over SGLang's own layout; the classic bug must show as rel ~ 1."""

from __future__ import annotations

from pathlib import Path

import kdtree_kernel
import pytest
import torch
from kdtree_backend.batch import ancestor_mask, dense_verify_attention, make_verify_batch
from kdtree_backend.marshal import build_verify_keys, extract_draft_mask, verify_keys_capacity
from kdtree_backend.verify import attend, marshal_verify, parity_stats

from tests.backend.helpers import BACKEND_PKG, MARKERS, buggy_marshal_module

Q_LENS = [1, 2, 9, 16, 63, 64, 65, 128]
KINDS = ["tree", "chain", "star"]


def naive_keys(batch) -> list[list[int]]:
    ptr = batch.kv_indptr.tolist()
    keys = []
    for b in range(batch.bs):
        prefix = batch.kv_indices[ptr[b] : ptr[b + 1]].tolist()
        drafts = batch.out_cache_loc[b * batch.q_len : (b + 1) * batch.q_len].tolist()
        keys.append(prefix + drafts)
    return keys


@pytest.mark.parametrize("q_len", Q_LENS)
@pytest.mark.parametrize("kind", KINDS)
def test_keys_are_prefix_then_drafts(q_len: int, kind: str) -> None:
    batch = make_verify_batch(bs=3, prefix=40, q_len=q_len, heads=2, tree=kind, seed=q_len)
    key_indptr, keys = build_verify_keys(batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, q_len)
    expected = naive_keys(batch)
    assert key_indptr.dtype == torch.int32 and keys.dtype == torch.int32
    assert key_indptr.tolist() == [0, *torch.tensor([len(k) for k in expected]).cumsum(0).tolist()]
    for b, want in enumerate(expected):
        assert keys[key_indptr[b] : key_indptr[b + 1]].tolist() == want
    assert keys.numel() == verify_keys_capacity(batch.kv_indices, batch.bs, q_len)


def test_keys_capacity_padding_is_zero_and_overallocated_kv_indices_ignored() -> None:
    batch = make_verify_batch(bs=2, prefix=10, q_len=3, heads=1, seed=1)
    junk = torch.full((50,), 99999, dtype=batch.kv_indices.dtype)
    kv_indices = torch.cat([batch.kv_indices, junk])  # SGLang over-allocates kv_indices
    key_indptr, keys = build_verify_keys(batch.kv_indptr, kv_indices, batch.out_cache_loc, 3, capacity=200)
    used = int(key_indptr[-1])
    assert keys.numel() == 200
    assert keys[used:].eq(0).all()
    assert 99999 not in keys.tolist()


def test_keys_with_empty_prefix() -> None:
    kv_indptr = torch.tensor([0, 0, 2], dtype=torch.int32)
    kv_indices = torch.tensor([7, 8])
    out_cache_loc = torch.tensor([11, 12, 13, 14])
    key_indptr, keys = build_verify_keys(kv_indptr, kv_indices, out_cache_loc, 2)
    assert key_indptr.tolist() == [0, 2, 6]
    assert keys[:6].tolist() == [11, 12, 7, 8, 13, 14]


@pytest.mark.parametrize("q_len", Q_LENS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8])
def test_draft_mask_is_each_requests_ancestor_mask(q_len: int, kind: str, mask_dtype: torch.dtype) -> None:
    batch = make_verify_batch(bs=3, prefix=30, q_len=q_len, heads=1, tree=kind, seed=7 + q_len)
    # Under CUDA graphs SGLang hands a larger uint8 buffer; the tail must not matter.
    custom_mask = torch.cat([batch.custom_mask, torch.ones(97, dtype=torch.bool)]).to(mask_dtype)
    dense = extract_draft_mask(custom_mask, batch.mask_indptr, batch.kv_indptr, q_len)
    assert dense.shape == (batch.tokens, q_len) and dense.dtype == torch.bool
    for b, parents in enumerate(batch.parents):
        assert torch.equal(dense[b * q_len : (b + 1) * q_len], ancestor_mask(parents))


@pytest.mark.parametrize("q_len", [1, 9, 64, 65, 128])
@pytest.mark.parametrize("kind", KINDS)
def test_verify_path_matches_dense_attention(q_len: int, kind: str) -> None:
    batch = make_verify_batch(bs=3, prefix=48, q_len=q_len, heads=4, tree=kind, dtype=torch.float32, seed=q_len)
    meta = marshal_verify(
        batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, batch.custom_mask, batch.mask_indptr, q_len
    )
    out = attend(batch.q[0], batch.kv_buffers[0], meta, batch.qo_indptr, batch.sm_scale, use_kernel=False)
    _, _, rel = parity_stats(out, dense_verify_attention(batch, 0))
    assert rel < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_verify_path_half_precision_within_rounding(dtype: torch.dtype) -> None:
    batch = make_verify_batch(bs=4, prefix=64, q_len=9, heads=8, dtype=dtype, seed=3)
    meta = marshal_verify(
        batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, batch.custom_mask, batch.mask_indptr, 9
    )
    out = attend(batch.q[0], batch.kv_buffers[0], meta, batch.qo_indptr, batch.sm_scale, use_kernel=False)
    assert out.dtype == dtype
    _, _, rel = parity_stats(out, dense_verify_attention(batch, 0))
    assert rel < 1e-2


def test_each_marker_tags_exactly_one_code_line() -> None:
    source = (BACKEND_PKG / "marshal.py").read_text().splitlines()
    for marker in MARKERS.values():
        code_lines = [line for line in source if marker in line and not line.lstrip().startswith("#")]
        assert len(code_lines) == 1, marker


@pytest.mark.parametrize("bug", sorted(MARKERS))
@pytest.mark.parametrize("kind", KINDS)
def test_classic_bug_gives_rel_about_one(bug: str, kind: str, tmp_path: Path) -> None:
    buggy = buggy_marshal_module(bug, tmp_path)
    batch = make_verify_batch(bs=2, prefix=64, q_len=9, heads=8, tree=kind, seed=11)
    key_indptr, keys = buggy.build_verify_keys(batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, 9)
    dense = buggy.extract_draft_mask(batch.custom_mask, batch.mask_indptr, batch.kv_indptr, 9)
    out = kdtree_kernel.verify_attention_reference(
        batch.q[0],
        batch.kv_buffers[0],
        key_indptr,
        keys,
        batch.qo_indptr,
        kdtree_kernel.pack_draft_mask(dense),
        batch.sm_scale,
    )
    _, _, rel = parity_stats(out, dense_verify_attention(batch, 0))
    assert rel > 0.5, f"{bug} bug went unnoticed: rel={rel:.3g}"


def test_classic_bug_drafts_dropped_shows_in_kv_len_max(tmp_path: Path) -> None:
    buggy = buggy_marshal_module("drafts", tmp_path)
    batch = make_verify_batch(bs=1, prefix=21, q_len=9, heads=8, seed=2)
    key_indptr, _ = buggy.build_verify_keys(batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, 9)
    assert int(key_indptr[-1]) == 21  # docs/sglang-verify.md: kv_len_max=21 with a (270,) = 9 x (21 + 9) mask
    good, _ = build_verify_keys(batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, 9)
    assert int(good[-1]) == 30 and int(batch.mask_indptr[-1]) == 270
