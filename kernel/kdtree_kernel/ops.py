"""The CUDA verify-attention op (capturable in CUDA graphs) and its workspace sizing."""

from __future__ import annotations

import functools
import os

import torch

from .extension import load_extension
from .inputs import key_lengths
from .mask import mask_words
from .plan import (
    HEAD_DIM,
    MAX_Q_LEN,
    MAX_ROW_GROUPS,
    VALUE_DIM,
    LaunchPlan,
    max_workspace_bytes,
    plan_launch,
)

# "1": every request spreads its own keys over all planned splits (chunk chosen on the device from its
# kv_len) instead of fixed chunks sized for max_prefix_len. Faster for short requests replayed in a graph
# captured for a long bound; off by default until it has been timed (it passes the same GPU tests).
ADAPTIVE_CHUNKS_ENV = "KDTREE_ADAPTIVE_CHUNKS"
# "widen": an fp8 pool with more than 16 rows per request runs the first fp8 path (raw e4m3 widened to fp16 in
# shared memory, 48-row blocks) instead of 16-row blocks of the e4m3 tensor-core kernel (for A/B timing).
FP8_PATH_ENV = "KDTREE_FP8_PATH"
# "fixed": a bf16 pool's blocks hold 48 rows, as few as cover the rows (the planner before it weighed 16- and
# 32-row blocks too), for A/B timing and for tests of the 48-row block's configurations.
ROW_GROUPS_ENV = "KDTREE_ROW_GROUPS"


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Pool dtypes the kernel reads: bf16, and SGLang's --kv-cache-dtype fp8_e4m3 pool (with its k/v scales).
KV_DTYPES = (torch.bfloat16, torch.float8_e4m3fn)


def _row_groups(fp8: bool) -> tuple[int, bool]:
    """(most row groups a block may have, whether exactly that many): a bf16 pool's plan weighs blocks of 16, 32 and
    48 rows (plan.py); an fp8 pool takes the e4m3 tensor-core kernel's 16-row blocks, or with FP8_PATH_ENV=widen
    the widening path's 48-row blocks, as few as cover the rows."""
    if not fp8:
        return MAX_ROW_GROUPS, os.environ.get(ROW_GROUPS_ENV) == "fixed"
    return (MAX_ROW_GROUPS if os.environ.get(FP8_PATH_ENV) == "widen" else 1), True


@functools.cache
def _blocks_per_sm(row_groups: int, fp8: bool = False) -> int:
    try:
        return max(1, int(load_extension().blocks_per_sm(row_groups, fp8)))
    except (RuntimeError, TypeError):  # TypeError: an older build without the fp8 argument
        return 1


def _device_index(device: torch.device | int | str | None) -> int:
    if device is None:
        return torch.cuda.current_device()
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    return dev.index if dev.index is not None else torch.cuda.current_device()


def launch_plan(
    bs: int,
    q_len: int,
    heads: int,
    max_prefix_len: int,
    device: torch.device | int | str | None = None,
    *,
    fp8: bool = False,
) -> LaunchPlan:
    """The grid verify_attention uses on ``device`` for these sizes (reads device properties, no sync)."""
    max_groups, fixed = _row_groups(fp8)
    index = _device_index(device)
    slots = _slots_per_sm(max_groups, fixed, fp8)
    return _plan(bs, q_len, heads, max_prefix_len, _num_sms(index), slots, max_groups, fixed)


@functools.cache
def _slots_per_sm(max_groups: int, fixed: bool, fp8: bool) -> int:
    """Blocks an SM holds of every row-group count a launch may take (_row_groups' policy): the fewest of them, as
    the planner counts waves with one figure (every bf16 block runs one to an SM)."""
    return min(_blocks_per_sm(g, fp8) for g in range(max_groups if fixed else 1, max_groups + 1))


# plan_launch weighs every chunk count (up to 256) and takes 75-235 us of Python; the backend asks for the same
# plan in each of a model's layers within a step (same batch, q_len, heads and prefix bound), so an eager step paid
# that ~60 times. Memoised on everything the plan depends on; a probe that changes plan.py's cost constants must
# clear it (kernel/bench/probe_splits.py).
@functools.lru_cache(maxsize=256)
def _plan(
    bs: int,
    q_len: int,
    heads: int,
    max_prefix_len: int,
    num_sms: int,
    blocks_per_sm: int,
    max_row_groups: int,
    fixed_row_groups: bool = False,
) -> LaunchPlan:
    return plan_launch(
        bs,
        q_len,
        heads,
        max_prefix_len,
        num_sms=num_sms,
        blocks_per_sm=blocks_per_sm,
        max_row_groups=max_row_groups,
        fixed_row_groups=fixed_row_groups,
    )


def workspace_size(
    bs: int,
    q_len: int,
    heads: int,
    max_prefix_len: int,
    device: torch.device | int | str | None = None,
    *,
    fp8: bool = False,
) -> int:
    """Bytes of workspace verify_attention needs for any batch of at most ``bs`` requests whose prefixes are
    at most ``max_prefix_len`` (0: none needed).

    Allocate it once (e.g. ``torch.empty(n, dtype=torch.uint8, device=...)``) and pass it as ``workspace`` to
    keep the call allocation-free under CUDA graphs; pass the same ``max_prefix_len`` to verify_attention.
    """
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"q_len must be in [1, {MAX_Q_LEN}], got {q_len}")
    max_groups, fixed = _row_groups(fp8)
    index = _device_index(device)
    return max_workspace_bytes(
        bs,
        q_len,
        heads,
        max_prefix_len,
        num_sms=_num_sms(index),
        blocks_per_sm=_slots_per_sm(max_groups, fixed, fp8),
        max_row_groups=max_groups,
        fixed_row_groups=fixed,
    )


