"""The CUDA verify kernel against the fp32 reference (runs on the GPU machine; skips elsewhere)."""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch
from kdtree_kernel import launch_plan, workspace_size
from kdtree_kernel.testing import capture_graph, make_case, rel_error

from tests.gpu_helpers import NEEDS_EXTENSION, nan_outputs, workspace

pytestmark = list(NEEDS_EXTENSION)

SM_SCALE = 0.14468
REL_TOL = 1e-2
BS = (1, 3, 8, 64)
PREFIX = (0, 1, 17, 1000, 8192, 65536)
Q_LEN = (1, 2, 9, 16, 33, 64, 128)
HEADS = (8, 16, 64, 128)
# Score elements (T * H * keys) beyond which a sweep point is left out to keep the suite to minutes.
MAX_SCORE_ELEMENTS = 3e9


def _sweep() -> list[tuple[int, int, int, int, str, bool]]:
    """Every value of every axis appears; all small combinations run, large ones are sampled."""
    cases: set[tuple[int, int, int, int, str, bool]] = set()
    kinds = ("tree", "chain", "star")
    for i, (q_len, heads) in enumerate(itertools.product(Q_LEN, HEADS)):
        cases.add((3, 17, q_len, heads, kinds[i % 3], True))
        cases.add((1, 0, q_len, heads, "tree", False))
    for i, (bs, prefix) in enumerate(itertools.product(BS, PREFIX)):
        cases.add((bs, prefix, 9, 8, kinds[i % 3], True))
        cases.add((bs, prefix, 16, 16, "tree", bs > 1))
    for bs, prefix in itertools.product(BS, (1000, 8192)):
        for q_len, heads in ((33, 64), (64, 16), (128, 8), (2, 128)):
            cases.add((bs, prefix, q_len, heads, "tree", True))
    cases.update({(1, 65536, 128, 128, "tree", False), (8, 8192, 128, 128, "tree", True)})
    cases.update({(64, 8192, 9, 8, "chain", False), (1, 8192, 1, 8, "chain", False)})
    return sorted(c for c in cases if c[0] * c[2] * c[3] * (c[1] + c[2]) <= MAX_SCORE_ELEMENTS)


def _reference(case, sm_scale: float = SM_SCALE):
    return case.reference(sm_scale, return_lse=True)


