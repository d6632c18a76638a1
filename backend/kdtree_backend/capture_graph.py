"""Capture inside CUDA graphs: the device slots the captured forward writes for the capture layers, behind a
device flag (a CUDA conditional node where the device has them), and the probe that decides whether it does
(docs/capture.md, "CUDA graphs")."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .capture_format import log
from .capture_rows import storage_view

IF_NODES_ENV = "KDTREE_CAPTURE_IF_NODES"  # 0: never put the graph's capture writes in a conditional node

_CONDITIONAL_NODES: dict[str, bool] = {}
CONDITIONAL_NODES_WHY: dict[str, str] = {}  # per device, why conditional nodes are not used (for logs and tests)


def conditional_nodes_usable(device: torch.device) -> bool:
    """Whether a CUDA graph on ``device`` can hold the slot writes inside a conditional (if) node: this torch has
    the API and the driver runs it. Probed once per device with the very ops :meth:`GraphSlots.write` records (a
    contiguous copy, a copy into a view, an ``index_select`` into a slot), replayed with the flag off and on."""
    key = str(device)
    if key in _CONDITIONAL_NODES:
        return _CONDITIONAL_NODES[key]
    why = ""
    if device.type != "cuda":
        why = "not a CUDA device"
    elif os.environ.get(IF_NODES_ENV, "1") == "0":
        why = f"switched off by {IF_NODES_ENV}=0"
    elif not hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node"):
        why = f"torch {torch.__version__} has no CUDAGraph.begin_capture_to_if_node"
    else:
        try:
            why = _probe_conditional_nodes(device)
        except Exception as exc:  # an old driver or torch: the slots are written on every replay instead
            why = f"{type(exc).__name__}: {exc}"
    _CONDITIONAL_NODES[key] = not why
    if why:
        CONDITIONAL_NODES_WHY[key] = why
        if device.type == "cuda":
            log(f"CUDA graph conditional nodes not used on {device} ({why}); capture writes its slots every replay")
    return not why


def _probe_conditional_nodes(device: torch.device) -> str:
    """Empty when the if-node behaves (skipped with the flag off, run with it on); else what went wrong."""
    flag = torch.zeros((), dtype=torch.bool, device=device)
    source = torch.arange(48, dtype=torch.float32, device=device).view(6, 8)
    index = torch.tensor([5, 0, 3], device=device)
    copied = torch.zeros(6, 8, device=device)
    gathered = torch.zeros(3, 8, device=device)

    def body() -> None:
        copied.view(48).copy_(source.view(48))
        torch.index_select(source, 0, index, out=gathered)

    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _if_node_body(flag, body)
    graph.replay()
    torch.cuda.synchronize(device)
    if bool(copied.any()) or bool(gathered.any()):
        return "the if-node body ran with the flag off"
    flag.fill_(True)
    graph.replay()
    torch.cuda.synchronize(device)
    if not (torch.equal(copied, source) and torch.equal(gathered, source[index])):
        return "the if-node body did not run (or ran wrong) with the flag on"
    return ""


def _if_node_body(flag: torch.Tensor, body: Callable[[], object]) -> None:
    """Record ``body`` into the graph being captured as a conditional node that runs only while ``flag`` is true."""
    graph = torch.cuda.CUDAGraph.get_currently_capturing_graph()
    graph.begin_capture_to_if_node(flag)
    try:
        body()
    finally:
        graph.end_capture_to_conditional_node()


@dataclass(frozen=True)
class GraphLayer:
    """What a capture layer's captured forward was recorded with (fixed for the life of the graphs)."""

    pool: torch.Tensor  # the layer's KV pool, [rows, 1, D]: persistent, the graph reads it by address
    sm_scale: float
    k_scale: float = 1.0
    v_scale: float = 1.0


class GraphSlots:
    """Device slots the captured forward writes for the capture layers (a fixed set, chosen before the graphs are
    captured): q, out and the draft rows of the step, ``max_tokens`` rows each, plus the index of those draft rows
    and the armed flag. Written inside the graph after the layer's kernel, only while the flag is set (a CUDA
    conditional node where the device has them, else on every replay). Off CUDA (tests, the CPU emulation of the
    graph protocol) the same writes run when the flag tensor says so."""

    def __init__(
        self,
        layers: Sequence[int],
        *,
        max_tokens: int,
        heads: int,
        v_head_dim: int,
        dtype: torch.dtype,
        kv_row_shape: Sequence[int],
        kv_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.layers = tuple(sorted(set(layers)))
        self.max_tokens = max_tokens
        self.kv_dtype = kv_dtype
        q_dim = int(kv_row_shape[-1])
        storage = storage_view(torch.empty(0, dtype=kv_dtype)).dtype
        self.flag = torch.zeros((), dtype=torch.bool, device=device)  # a scalar, as conditional nodes want
        self.index = torch.zeros(max_tokens, dtype=torch.long, device=device)
        self.q = {layer: torch.zeros(max_tokens, heads, q_dim, dtype=dtype, device=device) for layer in self.layers}
        self.out = {
            layer: torch.zeros(max_tokens, heads, v_head_dim, dtype=dtype, device=device) for layer in self.layers
        }
        self.drafts = {
            layer: torch.zeros(max_tokens, *kv_row_shape, dtype=storage, device=device) for layer in self.layers
        }
        self.conditional = conditional_nodes_usable(device) if device.type == "cuda" else False
        self.armed_on_device = False  # what the flag holds, as far as this process has set it

    def nbytes(self) -> int:
        tensors = [self.flag, self.index, *self.q.values(), *self.out.values(), *self.drafts.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def arm(self, armed: bool, out_cache_loc: torch.Tensor | None = None, tokens: int = 0) -> None:
        """Before the replay: point the draft-row index at this step's slots and set the flag, or clear it. Touches
        the device only on a change (and for the index, on armed steps): an unarmed step costs nothing here."""
        if armed:
            assert out_cache_loc is not None
            rows = out_cache_loc[:tokens]
            self.index[: rows.numel()].copy_(rows)
            self.index[rows.numel() : tokens].zero_()  # padding tokens SGLang did not hand over: its padding slot 0
            if not self.armed_on_device:
                self.flag.fill_(True)
        elif self.armed_on_device:
            self.flag.fill_(False)
        self.armed_on_device = armed

    def write(self, layer: int, q: torch.Tensor, kv_buffer: torch.Tensor, out: torch.Tensor) -> None:
        """After the layer's kernel (captured forward): the slot writes, behind the flag."""
        if layer not in self.q:
            return
        tokens = out.shape[0]

        def body() -> None:
            self.q[layer][:tokens].view(q.shape).copy_(q)
            self.out[layer][:tokens].view(out.shape).copy_(out)
            torch.index_select(storage_view(kv_buffer), 0, self.index[:tokens], out=self.drafts[layer][:tokens])

        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            if self.conditional:
                _if_node_body(self.flag, body)
            else:
                body()
        elif bool(self.flag.item()) if not q.is_cuda else self.armed_on_device:
            body()  # not inside a graph (the CPU emulation, warm-up runs): the flag decides here
