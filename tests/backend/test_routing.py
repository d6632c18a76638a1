"""Which verify calls go to the kernel, and the fallback reason otherwise (pure decisions)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from kdtree_backend.routing import call_fallback_reason, layer_fallback_reason, static_fallback_reason

SERVING: dict[str, Any] = dict(
    use_mla=True,
    v_head_dim=512,
    page_size=1,
    kv_cache_dtype=torch.bfloat16,
    dcp_size=1,
    sliding_window=False,
    deterministic=False,
    use_kernel=True,
    q_len=9,
)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"use_kernel": False}, "disabled_by_config"),
        ({"use_mla": False}, "not_absorbed_mla"),
        ({"v_head_dim": 128}, "not_absorbed_mla"),
        ({"page_size": 64}, "page_size_gt_1"),
        ({"kv_cache_dtype": torch.float8_e5m2}, "fp8_kv_cache"),
        ({"kv_cache_dtype": torch.float8_e4m3fn}, "cpu_device"),  # fp8_e4m3 pools are served (issue 18)
        ({"kv_cache_dtype": torch.float16}, "kv_cache_dtype_not_bf16"),
        ({"dcp_size": 2}, "decode_context_parallel"),
        ({"sliding_window": True}, "sliding_window"),
        ({"deterministic": True}, "deterministic_inference"),
        ({"q_len": 129}, "q_len_out_of_range"),
        ({}, "cpu_device"),
    ],
)
def test_static_reasons(change: dict[str, Any], reason: str) -> None:
    assert static_fallback_reason(**{**SERVING, **change}, device=torch.device("cpu")) == reason


def mla_layer(**change: Any) -> SimpleNamespace:
    base = dict(qk_head_dim=576, v_head_dim=512, logit_cap=0.0, sliding_window_size=-1, k_scale=None,
                is_cross_attention=False, xai_temperature_len=-1)  # fmt: skip
    return SimpleNamespace(**{**base, **change})


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({}, None),
        ({"sliding_window_size": None}, None),
        ({"qk_head_dim": 192, "v_head_dim": 128}, "not_absorbed_mla"),
        ({"logit_cap": 30.0}, "logit_cap"),
        ({"sliding_window_size": 4096}, "sliding_window"),
        ({"k_scale": torch.tensor(1.0)}, None),  # an fp8_e4m3 layer: the kernel reads its pool and scale
        ({"is_cross_attention": True}, "cross_attention"),
        ({"xai_temperature_len": 8}, "xai_temperature"),
    ],
)
def test_layer_reasons(change: dict[str, Any], reason: str | None) -> None:
    assert layer_fallback_reason(mla_layer(**change)) == reason


def test_call_reasons() -> None:
    k = torch.zeros(1)
    assert call_fallback_reason(k, k, None, None, None) is None
    assert call_fallback_reason(k, k, k, None, None) == "attention_sinks"
    assert call_fallback_reason(k, k, None, object(), None) == "score_mod"
    assert call_fallback_reason(None, None, None, None, None) is None  # drafts written to the pool by the caller
    assert call_fallback_reason(k, None, None, None, None) == "kv_not_passed"
    assert call_fallback_reason(None, k, None, None, None) == "kv_not_passed"
