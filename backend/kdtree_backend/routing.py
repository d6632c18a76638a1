"""Which verify calls the kernel serves, and why not when it does not: pure decisions over plain values
(no SGLang import, so they are unit-tested everywhere). Each reason becomes one ``[kdtree] fallback`` line."""

from __future__ import annotations

from typing import Any

import torch

from .verify import kernel_usable

LATENT_DIM = 512
QK_DIM = 576
DEFAULT_MAX_Q_LEN = 128
# What the kernel reads: bf16, and SGLang's --kv-cache-dtype fp8_e4m3 pool (float8_e4m3fn, per-layer scale).
KV_DTYPES = (torch.bfloat16, torch.float8_e4m3fn)


def kernel_max_q_len() -> int:
    try:
        from kdtree_kernel.plan import MAX_Q_LEN
    except ImportError:
        return DEFAULT_MAX_Q_LEN
    return int(MAX_Q_LEN)


def static_fallback_reason(
    *,
    use_mla: bool,
    v_head_dim: int,
    page_size: int,
    kv_cache_dtype: torch.dtype | None,
    dcp_size: int,
    sliding_window: bool,
    deterministic: bool,
    use_kernel: bool,
    q_len: int,
    device: torch.device,
) -> str | None:
    """Why the kernel can never serve verify for this model/server (None: it can). Pure."""
    if not use_kernel:
        return "disabled_by_config"
    if not use_mla or v_head_dim != LATENT_DIM:
        return "not_absorbed_mla"
    if page_size > 1:
        return "page_size_gt_1"
    if kv_cache_dtype is not None and kv_cache_dtype not in KV_DTYPES:
        return "fp8_kv_cache" if kv_cache_dtype.itemsize == 1 else "kv_cache_dtype_not_bf16"
    if dcp_size > 1:
        return "decode_context_parallel"
    if sliding_window:
        return "sliding_window"
    if deterministic:
        return "deterministic_inference"
    if not 1 <= q_len <= kernel_max_q_len():
        return "q_len_out_of_range"
    usable, reason = kernel_usable(device)
    return None if usable else reason


def layer_fallback_reason(layer: Any) -> str | None:
    """Why the kernel cannot serve this attention layer (None: it can). Pure over the layer's attributes."""
    if getattr(layer, "qk_head_dim", None) != QK_DIM or getattr(layer, "v_head_dim", None) != LATENT_DIM:
        return "not_absorbed_mla"
    if (getattr(layer, "logit_cap", 0.0) or 0.0) > 0:
        return "logit_cap"
    window = getattr(layer, "sliding_window_size", None)
    if window is not None and window > -1:
        return "sliding_window"
    if getattr(layer, "is_cross_attention", False):
        return "cross_attention"
    if (getattr(layer, "xai_temperature_len", -1) or -1) > 0:
        return "xai_temperature"
    return None


def call_fallback_reason(k: Any, v: Any, sinks: Any, score_mod: Any, aux_tensors: Any) -> str | None:
    """Why the kernel cannot serve this verify call (None: it can). ``k = v = None`` is served: the caller wrote
    the drafts' K/V into the pool itself (``save_kv_cache=False``, as SGLang's attention kit does), upstream
    reads them back at ``out_cache_loc``, and the kernel reads every key from the pool anyway. One of the two
    alone is a malformed call (upstream raises on it)."""
    if sinks is not None:
        return "attention_sinks"
    if score_mod is not None or aux_tensors is not None:
        return "score_mod"
    if (k is None) != (v is None):
        return "kv_not_passed"
    return None
