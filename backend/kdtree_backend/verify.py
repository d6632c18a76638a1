"""The backend's verify path, shared by the SGLang backend and the replay service:
SGLang metadata -> :mod:`marshal` -> the CUDA kernel (or the reference on CPU) -> ``[T, H, Dl]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import kdtree_kernel
import torch

from .marshal import build_verify_keys, extract_draft_mask


@dataclass(frozen=True)
class VerifyMetadata:
    """The kernel's per-step inputs (shared by every layer of a step)."""

    key_indptr: torch.Tensor  # int32 [bs + 1]: prefix + q_len keys per request
    keys: torch.Tensor  # int32 [capacity]
    draft_mask: torch.Tensor  # int64 [T, words], packed
    q_len: int


def marshal_verify(
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    q_len: int,
    capacity: int | None = None,
) -> VerifyMetadata:
    """SGLang's target-verify metadata (prefix-only kv lists, draft slots, flattened mask) -> kernel inputs."""
    key_indptr, keys = build_verify_keys(kv_indptr, kv_indices, out_cache_loc, q_len, capacity)
    dense = extract_draft_mask(custom_mask, mask_indptr, kv_indptr, q_len)
    return VerifyMetadata(key_indptr, keys, kdtree_kernel.pack_draft_mask(dense), q_len)


def kernel_usable(device: torch.device) -> tuple[bool, str]:
    """(True, "") when the CUDA kernel can run on ``device``; else (False, the fallback reason)."""
    if device.type != "cuda":
        return False, "cpu_device"
    op = getattr(kdtree_kernel, "verify_attention", None)
    available = getattr(kdtree_kernel, "extension_available", None)
    if op is None or available is None:
        return False, "kernel_api_missing"
    if not available():
        return False, "extension_not_built"
    return True, ""


def attend(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    meta: VerifyMetadata,
    qo_indptr: torch.Tensor,
    sm_scale: float,
    *,
    use_kernel: bool,
    out: torch.Tensor | None = None,
    max_prefix_len: int | None = None,
    workspace: torch.Tensor | None = None,
    v_head_dim: int = 512,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    validate: bool | None = None,
) -> torch.Tensor:
    """Verify attention over the marshaled keys: the kernel when ``use_kernel`` (CUDA, graph-capturable with
    ``out``/``workspace``/``max_prefix_len`` given), else the pure-torch reference (host syncs; CPU path).
    ``kv_buffer`` may be SGLang's fp8 pool, with the descales SGLang passes its Triton kernel (``k_scale``,
    ``v_scale``). ``validate``: see ``kdtree_kernel.verify_attention`` (False: the caller checked the step)."""
    if use_kernel:
        return kdtree_kernel.verify_attention(
            q,
            kv_buffer,
            meta.key_indptr,
            meta.keys,
            qo_indptr,
            meta.draft_mask,
            sm_scale,
            q_len=meta.q_len,
            max_prefix_len=max_prefix_len,
            v_head_dim=v_head_dim,
            out=out,
            workspace=workspace,
            k_scale=k_scale,
            v_scale=v_scale,
            validate=validate,
        )
    result = kdtree_kernel.verify_attention_reference(
        q,
        kv_buffer,
        meta.key_indptr,
        meta.keys,
        qo_indptr,
        meta.draft_mask,
        sm_scale,
        v_head_dim=v_head_dim,
        k_scale=k_scale,
        v_scale=v_scale,
    )
    assert isinstance(result, torch.Tensor)
    if out is not None:
        out.copy_(result)
        return out
    return result


def parity_stats_device(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """float32 ``[3]`` on the device: max |out - ref|, mean |out - ref|, ||out - ref|| / ||ref|| (fp32 math).
    No host sync, so it can sit inside a CUDA graph."""
    diff = out.float() - ref.float()
    ref_norm = ref.float().norm().clamp_min(torch.finfo(torch.float32).tiny)
    return torch.stack([diff.abs().amax(), diff.abs().mean(), diff.norm() / ref_norm])


def parity_stats(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    """(max_abs_diff, mean, rel) as host floats."""
    max_abs, mean, rel = parity_stats_device(out, ref).tolist()
    return float(max_abs), float(mean), float(rel)


def shapes_signature(q: torch.Tensor, kv_buffer: torch.Tensor, bs: int, q_len: int, sm_scale: float) -> tuple:
    """What makes a new ``shapes`` line: static shapes and scale (kv_len_max and mask vary per step)."""
    return (tuple(q.shape), kv_buffer.shape[0], kv_buffer.shape[-1], bs, q_len, round(float(sm_scale), 6))


def shapes_line(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    meta: VerifyMetadata,
    bs: int,
    mask_numel: int,
    sm_scale: float,
    v_head_dim: int = 512,
    **extra: object,
) -> str:
    """The ``[kdtree] shapes`` line of this step; ``kv_len_max`` is read from the marshaled key lists (a host
    sync: call it once per new signature only)."""
    from .lines import format_shapes

    key_lens = meta.key_indptr[1 : bs + 1] - meta.key_indptr[:bs]
    dim = kv_buffer.shape[-1]
    return format_shapes(
        q=q.shape,
        kv_buf=(kv_buffer.shape[0], dim),
        bs=bs,
        q_len=meta.q_len,
        dl=v_head_dim,
        dr=dim - v_head_dim,
        kv_len_max=int(key_lens.max()) if bs else 0,
        scale=float(sm_scale),
        mask=(int(mask_numel),),
        **extra,
    )
