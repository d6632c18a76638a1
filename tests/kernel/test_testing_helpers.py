"""VerifyCase.run_kernel and VerifyCase.reference hand the case's own tensors to verify_attention and to the
fp32 reference."""

from __future__ import annotations

import pytest
import torch
from kdtree_kernel import testing, verify_attention_reference
from kdtree_kernel.testing import make_case


@pytest.mark.parametrize("replace_rows", [False, True])
def test_run_kernel_forwards_the_case(monkeypatch: pytest.MonkeyPatch, replace_rows: bool) -> None:
    case = make_case(2, 7, 3, 2, ragged=True, device="cpu", seed=4)
    seen: dict[str, object] = {}

    def fake(*args: object, **kwargs: object) -> str:
        seen["args"], seen["kwargs"] = args, kwargs
        return "out"

    monkeypatch.setattr(testing, "verify_attention", fake)
    rows = torch.flip(case.kv_indices, [0]) if replace_rows else None
    marker = torch.zeros(1)
    assert case.run_kernel(0.5, kv_indices=rows, out=marker) == "out"
    args = seen["args"]
    assert isinstance(args, tuple)
    expected = (case.q, case.kv_buffer, case.kv_indptr, case.kv_indices if rows is None else rows)
    assert all(a is b for a, b in zip(args[:4], expected, strict=True))
    assert args[4] is case.qo_indptr and args[5] is case.draft_mask and args[6] == 0.5
    assert seen["kwargs"] == {"q_len": 3, "max_prefix_len": case.max_prefix, "out": marker}
    case.run_kernel(0.5, max_prefix_len=case.max_prefix + 1000)
    assert seen["kwargs"] == {"q_len": 3, "max_prefix_len": case.max_prefix + 1000}


def test_reference_is_the_reference_on_the_case() -> None:
    case = make_case(2, 7, 3, 2, ragged=True, device="cpu", seed=5)
    direct = verify_attention_reference(
        case.q, case.kv_buffer, case.kv_indptr, case.kv_indices, case.qo_indptr, case.draft_mask, 0.5, return_lse=True
    )
    out, lse = case.reference(0.5, return_lse=True)
    assert torch.equal(out, direct[0]) and torch.equal(lse, direct[1])
    assert torch.equal(case.reference(0.5), direct[0])
    assert not torch.equal(case.reference(0.25), direct[0])  # the scale reaches it


def test_fp8_case_forwards_its_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    case = make_case(2, 7, 3, 2, device="cpu", seed=4, kv_dtype=torch.float8_e4m3fn, kv_scale=0.25)
    assert case.kv_buffer.dtype == torch.float8_e4m3fn
    assert torch.equal(case.kv_dequantized(), (case.kv_buffer.float() * 0.25).to(torch.bfloat16))
    seen: dict[str, object] = {}
    monkeypatch.setattr(testing, "verify_attention", lambda *a, **kw: seen.update(kw))
    case.run_kernel(0.5)
    assert seen["k_scale"] == seen["v_scale"] == 0.25
    case.run_kernel(0.5, v_scale=2.0)
    assert seen["v_scale"] == 2.0
    dequantized = verify_attention_reference(
        case.q, case.kv_dequantized(), case.kv_indptr, case.kv_indices, case.qo_indptr, case.draft_mask, 0.5
    )
    assert torch.allclose(case.reference(0.5).float(), dequantized.float(), atol=1e-2)
