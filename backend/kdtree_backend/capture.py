"""Capture of real verify calls, armed by a request file, for replay on the next release (docs/capture.md).

This module is the per-rank :class:`Capturer` (arming and the per-step protocol). The request, the layout on disk
and where captures go: :mod:`kdtree_backend.capture_format`; the gather plan: :mod:`kdtree_backend.capture_rows`;
the CUDA-graph slots: :mod:`kdtree_backend.capture_graph`; the writer thread: :mod:`kdtree_backend.capture_writer`;
a capture's progress and done file, a captured step and a call's files: :mod:`kdtree_backend.capture_step`.

The running service never changes what it returns: capture only reads the step's tensors. On CUDA the step
gathers the rows into device memory of its own (and copies q and out there), records an event and queues the
call; a writer thread copies it to the host on its own stream once the event has passed, hashes and writes. So
the verify step pays the gathers and small device copies, plus one host read of three offsets per captured
step, and neither pins host memory nor waits for a copy; the device memory queued is bounded
(DEVICE_BACKLOG_BYTES: beyond it a later step is taken). Not armed, the per-step cost is :meth:`Capturer.armed`:
one monotonic clock read and a compare; the request file is looked at once per POLL_S.

CUDA graphs (:class:`GraphSlots`): the replayed forward runs no Python, so the graph itself holds, after the kernel
of each capture layer, copies of q, out and the step's draft rows (pool rows at ``out_cache_loc``, written by this
very replay) into preallocated device slots, behind a device flag (a CUDA conditional node: an unarmed replay
skips them). The step's ``prepare`` (outside the graph, before its replay) gathers the prefix rows, which nothing
writes between then and the replay, and sets the flag; the next ``prepare`` (before the next replay can overwrite
the slots) patches the draft rows in and issues the non-blocking copies to the host. So every captured row is the
one the step read, even when a slot is freed and reused right after the step.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from .capture_format import (
    FORMAT,
    REQUEST_FILE,
    CaptureError,
    call_name,
    done_name,
    locate,
    log,
    parse_request,
)
from .capture_graph import GraphLayer, GraphSlots
from .capture_rows import gather_rows, nbytes, remap_keys, step_rows, storage_view
from .capture_step import CapturedStep, CaptureProgress, call_groups, done_summary
from .capture_writer import CallJob, DoneJob, Writer, hand_over, mkdir

POLL_S = 1.0
# Device memory the calls waiting for the writer may hold (gathered rows, copies of q and out); a step beyond it
# is not taken (a later one is).
DEVICE_BACKLOG_BYTES = 256 << 20


class Capturer:
    """Per TP rank (one per process of the server; the replay service has one per rank it stands in for).

    The verify path calls :meth:`armed` once per step (cheap), :meth:`begin_step` when it is armed, and
    :meth:`record` for each layer :meth:`wants`. Nothing raised in here reaches the caller: a failure is logged
    and ends the capture."""

    def __init__(
        self,
        directory: Path | None,
        *,
        release: str,
        tp: int = 0,
        poll_s: float = POLL_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        log: Callable[[str], None] = log,
    ) -> None:
        self.directory = directory
        self.release = release
        self.tp = int(tp)
        self.poll_s = poll_s
        self._clock = clock
        self._wall = wall
        self._log = log
        self._next_poll = 0.0
        self.progress: CaptureProgress | None = None
        self._step: CapturedStep | None = None
        self._handled: set[str] = set()
        self._complained: str | None = None
        self._writer: Writer | None = None

    @classmethod
    def from_environment(cls, tp: int = 0, environ: Mapping[str, str] | None = None) -> Capturer:
        directory, release = locate(environ=environ)
        return cls(directory, release=release, tp=tp)

    # -- per step ------------------------------------------------------------------------------------------

    def armed(self) -> bool:
        """The per-step check. Not armed: a clock read and a compare, plus a look at the request file once per
        ``poll_s``."""
        if self.progress is None:
            if self.directory is None:
                return False
            now = self._clock()
            if now < self._next_poll:
                return False
            self._next_poll = now + self.poll_s
            self._poll()
            return self.progress is not None
        progress = self.progress
        if progress.steps >= progress.request.steps:
            self.finish("steps")
            return False
        if progress.request.expired(self._wall()):
            self.finish("expired")
            return False
        return True

    def _poll(self) -> None:
        assert self.directory is not None
        path = self.directory / REQUEST_FILE
        try:
            text = path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            self._complain(f"{path}: cannot read: {exc}")
            return
        try:
            request = parse_request(json.loads(text))
        except (json.JSONDecodeError, CaptureError) as exc:
            self._complain(f"{path}: ignored: {exc}")
            return
        if request.id in self._handled or (self.directory / request.id / done_name(self.tp)).exists():
            self._handled.add(request.id)
            return
        if request.expired(self._wall()):
            self._complain(f"{path}: ignored: capture {request.id} expired")
            return
        try:
            mkdir(self.directory)
            mkdir(self.directory / request.id)
        except OSError as exc:
            self._complain(f"{self.directory / request.id}: cannot create: {exc}")
            return
        self._handled.add(request.id)
        self.progress = CaptureProgress(request)
        if self._writer is None:
            self._writer = Writer(self._log)
        self._log(
            f"armed capture={request.id} tp={self.tp} release={self.release} layers={list(request.layers)} "
            f"steps={request.steps} max_bytes={request.max_bytes}"
        )

    def _complain(self, message: str) -> None:
        if message != self._complained:  # once per distinct problem, not once per poll
            self._complained = message
            self._log(message)

    def begin_step(
        self,
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
        graph: Mapping[int, GraphLayer] | None = None,
        slots: GraphSlots | None = None,
        padding: int = 0,
    ) -> bool:
        """Start capturing this step (armed only). Eager (``graph`` None): returns whether :meth:`record` should be
        called for its layers. CUDA graphs (``graph``: the capture layers the captured forward was recorded with,
        ``slots`` its slots): gathers the prefix rows of the wanted layers now, before the replay; returns whether
        the slots' flag must be set for this replay, and :meth:`flush_graph_step` finishes the calls after it.
        ``padding``: how many of the ``bs`` requests are CUDA-graph padding (the last ones)."""
        if self.progress is None:
            return False
        if self._writer is not None and self._writer.device_backlog > DEVICE_BACKLOG_BYTES:
            return False  # the writer is still copying earlier calls off the device: take a later step
        try:
            with torch.no_grad():
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
                current = CapturedStep(step, q_len, plan, shared, keys[:key_end], padding=padding)
                if graph is not None:
                    if slots is None:  # the release runs with capture.in_graphs false: no slots in its graphs
                        self.finish("graph_capture_off")
                        return False
                    if not self._begin_graph_step(current, graph, slots, tokens):
                        return False
                self._step = current
            self.progress.steps += 1
            return True
        except Exception as exc:
            self._fail(exc)
            return False

    def _begin_graph_step(
        self, step: CapturedStep, graph: Mapping[int, GraphLayer], slots: GraphSlots, tokens: int
    ) -> bool:
        """The graph part of :meth:`begin_step`: the prefix rows of each wanted layer, gathered before the replay
        (the draft positions are patched from the slots after it), within the byte budget."""
        progress = self.progress
        assert progress is not None
        capturable = [layer for layer in progress.request.layers if layer in graph and layer in slots.q]
        if not capturable:
            self.finish("layers_not_in_graph", graph_layers=sorted(set(graph) & set(slots.q)))
            return False
        if tokens > slots.max_tokens:
            raise ValueError(f"graph batch of {tokens} tokens exceeds the {slots.max_tokens} capture slots")
        # The key list lives in a graph buffer the next prepare rewrites: remap it now.
        pool_rows = graph[capturable[0]].pool.shape[0]
        step.remapped_keys = remap_keys(step.release_keys, step.plan.rows, pool_rows)
        shared_bytes = sum(nbytes(group) for group in step.shared.values()) + nbytes({"k": step.remapped_keys})
        reserved = 0
        for layer in capturable:
            rows = gather_rows(graph[layer].pool, step.plan.rows)
            q_slot, out_slot = slots.q[layer], slots.out[layer]
            size = (
                shared_bytes
                + nbytes({"kv_rows": rows})
                + tokens * q_slot[0].numel() * q_slot.element_size()
                + tokens * out_slot[0].numel() * out_slot.element_size()
            )
            if progress.bytes + reserved + size > progress.request.max_bytes:
                step.stop = ("max_bytes", size)
                break
            step.graph_rows[layer] = (rows, graph[layer])
            reserved += size
        if not step.graph_rows:
            assert step.stop is not None
            self.finish("max_bytes", needed=step.stop[1])
            return False
        if len(capturable) < len(progress.request.layers):
            progress.notes["graph_layers"] = sorted(set(graph) & set(slots.q))
        return True

    def flush_graph_step(self, slots: GraphSlots) -> None:
        """After the replay of a captured graph step, before the next replay: patch the draft rows the replay wrote
        into the gathered rows and queue the calls (copies to the host on the stream, in order before the next
        replay can overwrite the slots)."""
        step = self._step
        if step is None or not step.graph_rows:
            return
        self._step = None
        try:
            with torch.no_grad():
                tokens = step.plan.out_cache_loc.numel()
                for layer, (rows, recorded) in step.graph_rows.items():
                    storage_view(rows)[step.plan.out_cache_loc] = slots.drafts[layer][:tokens]
                    self._queue_call(
                        layer,
                        step,
                        q=slots.q[layer][:tokens],
                        kv_rows=rows,
                        out=slots.out[layer][:tokens],
                        pool_rows=recorded.pool.shape[0],
                        sm_scale=recorded.sm_scale,
                        k_scale=recorded.k_scale,
                        v_scale=recorded.v_scale,
                        graph=True,
                    )
        except Exception as exc:
            self._fail(exc)
            return
        if step.stop is not None and self.progress is not None:
            self.finish(step.stop[0], needed=step.stop[1])

    @property
    def graph_step_pending(self) -> bool:
        return self._step is not None and bool(self._step.graph_rows)

    def wants(self, layer: int) -> bool:
        return (
            self._step is not None
            and not self._step.graph_rows
            and self.progress is not None
            and layer in self.progress.request.layers
        )

    def record(
        self,
        layer: int,
        q: torch.Tensor,
        kv_buffer: torch.Tensor,
        out: torch.Tensor,
        sm_scale: float,
        *,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> None:
        """Queue one layer's call of the current (eager) step (reads only; copies leave without blocking on CUDA)."""
        step, progress = self._step, self.progress
        if step is None or progress is None:
            return
        try:
            with torch.no_grad():
                tokens = out.shape[0]
                pool_rows = kv_buffer.shape[0]
                if step.remapped_keys is None:
                    step.remapped_keys = remap_keys(step.release_keys, step.plan.rows, pool_rows)
                rows = gather_rows(kv_buffer, step.plan.rows)
                size = self._queue_call(
                    layer, step, q=q.reshape(tokens, out.shape[1], -1), kv_rows=rows, out=out[:tokens],
                    pool_rows=pool_rows, sm_scale=sm_scale, k_scale=k_scale, v_scale=v_scale, graph=False,
                    budget=True,
                )  # fmt: skip
                if size is not None:
                    self.finish("max_bytes", needed=size)
        except Exception as exc:
            self._fail(exc)

    def _queue_call(
        self,
        layer: int,
        step: CapturedStep,
        *,
        q: torch.Tensor,
        kv_rows: torch.Tensor,
        out: torch.Tensor,
        pool_rows: int,
        sm_scale: float,
        k_scale: float,
        v_scale: float,
        graph: bool,
        budget: bool = False,
    ) -> int | None:
        """Copy one call to the host (without blocking on CUDA) and queue its files. With ``budget``, a call that
        would overrun the byte budget is not queued and its size is returned (the caller stops the capture)."""
        progress, writer, directory = self.progress, self._writer, self.directory
        if progress is None or writer is None or directory is None:
            return None
        if out.is_cuda:  # views of live buffers (the step's activations, the graph's slots): the capture's own copy
            q, out = q.clone(), out.clone()
        per_call = call_groups(step, q, kv_rows, out)
        size = sum(nbytes(group) for group in per_call.values())
        if budget and progress.bytes + size > progress.request.max_bytes:
            return size
        groups, event, device_bytes = hand_over(per_call)
        manifest = {
            "format": FORMAT,
            "capture": progress.request.id,
            "release": self.release,
            "tp": self.tp,
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
            "captured_at": self._wall(),
            "device": str(out.device),
            "tensors": {
                f"{stem}/{key}": {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                for stem, group in groups.items()
                for key, t in group.items()
            },
        }
        name = call_name(self.tp, layer, step.index)
        writer.put_call(CallJob(directory / progress.request.id, name, groups, manifest, event, device_bytes))
        progress.calls += 1
        progress.bytes += size
        progress.layers_seen.add(layer)
        return None

    # -- the end -------------------------------------------------------------------------------------------

    def finish(self, reason: str, **extra: object) -> None:
        """Stop capturing (steps done, budget reached, expired, unsupported, failed) and record why."""
        progress = self.progress
        self.progress = None
        self._step = None
        if progress is None or self.directory is None:
            return
        summary = done_summary(progress, release=self.release, tp=self.tp, reason=reason, finished_at=self._wall())
        summary.update(extra)
        path = self.directory / progress.request.id / done_name(self.tp)
        if self._writer is not None:
            self._writer.jobs.put(DoneJob(path, summary))
        self._log(
            f"finished capture={progress.request.id} tp={self.tp} calls={progress.calls} bytes={progress.bytes} "
            f"reason={reason}"
        )

    def _fail(self, exc: BaseException) -> None:
        self._log(f"capture failed, stopping it: {type(exc).__name__}: {exc}")
        self.finish("error", error=f"{type(exc).__name__}: {exc}"[:300])

    def drain(self) -> None:
        """Wait until every queued file is written (tests, shutdown)."""
        if self._writer is not None:
            self._writer.drain()
