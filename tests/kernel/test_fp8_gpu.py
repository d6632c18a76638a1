"""The fp8 KV path (SGLang --kv-cache-dtype fp8_e4m3: a float8_e4m3fn pool with its scale) against the fp32
reference on the dequantized pool (runs on the GPU machine; skips elsewhere)."""

from __future__ import annotations

import dataclasses
import zlib

import pytest
import torch
from kdtree_kernel.testing import capture_graph, make_case, rel_error

from tests.gpu_helpers import NEEDS_EXTENSION, nan_outputs, workspace

pytestmark = list(NEEDS_EXTENSION)

SM_SCALE = 0.14468
REL_TOL = 1e-2
FP8 = torch.float8_e4m3fn
# 1.0: SGLang's default when a checkpoint carries no KV scales (values near 1, many e4m3 subnormals);
# 1 / 32: a calibrated scale (values up to ~200 of e4m3's 448).
SCALES = (1.0, 1 / 32)
# (bs, prefix, q_len, heads, kind, ragged): every row-group count, both warp layouts, split and unsplit KV,
# prefixes from none to 64k, drafts from 1 to 128, heads from 8 to 128.
SHAPES = [
    (1, 0, 9, 8, "tree", False),
    (3, 17, 1, 8, "chain", True),
    (2, 3000, 2, 8, "tree", True),
    (2, 3000, 2, 16, "tree", True),
    (3, 3000, 5, 8, "tree", True),
    (1, 5000, 9, 8, "tree", False),
    (8, 8192, 9, 8, "tree", True),
    (64, 1500, 9, 8, "chain", True),
    (1, 65536, 9, 8, "tree", False),
    (1, 131072, 2, 8, "tree", False),
    (4, 3000, 16, 16, "star", True),
    (3, 1000, 33, 16, "tree", True),
    (8, 300, 128, 8, "tree", True),
    (2, 70, 16, 128, "chain", True),
    (8, 1000, 64, 16, "tree", True),
]


def _run(case, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = nan_outputs(case.bs * case.q_len, case.heads)
    case.run_kernel(SM_SCALE, out=out, lse=lse, **kwargs)
    return out, lse


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize(("bs", "prefix", "q_len", "heads", "kind", "ragged"), SHAPES)
def test_fp8_matches_reference(
    bs: int, prefix: int, q_len: int, heads: int, kind: str, ragged: bool, scale: float
) -> None:
    seed = zlib.crc32(repr((bs, prefix, q_len, heads, kind, ragged, scale)).encode())
    case = make_case(bs, prefix, q_len, heads, kind=kind, ragged=ragged, seed=seed, kv_dtype=FP8, kv_scale=scale)
    out, lse = _run(case)
    ref, ref_lse = case.reference(SM_SCALE, return_lse=True)
    assert not out.isnan().any(), "some output elements were not written"
    err = rel_error(out, ref)
    print(f"fp8 bs={bs} prefix={prefix} q_len={q_len} H={heads} scale={scale:g}: rel err {err:.3e}")
    assert err <= REL_TOL, f"rel err {err:.3e}"
    assert torch.allclose(lse, ref_lse, atol=2e-2, rtol=1e-3), f"lse max diff {(lse - ref_lse).abs().max():.3e}"


def test_fp8_matches_bf16_kernel_on_the_dequantized_pool() -> None:
    """Both paths compute the same function (the fp8 one on fp16 operands): their outputs agree far closer than
    either is to a tolerance."""
    case = make_case(4, 4000, 9, 8, ragged=True, seed=21, kv_dtype=FP8, kv_scale=1 / 32)
    out8, _ = _run(case)
    out16, _ = _run(dataclasses.replace(case, kv_buffer=case.kv_dequantized(), kv_scale=1.0))
    assert rel_error(out8, out16) <= 5e-3


def test_fp8_distinct_k_and_v_scales() -> None:
    case = make_case(2, 2000, 9, 8, ragged=True, seed=5, kv_dtype=FP8, kv_scale=1 / 16)
    out, _ = _run(case, k_scale=1 / 16, v_scale=0.37)
    ref = case.reference(SM_SCALE, k_scale=1 / 16, v_scale=0.37)
    assert rel_error(out, ref) <= REL_TOL


def test_fp8_int64_indices_and_2d_pool() -> None:
    case = make_case(3, 1000, 9, 16, ragged=True, index_dtype=torch.int64, seed=7, kv_dtype=FP8, kv_scale=1 / 32)
    case.kv_buffer = case.kv_buffer.view(-1, 576)
    out, _ = _run(case)
    assert rel_error(out, case.reference(SM_SCALE)) <= REL_TOL


@pytest.mark.parametrize(("bs", "prefix", "q_len", "heads"), [(1, 8192, 9, 8), (64, 1000, 9, 8), (4, 3000, 2, 8)])
def test_fp8_cuda_graph_replay_matches_eager(bs: int, prefix: int, q_len: int, heads: int) -> None:
    case = make_case(bs, prefix, q_len, heads, ragged=True, seed=5, kv_dtype=FP8, kv_scale=1 / 32)
    bound = prefix + 1000
    t = bs * q_len
    out = torch.empty(t, heads, 512, dtype=torch.bfloat16, device="cuda")
    ws = workspace(bs, q_len, heads, bound, fp8=True)

    def call() -> None:
        case.run_kernel(SM_SCALE, max_prefix_len=bound, out=out, workspace=ws)

    graph = capture_graph(call)
    for step in range(2):
        fresh = (torch.randn(case.kv_buffer.shape, device="cuda") * 32).to(FP8)
        case.kv_buffer.copy_(fresh)  # a new pool in place, as SGLang writes between replays
        graph.replay()
        torch.cuda.synchronize()
        got = out.clone()
        call()
        torch.cuda.synchronize()
        assert torch.equal(got, out), f"replay {step} differs from eager"
        assert rel_error(got, case.reference(SM_SCALE)) <= REL_TOL


def test_fp8_prefix_longer_than_planned_bound_keeps_every_key() -> None:
    """The e4m3 kernel spreads its chunks over a request longer than the planned bound as the bf16 one does."""
    case = make_case(1, 8192, 2, 8, seed=13, kv_dtype=FP8, kv_scale=1 / 32)
    bound = 500
    out = torch.full((2, 8, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    ws = workspace(1, 2, 8, bound, fp8=True)
    case.run_kernel(SM_SCALE, max_prefix_len=bound, out=out, workspace=ws)
    assert rel_error(out, case.reference(SM_SCALE)) <= REL_TOL
