"""A request with fewer keys than q_len (malformed kv_indptr): refused outside CUDA-graph capture, and under
capture the kernel reads none of its keys (zeros, LSE -inf) while the other requests stay right.

The refusal itself (kdtree_kernel.inputs) is CPU code and runs everywhere; the kernel tests need a GPU."""

from __future__ import annotations

import pytest
import torch
from kdtree_kernel import launch_plan
from kdtree_kernel.inputs import MalformedKeys, key_lengths
from kdtree_kernel.testing import capture_graph, make_case, rel_error

from tests.gpu_helpers import extension_test, workspace

SM_SCALE = 0.14468


def _indptr(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def test_key_lengths_of_a_good_batch() -> None:
    assert key_lengths(_indptr(0, 9, 30, 30 + 9), 9, 39) == [9, 21, 9]


@pytest.mark.parametrize(
    ("indptr", "count", "needle"),
    [
        ((0, 5, 20), 20, "request 0 has 5 keys"),  # fewer keys than q_len
        ((0, 20, 15), 20, "request 1 has -5 keys"),  # decreasing
        ((0, 20, 40), 30, "past the 30 entries"),  # beyond kv_indices
        ((-3, 20, 40), 40, "negative"),
        ((), 0, "empty"),
    ],
)
def test_key_lengths_refuses_malformed(indptr: tuple[int, ...], count: int, needle: str) -> None:
    with pytest.raises(MalformedKeys, match=needle):
        key_lengths(_indptr(*indptr), 9, count)


def test_malformed_keys_is_a_value_error() -> None:
    assert issubclass(MalformedKeys, ValueError)


def _break(case, how: str) -> int:
    """Make one request of ``case`` malformed in place; returns its index. Pool rows that only a wrong read
    could reach are poisoned with NaN."""
    ptr = case.kv_indptr
    b = case.bs - 1
    if how == "short":  # the last request keeps q_len - 1 keys; the rest of its old range is poisoned
        old_end = int(ptr[b + 1])
        ptr[b + 1] = int(ptr[b]) + case.q_len - 1
        case.kv_buffer[case.kv_indices[int(ptr[b + 1]) : old_end].long()] = float("nan")
    elif how == "past_end":  # the last request's range runs past kv_indices
        ptr[b + 1] = case.kv_indices.numel() + 64
    elif how == "negative":  # the first request starts before kv_indices
        b = 0
        ptr[0] = -32
    return b


def _rows(case, b: int) -> slice:
    return slice(b * case.q_len, (b + 1) * case.q_len)


@extension_test
@pytest.mark.parametrize("how", ["short", "past_end", "negative"])
@pytest.mark.parametrize(("bs", "prefix"), [(3, 8192), (64, 600)])
@pytest.mark.parametrize("fp8", [False, True])
def test_malformed_request_under_capture_reads_nothing(bs: int, prefix: int, how: str, fp8: bool) -> None:
    q_len, heads = 9, 8
    kw = {"kv_dtype": torch.float8_e4m3fn, "kv_scale": 1 / 32} if fp8 else {}
    case = make_case(bs, prefix, q_len, heads, ragged=True, seed=bs + prefix, **kw)  # type: ignore[arg-type]
    good, good_lse = case.reference(SM_SCALE, return_lse=True)
    t = bs * q_len
    out = torch.empty(t, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(t, heads, dtype=torch.float32, device="cuda")
    ws = workspace(bs, q_len, heads, prefix, fp8=fp8)

    def call() -> None:
        case.run_kernel(SM_SCALE, max_prefix_len=prefix, out=out, lse=lse, workspace=ws)

    graph = capture_graph(call)
    b = _break(case, how)
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    bad = _rows(case, b)
    assert torch.equal(out[bad], torch.zeros_like(out[bad])), "a malformed request must get zeros, read nothing"
    assert torch.all(lse[bad] == float("-inf"))
    keep = torch.ones(t, dtype=torch.bool, device="cuda")
    keep[bad] = False
    assert rel_error(out[keep], good[keep]) <= 1e-2, "the other requests must be unaffected"
    assert torch.allclose(lse[keep], good_lse[keep], atol=2e-2, rtol=1e-3)
    # Outside capture the same batch is refused before anything is launched.
    with pytest.raises(MalformedKeys):
        call()


@extension_test
def test_both_chunk_paths_are_covered() -> None:
    """The capture test's two shapes take the one-chunk path (zeros from the main kernel) and the split path
    (zeros from the combine kernel)."""
    assert launch_plan(3, 9, 8, 8192).splits > 1
    assert launch_plan(64, 9, 8, 600).splits == 1


@extension_test
@pytest.mark.parametrize("validate", [None, True])
def test_eager_call_refuses_a_short_request(validate: bool | None) -> None:
    case = make_case(2, 100, 9, 8, seed=1)
    case.kv_indptr[2] = int(case.kv_indptr[1]) + 4
    with pytest.raises(MalformedKeys, match="request 1 has 4 keys"):
        case.run_kernel(SM_SCALE, validate=validate)
    with pytest.raises(MalformedKeys):
        case.run_kernel(SM_SCALE, max_prefix_len=None)
