"""What a capture holds and how it is stored (docs/capture.md): its progress and the done file that closes it, a
captured verify step (its gather plan and the tensors its calls share: SGLang's metadata and the backend's inputs,
copied off the live buffers), and one call's files. Data only; the per-rank protocol that fills them
(arming, budgets, the writer) is :mod:`kdtree_backend.capture`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .capture_format import FORMAT, CaptureRequest
from .capture_graph import GraphLayer
from .capture_rows import StepRows


@dataclass
class CaptureProgress:
    request: CaptureRequest
    calls: int = 0
    bytes: int = 0
    steps: int = 0
    layers_seen: set[int] = field(default_factory=set)
    notes: dict[str, object] = field(default_factory=dict)  # extra fields of the done file


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


def done_summary(
    progress: CaptureProgress, *, release: str, tp: int, reason: str, finished_at: float
) -> dict[str, Any]:
    """The done file of one rank's capture: what it stored, and why it stopped (the caller adds its extra fields)."""
    return {
        "format": FORMAT,
        "capture": progress.request.id,
        "release": release,
        "tp": tp,
        "calls": progress.calls,
        "bytes": progress.bytes,
        "steps": progress.steps,
        "layers": sorted(progress.layers_seen),
        "reason": reason,
        "finished_at": finished_at,
        **progress.notes,
    }
