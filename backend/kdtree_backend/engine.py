"""The verify engine behind the SGLang backend: per-step marshaling, the kernel call per layer, parity and
shapes lines, eager and under CUDA graphs. Free of SGLang imports so that it can be tested on its own.

Per verify step SGLang calls the backend's metadata hook once (:meth:`VerifyEngine.prepare`), then the
attention of every layer (:meth:`VerifyEngine.forward`).

CUDA graphs. :meth:`allocate_graph_buffers` preallocates the marshaled key list, the packed mask, the kernel's
workspace and the parity buffers. In graph mode :meth:`prepare` (SGLang's ``init_forward_metadata_out_graph``,
run before every replay, outside the graph) marshals into those buffers with device ops only; the captured
forward reads them. Nothing in the replayed path synchronises with the host.

Parity (kernel vs SGLang's Triton ``extend_attention_fwd`` on the same inputs; never changes the output):
  * sampled steps: each of the first ``parity.burst_steps`` verify steps after the start, then every N;
  * eager: on sampled steps the sampled layers run Triton into a scratch buffer and the
    line is printed at once (a host sync, on sampled steps only);
  * CUDA graphs: the Triton call and the diff reductions of the sampled layers are captured in the graph.
    Triton reads its query offsets from a parity rail that :meth:`prepare` arms (copies the real
    ``qo_indptr``) on sampled steps and disarms (zeros: every Triton program returns at once) on the others.
    The stats land in a device buffer; the next :meth:`prepare` copies them to pinned host memory without
    blocking and records an event; a later :meth:`prepare` prints the lines once the event has completed.
    So the lines come from the replayed graphs themselves, one or two steps late, marked ``mode=graph``.

Capture (docs/capture.md): eager, :meth:`prepare` starts an armed step and :meth:`forward` records each wanted
layer. Under CUDA graphs the capture layers are the parity layers (a fixed set, whatever ``parity.enabled``
says); the captured forward writes q, out and the draft rows of those layers into the capture slots behind a
device flag (:class:`~kdtree_backend.capture_graph.GraphSlots`), :meth:`prepare` gathers the prefix rows and sets the
flag on armed steps, and the next :meth:`prepare` hands the slots to the capturer before the next replay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .capture import Capturer
from .capture_graph import GraphLayer, GraphSlots
from .config import ParityConfig
from .lines import OncePer, ParityIdentity, emit, format_parity
from .marshal import verify_keys_capacity
from .verify import VerifyMetadata, attend, marshal_verify, parity_stats, parity_stats_device, shapes_line

# Fills ``out`` ([T, H, Dl]) with SGLang's Triton extend attention on the step's inputs, reading the query
# offsets from the given qo_indptr (the real one, or the parity rail under CUDA graphs).
TritonReference = Callable[[torch.Tensor, torch.Tensor], None]


@dataclass
class _GraphBuffers:
    key_indptr: torch.Tensor
    keys: torch.Tensor
    draft_mask: torch.Tensor
    workspace: torch.Tensor | None
    qo_indptr: torch.Tensor  # int32 copy of SGLang's (int64 in its graph buffers; the kernel wants int32)
    parity_rail: torch.Tensor
    parity_out: dict[int, torch.Tensor]
    parity_stats: torch.Tensor  # [len(layers), 3] float32
    max_bs: int
    max_tokens: int
    keys_per_request: int
    capture: GraphSlots | None  # None where capture can never be armed (no state directory) or no layers


class VerifyEngine:
    def __init__(
        self,
        *,
        q_len: int,
        heads: int,
        parity: ParityConfig,
        use_kernel: bool,
        v_head_dim: int = 512,
        sink: Callable[[str], None] = emit,
        identity: ParityIdentity | None = None,
        capturer: Capturer | None = None,
        capture_in_graphs: bool = True,
    ) -> None:
        self.q_len = q_len
        self.capture_in_graphs = capture_in_graphs
        self.identity = identity or ParityIdentity.from_env()
        # Capture of real verify calls (docs/capture.md), armed by <root>/state/capture/request.json.
        self.capturer = capturer or Capturer.from_environment(tp=self.identity.tp)
        self._capturing = False
        self.heads = heads
        self.parity = parity
        self.use_kernel = use_kernel
        self.v_head_dim = v_head_dim
        self.sink = sink
        self.shapes_once = OncePer(sink)
        self.graph: _GraphBuffers | None = None
        self.graph_mode = False
        self.meta: VerifyMetadata | None = None
        self.qo_indptr: torch.Tensor | None = None
        self.bs = 0
        self.max_prefix_len: int | None = None
        self.step = -1  # verify steps seen (capture batches excluded)
        self.scale: float | None = None
        self._sampled = False
        self._pending_shapes: Callable[[torch.Tensor, torch.Tensor, float], str] | None = None
        self._stats_due: int | None = None  # step whose graph stats wait to be copied to the host
        self._stats_copies: list[tuple[torch.cuda.Event | None, int, torch.Tensor]] = []
        self._graph_layers: dict[int, GraphLayer] = {}  # capture layers, as their captured forward saw them

    # ---- CUDA graphs -------------------------------------------------------------------------------
    def allocate_graph_buffers(
        self,
        *,
        max_bs: int,
        max_context_len: int,
        device: torch.device,
        dtype: torch.dtype = torch.bfloat16,
        workspace_bytes: int = 0,
        kv_row_shape: Sequence[int] = (1, 576),
        kv_dtype: torch.dtype | None = None,
    ) -> None:
        """Preallocate everything the captured path reads or writes (SGLang's ``init_cuda_graph_state``).
        ``kv_row_shape``/``kv_dtype``: one row of the KV pool (``pool.shape[1:]``) and its dtype, for the capture
        slots of the draft rows."""
        max_tokens = max_bs * self.q_len
        keys_per_request = max_context_len + self.q_len
        words = (self.q_len + 63) // 64
        layers = tuple(self.parity.layers) if self.parity.enabled else ()
        self.graph = _GraphBuffers(
            key_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            keys=torch.zeros(max_bs * keys_per_request, dtype=torch.int32, device=device),
            draft_mask=torch.zeros(max_tokens, words, dtype=torch.int64, device=device),
            workspace=torch.empty(workspace_bytes, dtype=torch.uint8, device=device) if workspace_bytes else None,
            qo_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            parity_rail=torch.zeros(max_bs + 1, dtype=torch.int32, device=device),
            parity_out={
                layer: torch.zeros(max_tokens, self.heads, self.v_head_dim, dtype=dtype, device=device)
                for layer in layers
            },
            parity_stats=torch.zeros(max(len(layers), 1), 3, dtype=torch.float32, device=device),
            max_bs=max_bs,
            max_tokens=max_tokens,
            keys_per_request=keys_per_request,
            capture=GraphSlots(
                self.parity.layers,
                max_tokens=max_tokens,
                heads=self.heads,
                v_head_dim=self.v_head_dim,
                dtype=dtype,
                kv_row_shape=kv_row_shape,
                kv_dtype=kv_dtype or dtype,
                device=device,
            )
            if self.capture_in_graphs and self.capturer.directory is not None and self.parity.layers
            else None,
        )
        self.max_prefix_len = max_context_len

    # ---- per step ----------------------------------------------------------------------------------
    def prepare(
        self,
        *,
        kv_indptr: torch.Tensor,
        kv_indices: torch.Tensor,
        out_cache_loc: torch.Tensor,
        custom_mask: torch.Tensor,
        mask_indptr: torch.Tensor,
        qo_indptr: torch.Tensor,
        bs: int,
        graph: bool,
        capture: bool = False,
        prefix_sum: int | None = None,
        max_prefix_len: int | None = None,
        kv_buffer_shape: Sequence[int] | None = None,
        padding: int = 0,
    ) -> None:
        """Marshal this step's metadata. ``graph``: into the preallocated buffers (SGLang's out-graph hook);
        ``capture``: a capture batch (not a verify step; parity stays disarmed). ``prefix_sum`` (host int,
        when SGLang has it) bounds the key list; without it the bound is ``bs * max_context_len``. ``padding``:
        CUDA-graph padding requests among the ``bs`` (SGLang's ``num_padding``; recorded by capture)."""
        self._report_graph_parity()
        slots = self.graph.capture if self.graph is not None else None
        if slots is not None and self.capturer.graph_step_pending:
            # The previous replay filled the slots; hand them over before this step's replay overwrites them.
            self.capturer.flush_graph_step(slots)
        self.graph_mode = graph
        self.bs = bs
        if not capture:
            self.step += 1
        self._sampled = not capture and self.parity.sampled(self.step)  # burst after start, then every N
        tokens = bs * self.q_len
        if graph:
            buffers = self.graph
            if buffers is None:
                raise RuntimeError("graph-mode verify before allocate_graph_buffers (init_cuda_graph_state)")
            if bs > buffers.max_bs:
                raise ValueError(f"graph batch of {bs} requests exceeds the {buffers.max_bs} allocated")
            bound = bs * buffers.keys_per_request if prefix_sum is None else prefix_sum + tokens
            capacity = min(bound, buffers.keys.numel())
            meta = marshal_verify(
                kv_indptr[: bs + 1], kv_indices, out_cache_loc[:tokens], custom_mask, mask_indptr, self.q_len, capacity
            )
            buffers.key_indptr[: bs + 1].copy_(meta.key_indptr)
            buffers.keys[:capacity].copy_(meta.keys)
            buffers.draft_mask[:tokens].copy_(meta.draft_mask)
            self.meta = VerifyMetadata(
                buffers.key_indptr[: bs + 1], buffers.keys, buffers.draft_mask[:tokens], self.q_len
            )
            buffers.qo_indptr[: bs + 1].copy_(qo_indptr[: bs + 1])
            self.qo_indptr = buffers.qo_indptr[: bs + 1]
            rail = buffers.parity_rail[: bs + 1]
            if self._sampled:
                rail.copy_(qo_indptr[: bs + 1])
                self._stats_due = self.step
            else:
                rail.zero_()
        else:
            capacity = verify_keys_capacity(kv_indices, bs, self.q_len) if prefix_sum is None else prefix_sum + tokens
            self.meta = marshal_verify(
                kv_indptr[: bs + 1], kv_indices, out_cache_loc[:tokens], custom_mask, mask_indptr, self.q_len, capacity
            )
            self.max_prefix_len = max_prefix_len
            self.qo_indptr = qo_indptr[: bs + 1].to(torch.int32)
            if self.use_kernel and self.meta.key_indptr.is_cuda:
                # Eager: refuse a malformed batch once per step (one host read), not once per layer. Graph
                # replays skip this: the kernel reads no key of a malformed request (request_keys).
                from kdtree_kernel.inputs import key_lengths

                key_lengths(self.meta.key_indptr, self.q_len, self.meta.keys.numel())
        if not capture:
            self._queue_shapes(mask_indptr, bs, kv_buffer_shape)
            meta = self.meta
            started = self.capturer.armed() and self.capturer.begin_step(
                step=self.step, kv_indptr=kv_indptr, kv_indices=kv_indices, out_cache_loc=out_cache_loc,
                custom_mask=custom_mask, mask_indptr=mask_indptr, qo_indptr=qo_indptr, key_indptr=meta.key_indptr,
                keys=meta.keys, draft_mask=meta.draft_mask, bs=bs, q_len=self.q_len,
                graph=self._graph_layers if graph else None, slots=slots, padding=padding,
            )  # fmt: skip
            self._capturing = started and not graph
            if slots is not None:
                slots.arm(started and graph, out_cache_loc, tokens)

    def _queue_shapes(self, mask_indptr: torch.Tensor, bs: int, kv_buffer_shape: Sequence[int] | None) -> None:
        meta = self.meta
        assert meta is not None
        tokens = bs * self.q_len

        def line(q: torch.Tensor, kv_buffer: torch.Tensor, scale: float) -> str:
            return shapes_line(q, kv_buffer, meta, bs, int(mask_indptr[bs]), scale, self.v_head_dim)

        self._pending_shapes = line
        if self.graph_mode and self.scale is not None and kv_buffer_shape is not None:
            # The replayed forward runs no Python: print from here, with the scale seen at capture.
            rows, dim = int(kv_buffer_shape[0]), int(kv_buffer_shape[-1])
            signature = ((tokens, self.heads, dim), rows, dim, bs, self.q_len, round(self.scale, 6))
            q_like = torch.empty(tokens, self.heads, dim, device="meta")
            kv_like = torch.empty(rows, dim, device="meta")
            self.shapes_once(signature, lambda: line(q_like, kv_like, self.scale or 0.0))
            self._pending_shapes = None

    def forward(
        self,
        layer_id: int,
        q: torch.Tensor,
        kv_buffer: torch.Tensor,
        out: torch.Tensor,
        sm_scale: float,
        triton_reference: TritonReference | None = None,
        *,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> torch.Tensor:
        """The kernel for one layer into ``out`` ([T, H, Dl]); parity per the configuration. An fp8 pool
        (float8_e4m3fn) comes with the descales SGLang gives its Triton kernel (``k_scale``, ``v_scale``); the
        parity reference is then SGLang's own fp8 Triton path on the same pool."""
        meta, qo_indptr = self.meta, self.qo_indptr
        if meta is None or qo_indptr is None:
            raise RuntimeError("verify forward before prepare() (init_forward_metadata) for this step")
        self.scale = float(sm_scale)
        capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
        if self._pending_shapes is not None and not capturing:
            pending = self._pending_shapes
            signature = (
                tuple(q.shape),
                kv_buffer.shape[0],
                kv_buffer.shape[-1],
                self.bs,
                self.q_len,
                round(self.scale, 6),
            )
            self.shapes_once(signature, lambda: pending(q, kv_buffer, self.scale or 0.0))
            self._pending_shapes = None
        buffers = self.graph if self.graph_mode else None
        attend(
            q,
            kv_buffer,
            meta,
            qo_indptr,
            sm_scale,
            use_kernel=self.use_kernel,
            out=out,
            max_prefix_len=self.max_prefix_len,
            workspace=buffers.workspace if buffers is not None else None,
            v_head_dim=self.v_head_dim,
            k_scale=k_scale,
            v_scale=v_scale,
            validate=False,  # checked once per step in prepare() (eager); the kernel guards graph replays
        )
        slots = buffers.capture if buffers is not None else None
        if slots is not None and layer_id in slots.q:
            self._graph_layers[layer_id] = GraphLayer(kv_buffer, float(sm_scale), float(k_scale), float(v_scale))
            slots.write(layer_id, q, kv_buffer, out)
        if self._capturing and self.capturer.wants(layer_id):
            self.capturer.record(layer_id, q, kv_buffer, out, sm_scale, k_scale=k_scale, v_scale=v_scale)
        if triton_reference is None or not self.parity.enabled or layer_id not in self.parity.layers:
            return out
        if buffers is not None:
            # Captured every replay; does work only when prepare() armed the rail (sampled steps).
            slot = self.parity.layers.index(layer_id)
            ref = buffers.parity_out[layer_id][: out.shape[0]]
            triton_reference(ref, buffers.parity_rail[: self.bs + 1])
            buffers.parity_stats[slot].copy_(parity_stats_device(out, ref))
        elif self._sampled:
            ref = torch.empty_like(out)
            triton_reference(ref, qo_indptr)
            max_abs, mean, rel = parity_stats(out, ref)
            self.sink(format_parity(layer_id, max_abs, mean, rel, self.identity, mode="eager", step=self.step))
        return out

    def _report_graph_parity(self) -> None:
        """Deferred graph-mode parity: copy a sampled step's stats to the host (before the next replay
        overwrites them, without blocking) and print the copies that have landed."""
        buffers = self.graph
        if buffers is None:
            return
        if self._stats_due is not None:
            stats = buffers.parity_stats
            if stats.is_cuda:
                host = torch.empty(stats.shape, dtype=stats.dtype, pin_memory=True)
                host.copy_(stats, non_blocking=True)
                event = torch.cuda.Event()
                event.record()
                self._stats_copies.append((event, self._stats_due, host))
            else:
                self._stats_copies.append((None, self._stats_due, stats.clone()))
            self._stats_due = None
        while self._stats_copies and (self._stats_copies[0][0] is None or self._stats_copies[0][0].query()):
            _, step, host = self._stats_copies.pop(0)
            for slot, layer in enumerate(self.parity.layers):
                max_abs, mean, rel = host[slot].tolist()
                self.sink(format_parity(layer, max_abs, mean, rel, self.identity, mode="graph", step=step))

    def flush(self) -> None:
        """Print the graph-mode parity still pending, waiting for its copies: for tests and shutdown."""
        self._report_graph_parity()
        for event, _, _ in self._stats_copies:
            if event is not None:
                event.synchronize()
        self._report_graph_parity()
