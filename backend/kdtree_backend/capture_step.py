"""What one captured verify step holds and what each of its calls is stored as (docs/capture.md): the step's
tensors shared by its calls (SGLang's metadata and the backend's inputs, copied off the live buffers), and one
call's files and manifest. Tensor code and data only; the per-rank protocol that fills them (arming, budgets,
the writer) is :mod:`kdtree_backend.capture`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .capture_format import FORMAT
from .capture_graph import GraphLayer
from .capture_rows import StepRows, step_rows


@dataclass
class CapturedStep:
    index: int
    q_len: int
    plan: StepRows
    shared: dict[str, dict[str, torch.Tensor]]  # device tensors shared by the step's calls: file stem -> tensors
    release_keys: torch.Tensor  # the running release's key list (pool rows), trimmed
    remapped_keys: torch.Tensor | None = None
    padding: int = 0  # CUDA-graph padding requests (the last ones)
    # CUDA graphs: per capture layer, its rows gathered before the replay (drafts patched after it) and what its
    # captured forward was recorded with; empty in eager mode.
    graph_rows: dict[int, tuple[torch.Tensor, GraphLayer]] = field(default_factory=dict)
    stop: tuple[str, int] | None = None  # the budget ran out within this step: (reason, bytes one call needs)


def captured_step(
    *,
    step: int,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out_cache_loc: torch.Tensor,
    custom_mask: torch.Tensor,
    mask_indptr: torch.Tensor,
    qo_indptr: torch.Tensor,
    key_indptr: torch.Tensor,
    keys: torch.Tensor,
    draft_mask: torch.Tensor,
    bs: int,
    q_len: int,
    padding: int = 0,
) -> CapturedStep:
    """The step's gather plan and its shared tensors, copied now (SGLang reuses its buffers at the next step)."""
    tokens = bs * q_len
    indptr = kv_indptr[: bs + 1]
    locations = out_cache_loc[:tokens]
    if locations.numel() < tokens:  # a padded graph batch: SGLang hands over the real tokens' slots only
        locations = torch.cat([locations, locations.new_zeros(tokens - locations.numel())])
    plan = step_rows(indptr, kv_indices, locations, q_len)
    mask_end = int(mask_indptr[bs])
    key_end = int(key_indptr[bs])
    seq_lens = (indptr[1:] - indptr[:-1]).long()
    shared = {
        "inputs": {
            "key_indptr": key_indptr[: bs + 1].to(torch.int32).clone(),
            "qo_indptr": qo_indptr[: bs + 1].to(torch.int32).clone(),
            "draft_mask": draft_mask[:tokens].clone(),
        },
        "sglang": {
            "kv_indptr": indptr.clone(),
            "kv_indices": plan.kv_indices,
            "out_cache_loc": plan.out_cache_loc,
            "custom_mask": custom_mask[:mask_end].clone(),
            "mask_indptr": mask_indptr[: bs + 1].clone(),
            "seq_lens": seq_lens,
            "qo_indptr": qo_indptr[: bs + 1].clone(),
        },
    }
    return CapturedStep(step, q_len, plan, shared, keys[:key_end], padding=padding)


def call_groups(
    step: CapturedStep, q: torch.Tensor, kv_rows: torch.Tensor, out: torch.Tensor
) -> dict[str, dict[str, torch.Tensor]]:
    """One call's tensors by file stem: its own (q, the gathered rows, out) beside the step's shared ones."""
    assert step.remapped_keys is not None
    return {
        "inputs": {"q": q, "kv_rows": kv_rows, "keys": step.remapped_keys, **step.shared["inputs"]},
        "sglang": step.shared["sglang"],
        "output": {"out": out},
    }


def call_manifest(
    step: CapturedStep,
    groups: dict[str, dict[str, torch.Tensor]],
    *,
    capture: str,
    release: str,
    tp: int,
    layer: int,
    out: torch.Tensor,
    pool_rows: int,
    sm_scale: float,
    k_scale: float,
    v_scale: float,
    graph: bool,
    captured_at: float,
) -> dict[str, Any]:
    """The manifest stored beside one call's files (``groups``: its tensors as handed to the writer)."""
    return {
        "format": FORMAT,
        "capture": capture,
        "release": release,
        "tp": tp,
        "layer": layer,
        "step": step.index,
        "bs": int(step.shared["sglang"]["kv_indptr"].numel() - 1),
        "q_len": step.q_len,
        "heads": out.shape[1],
        "v_head_dim": out.shape[-1],
        "sm_scale": float(sm_scale),
        "k_scale": float(k_scale),
        "v_scale": float(v_scale),
        "pool_rows": pool_rows,
        "graph": graph,
        "padding_requests": step.padding,  # the last ones of bs: CUDA-graph padding, captured as replayed
        "keys_outside_rows": None,  # counted by the writer on the host copy
        "captured_at": captured_at,
        "device": str(out.device),
        "tensors": {
            f"{stem}/{key}": {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            for stem, group in groups.items()
            for key, t in group.items()
        },
    }