# The partial rows are read as 16-byte vectors (csrc/verify_attention.cu, the combine kernel).
WORKSPACE_ALIGN = 16


def check_workspace(workspace: torch.Tensor, need: int) -> None:
    """Refuse a workspace the binding would refuse, with a Python error, before the launch: on the H200 machine a
    failed check inside the extension (TORCH_CHECK) killed the process (SIGSEGV) instead of raising."""
    if not workspace.is_contiguous():
        raise ValueError("workspace must be contiguous")
    size = workspace.numel() * workspace.element_size()
    if size < need:
        raise ValueError(f"workspace too small: {size} bytes, this launch needs {need} (kdtree_kernel.workspace_size)")
    if workspace.data_ptr() % WORKSPACE_ALIGN:
        raise ValueError(f"workspace must be {WORKSPACE_ALIGN}-byte aligned (a fresh allocation is)")


def _check_inputs(q: torch.Tensor, kv_buffer: torch.Tensor, q_len: int, v_head_dim: int) -> None:
    if v_head_dim != VALUE_DIM:
        raise ValueError(f"the CUDA kernel supports v_head_dim={VALUE_DIM} only, got {v_head_dim}")
    if q.dim() != 3 or q.shape[-1] != HEAD_DIM:
        raise ValueError(f"q must be [T, H, {HEAD_DIM}], got {tuple(q.shape)}")
    if kv_buffer.shape[-1] != HEAD_DIM:
        raise ValueError(f"kv_buffer rows must have {HEAD_DIM} dims, got {tuple(kv_buffer.shape)}")
    if kv_buffer.dtype not in KV_DTYPES:
        raise ValueError(f"kv_buffer must be bf16 or float8_e4m3fn, got {kv_buffer.dtype}")
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"q_len must be in [1, {MAX_Q_LEN}], got {q_len}")
    if not q.is_cuda:
        raise ValueError("verify_attention runs on CUDA tensors; on CPU use verify_attention_reference")


def verify_attention(
    q: torch.Tensor,
    kv_buffer: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    qo_indptr: torch.Tensor,
    draft_mask: torch.Tensor,
    sm_scale: float,
    *,
    q_len: int,
    max_prefix_len: int | None = None,
    v_head_dim: int = VALUE_DIM,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    workspace: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    validate: bool | None = None,
) -> torch.Tensor:
    """DDTree verify attention on the GPU; same contract as :func:`verify_attention_reference`.

    ``q_len`` (drafts per request, shared by the batch) and ``max_prefix_len`` (an upper bound on every
    request's prefix) fix the grid on the host; a request past the bound (a graph replayed with a longer prefix than
    it was captured for) is still computed over all its keys, its chunks spread wider than planned. With ``out``
    and ``workspace`` given (and ``max_prefix_len``) the call neither allocates nor synchronises, so it can be
    captured in a CUDA graph. ``lse``, when given,
    receives the natural-log LSE [T, H] (float32). Without ``max_prefix_len`` the bound is read from
    ``kv_indptr`` (a host sync; refused while capturing).

    ``kv_buffer`` may be SGLang's fp8 pool (float8_e4m3fn): keys are its rows times ``k_scale``, values the
    first 512 dims times ``v_scale`` (the descales SGLang passes its Triton kernel).

    ``validate`` (default: whenever not capturing) reads ``kv_indptr`` back and raises
    :class:`~kdtree_kernel.inputs.MalformedKeys` for a request with fewer keys than ``q_len`` or a range outside
    ``kv_indices`` (one host sync; pass False where the caller has checked the batch once per step). Under
    capture the kernel itself reads no key of such a request and writes zeros for its rows.
    """
    ext = load_extension()
    _check_inputs(q, kv_buffer, q_len, v_head_dim)
    bs = qo_indptr.shape[0] - 1
    heads = q.shape[1]
    if draft_mask.dim() != 2 or draft_mask.shape[1] != mask_words(q_len):
        raise ValueError(f"draft_mask must be [T, {mask_words(q_len)}] int64, got {tuple(draft_mask.shape)}")
    capturing = torch.cuda.is_current_stream_capturing()
    if max_prefix_len is None and capturing:
        raise RuntimeError("pass max_prefix_len when capturing verify_attention in a CUDA graph")
    if max_prefix_len is None or (validate if validate is not None else not capturing):
        lens = key_lengths(kv_indptr, q_len, kv_indices.numel())  # one host read serves both
        if max_prefix_len is None:
            max_prefix_len = max(lens, default=q_len) - q_len
    fp8 = kv_buffer.dtype == torch.float8_e4m3fn
    plan = launch_plan(bs, q_len, heads, max_prefix_len, q.device, fp8=fp8)
    if out is None:
        out = torch.empty(q.shape[0], heads, VALUE_DIM, dtype=q.dtype, device=q.device)
    need = plan.workspace_bytes
    if need and workspace is None:
        workspace = torch.empty(need, dtype=torch.uint8, device=q.device)
    elif need:
        check_workspace(workspace, need)
    ext.verify_attention(
        q,
        kv_buffer,
        kv_indptr,
        kv_indices,
        qo_indptr,
        draft_mask,
        out,
        lse,
        workspace if need else None,
        float(sm_scale),
        q_len,
        plan.row_groups,
        plan.row_blocks,
        plan.splits,
        0 if os.environ.get(ADAPTIVE_CHUNKS_ENV) == "1" else plan.chunk_keys,
        plan.split_schedulers,
        float(k_scale),
        float(v_scale),
    )
    return out