def _run(case, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = nan_outputs(case.bs * case.q_len, case.heads)
    case.run_kernel(SM_SCALE, out=out, lse=lse, **kwargs)
    return out, lse


def _assert_matches(
    out: torch.Tensor, lse: torch.Tensor, ref: torch.Tensor, ref_lse: torch.Tensor, context: str = ""
) -> None:
    """The output within REL_TOL of the fp32 reference, and the LSE within 2e-2 (+ 1e-3 relative); ``context``
    leads the failure message (which replay, which launch form)."""
    err = rel_error(out, ref)
    assert err <= REL_TOL, f"{context}rel err {err:.3e}"
    assert torch.allclose(lse, ref_lse, atol=2e-2, rtol=1e-3), (
        f"{context}lse max diff {(lse - ref_lse).abs().max():.3e}"
    )


@pytest.mark.parametrize(("bs", "prefix", "q_len", "heads", "kind", "ragged"), _sweep())
def test_matches_reference(bs: int, prefix: int, q_len: int, heads: int, kind: str, ragged: bool) -> None:
    seed = zlib.crc32(repr((bs, prefix, q_len, heads, kind, ragged)).encode())
    case = make_case(bs, prefix, q_len, heads, kind=kind, ragged=ragged, seed=seed)
    out, lse = _run(case)
    ref, ref_lse = _reference(case)
    assert not out.isnan().any(), "some output elements were not written"
    _assert_matches(out, lse, ref, ref_lse)


def test_int64_indices_and_2d_pool() -> None:
    case = make_case(3, 1000, 9, 16, ragged=True, index_dtype=torch.int64, seed=7)
    case.kv_buffer = case.kv_buffer.view(-1, 576)
    out, _ = _run(case)
    ref, _ = _reference(case)
    assert rel_error(out, ref) <= REL_TOL


def test_strided_q_view() -> None:
    case = make_case(2, 300, 9, 8, seed=11)
    wide = torch.randn(case.q.shape[0], case.heads, 640, dtype=torch.bfloat16, device="cuda")
    wide[..., :576] = case.q
    case.q = wide[..., :576]
    assert not case.q.is_contiguous()
    out, _ = _run(case)
    ref, _ = _reference(case)
    assert rel_error(out, ref) <= REL_TOL


@pytest.mark.parametrize("adaptive", ["0", "1"])
def test_prefix_shorter_than_planned_bound(adaptive: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Grid sized for a much longer prefix (as under CUDA graphs): idle chunks exit (fixed chunks) or every
    request spreads over all splits (adaptive chunks); results right either way."""
    monkeypatch.setenv("KDTREE_ADAPTIVE_CHUNKS", adaptive)
    case = make_case(2, 500, 9, 8, ragged=True, seed=3)
    out = torch.empty(case.bs * case.q_len, case.heads, 512, dtype=torch.bfloat16, device="cuda")
    case.run_kernel(SM_SCALE, max_prefix_len=60000, out=out)
    ref, _ = _reference(case)
    assert rel_error(out, ref) <= REL_TOL


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("adaptive", ["0", "1"])
def test_chunks_past_a_request_weigh_nothing_whatever_the_workspace_held(
    fp8: bool, adaptive: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The combine kernel reads every chunk slot of the grid, not the requests' sizes: the main kernel marks each
    chunk past a request's keys empty in every launch. So a workspace full of NaN bytes (stale, or never written)
    must change nothing, for short requests under a grid planned for a long bound."""
    monkeypatch.setenv("KDTREE_ADAPTIVE_CHUNKS", adaptive)
    bs, q_len, heads, bound = 4, 9, 8, 60000
    kw = {"kv_dtype": torch.float8_e4m3fn, "kv_scale": 1 / 32} if fp8 else {}
    case = make_case(bs, 3000, q_len, heads, ragged=True, seed=21, **kw)  # type: ignore[arg-type]
    assert launch_plan(bs, q_len, heads, bound, fp8=fp8).splits > 1
    ws = torch.full((max(1, workspace_size(bs, q_len, heads, bound, fp8=fp8)),), 0xFF, dtype=torch.uint8, device="cuda")
    out, lse = _run(case, max_prefix_len=bound, workspace=ws)
    ref, ref_lse = _reference(case)
    assert not out.isnan().any(), "a stale partial reached the output"
    _assert_matches(out, lse, ref, ref_lse)


@pytest.mark.parametrize(
    ("bs", "prefix", "q_len", "heads", "fp8_widen"),
    [
        (1, 6000, 9, 8, False),  # 72 rows in 32-row blocks, split into chunks and combined
        (8, 3000, 2, 8, False),  # 16-row blocks
        (64, 1500, 9, 8, False),  # 48 + 24 rows, one chunk a request
        (2, 6000, 9, 8, True),  # an fp8 pool on the widening path (fp16 P, 48-row blocks, combined)
    ],
)
def test_a_lagging_running_maximum_matches_reference(
    bs: int, prefix: int, q_len: int, heads: int, fp8_widen: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The score warps move a row's running maximum only when a tile's maximum exceeds it by more than 2^8, so P
    reaches 2^8 and the value warps rescale rarely. Key norms that climb along the sequence make every row's
    maximum creep up tile after tile (moves under the lag, which must not be lost), and one tile of keys far larger
    makes it jump well past the lag (a rescale)."""
    kw: dict[str, object] = {}
    if fp8_widen:
        monkeypatch.setenv("KDTREE_FP8_PATH", "widen")
        kw = {"kv_dtype": torch.float8_e4m3fn, "kv_scale": 1 / 8}
    case = make_case(bs, prefix, q_len, heads, kind="tree", seed=prefix + q_len, **kw)  # type: ignore[arg-type]
    rows = case.kv_indices.long()
    climb = torch.linspace(0.3, 2.0, rows.numel(), device="cuda")
    climb[rows.numel() // 3 : rows.numel() // 3 + 16] = 5.0
    pool = case.kv_buffer.float()
    pool[rows] *= climb[:, None, None]
    case.kv_buffer.copy_(pool.to(case.kv_buffer.dtype))
    out, lse = _run(case)
    ref, ref_lse = _reference(case)
    assert torch.isfinite(out.float()).all()
    _assert_matches(out, lse, ref, ref_lse)


@pytest.mark.parametrize("adaptive", ["0", "1"])
@pytest.mark.parametrize(("bs", "prefix", "q_len", "heads"), [(1, 8192, 9, 8), (4, 3000, 16, 16), (64, 1000, 9, 8)])
def test_cuda_graph_replay_matches_eager(
    bs: int, prefix: int, q_len: int, heads: int, adaptive: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KDTREE_ADAPTIVE_CHUNKS", adaptive)
    case = make_case(bs, prefix, q_len, heads, ragged=True, seed=5)
    bound = prefix + 1000  # capture for a bound larger than any prefix replayed
    t = bs * q_len
    out = torch.empty(t, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(t, heads, dtype=torch.float32, device="cuda")
    ws = workspace(bs, q_len, heads, bound)

    def call() -> None:
        case.run_kernel(SM_SCALE, max_prefix_len=bound, out=out, lse=lse, workspace=ws)

    graph = capture_graph(call)
    for step in range(2):
        case.q.copy_(torch.randn_like(case.q))  # new inputs in place, as SGLang does between replays
        graph.replay()
        torch.cuda.synchronize()
        got, got_lse = out.clone(), lse.clone()
        call()
        torch.cuda.synchronize()
        assert torch.equal(got, out), f"replay {step} differs from eager"
        assert torch.equal(got_lse, lse)
        ref, ref_lse = _reference(case)
        _assert_matches(got, got_lse, ref, ref_lse, f"replay {step}: ")


@pytest.mark.parametrize(
    ("bs", "prefix", "bound"),
    [
        (1, 8192, 1000),  # the bound's plan splits the keys: fixed chunks would end at ~1k of 8k keys
        (64, 3000, 100),  # the bound's plan is one chunk per request: it would cover 128 of 3009 keys
        (2, 20000, 0),  # a bound of no prefix at all
    ],
)
def test_prefix_longer_than_planned_bound_keeps_every_key(bs: int, prefix: int, bound: int) -> None:
    """A graph captured for a shorter max_prefix_len than a replayed request has: the chunks spread to cover
    every key of the request (chunk_for in csrc/verify_attention.h), so the result is still the reference's."""
    plan = launch_plan(bs, 9, 8, bound)
    assert plan.splits * plan.chunk_keys < prefix + 9, "the planned fixed chunks must fall short of the keys"
    case = make_case(bs, prefix, 9, 8, ragged=False, seed=bs + prefix)
    t = bs * 9
    out, lse = nan_outputs(t, 8)
    ws = workspace(bs, 9, 8, bound)
    graph = capture_graph(lambda: case.run_kernel(SM_SCALE, max_prefix_len=bound, out=out, lse=lse, workspace=ws))
    graph.replay()
    torch.cuda.synchronize()
    ref, ref_lse = _reference(case)
    _assert_matches(out, lse, ref, ref_lse)


@pytest.mark.parametrize("pdl", ["none", "main", "combine", "all"])
@pytest.mark.parametrize(("bs", "prefix"), [(1, 8192), (64, 1000)])  # split keys + combine; one chunk a request
def test_dependent_launches_read_what_the_kernels_before_them_wrote(
    bs: int, prefix: int, pdl: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Programmatic dependent launch (csrc/verify_attention.cu, pdl_use): the main kernel may be placed while the
    kernel before it still runs, and the combine while the main kernel does. In one CUDA graph, kernels rewrite Q
    and the pool just before the call; each replay must see their new values (a kernel that read before its
    griddepcontrol.wait would see the previous replay's, or a half-written pool), under every launch form."""
    monkeypatch.setenv("KDTREE_PDL", pdl)
    case = make_case(bs, prefix, 9, 8, ragged=True, seed=11)
    t = bs * 9
    out = torch.empty(t, 8, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(t, 8, dtype=torch.float32, device="cuda")
    ws = workspace(bs, 9, 8, case.max_prefix)
    q_src = torch.empty_like(case.q)
    kv_src = torch.empty_like(case.kv_buffer)

    def step() -> None:
        torch.mul(q_src, 1.0, out=case.q)  # elementwise kernels, not copies: they run on the SMs just before
        torch.mul(kv_src, 1.0, out=case.kv_buffer)
        case.run_kernel(SM_SCALE, max_prefix_len=case.max_prefix, out=out, lse=lse, workspace=ws)

    graph = capture_graph(step)
    gen = torch.Generator(device="cuda").manual_seed(3)
    for replay in range(3):
        q_src.copy_(torch.randn(q_src.shape, generator=gen, device="cuda").to(q_src.dtype))
        kv_src.copy_(torch.randn(kv_src.shape, generator=gen, device="cuda").to(kv_src.dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(case.q, q_src) and torch.equal(case.kv_buffer, kv_src)
        ref, ref_lse = _reference(case)
        _assert_matches(out, lse, ref, ref_lse, f"replay {replay} under KDTREE_PDL={pdl}: ")


def test_deterministic_across_calls() -> None:
    case = make_case(1, 20000, 9, 8, seed=9)
    first, _ = _run(case)
    second, _ = _run(case)
    assert torch.equal(first, second)


@pytest.mark.parametrize(
    ("bs", "prefix", "q_len", "heads", "kind"),
    [
        (2, 3000, 1, 8, "chain"),  # 8 rows: 1 score pair, half of its rows dead
        (2, 3000, 2, 16, "tree"),  # 32 rows: 2 score pairs
        (3, 3000, 5, 8, "tree"),  # 40 rows: 3 score pairs, the last one half dead
        (1, 5000, 9, 8, "tree"),  # 72 rows: 48 + 24, the second block's third score pair idle
        (3, 1000, 33, 16, "star"),
        (8, 300, 128, 8, "tree"),
        (2, 70, 16, 128, "chain"),
    ],
)
def test_every_row_group_count_matches_reference(
    bs: int, prefix: int, q_len: int, heads: int, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KDTREE_ROW_GROUPS", "fixed")  # the tilings named above: as few blocks as cover the rows
    case = make_case(bs, prefix, q_len, heads, kind=kind, ragged=True, seed=bs + q_len)
    out, lse = _run(case)
    ref, ref_lse = _reference(case)
    _assert_matches(out, lse, ref, ref_lse)


@pytest.mark.parametrize(
    ("bs", "prefix", "q_len", "heads", "split_layout"),
    [
        (1, 5000, 9, 8, False),  # short chunks: the mixed layout
        (8, 8192, 9, 8, True),  # chunks of 1056 keys with a combine: the split layout
        (64, 2000, 5, 8, True),  # 40 rows, 2 chunks of 1024: the third score pair half dead
        (64, 1500, 9, 8, True),  # 72 rows, one chunk: the second block's third score pair idle
    ],
)
def test_both_warp_layouts_match_reference(
    bs: int, prefix: int, q_len: int, heads: int, split_layout: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KDTREE_ROW_GROUPS", "fixed")  # 48-row blocks (the planner may take smaller ones here)
    plan = launch_plan(bs, q_len, heads, prefix)
    assert plan.row_groups == 3
    assert plan.split_schedulers is split_layout
    case = make_case(bs, prefix, q_len, heads, kind="tree", ragged=True, seed=bs * prefix + q_len)
    out, lse = _run(case)
    ref, ref_lse = _reference(case)
    _assert_matches(out, lse, ref, ref_lse)
