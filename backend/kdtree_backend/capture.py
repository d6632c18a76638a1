"""Capture of real verify calls, armed by a request file, for replay on the next release (docs/capture.md).

Layout on a host (``<root>`` is the release root; every directory 0700, every file 0600):

    <root>/state/capture/
      request.json                  what opsctl asks for (CaptureRequest): id, layers, steps, max bytes per TP rank,
                                    expiry (host clock). Read by the service at most once per POLL_S.
      <id>/                         one capture (one request)
        tp<r>-L<layer>-s<step>/     one call: one layer of one verify step on TP rank r
          inputs.safetensors        the kernel's contract: q, kv_rows (the rows the call reads, gathered),
                                    key_indptr + keys (the running release's key lists, remapped to kv_rows),
                                    qo_indptr, draft_mask (packed)
          sglang.safetensors        SGLang's metadata as received, indices remapped to kv_rows: kv_indptr,
                                    kv_indices, out_cache_loc, custom_mask, mask_indptr, seq_lens
          output.safetensors        out: what the running release returned
          manifest.json             written last (its presence means the call is complete): format, capture id,
                                    release, tp, layer, step, sm_scale, k/v scales, q_len, shapes, dtypes and the
                                    sha256 and size of each file
        tp<r>.done.json             rank r has finished this capture: calls, bytes, steps, why it stopped

The running service never changes what it returns: capture only reads the step's tensors. On CUDA the step
gathers the rows into device memory of its own (and copies q and out there), records an event and queues the
call; a writer thread copies it to the host on its own stream once the event has passed, hashes and writes. So
the verify step pays the gathers and small device copies, plus one host read of three offsets per captured
step, and neither pins host memory nor waits for a copy; the device memory queued is bounded
(DEVICE_BACKLOG_BYTES: beyond it a later step is taken). Not armed, the per-step cost is :meth:`Capturer.armed`: one monotonic clock read and a compare; the request
file is looked at once per POLL_S.

CUDA graphs (:class:`GraphSlots`): the replayed forward runs no Python, so the graph itself holds, after the kernel
of each capture layer, copies of q, out and the step's draft rows (pool rows at ``out_cache_loc``, written by this
very replay) into preallocated device slots, behind a device flag (a CUDA conditional node: an unarmed replay
skips them). The step's ``prepare`` (outside the graph, before its replay) gathers the prefix rows, which nothing
writes between then and the replay, and sets the flag; the next ``prepare`` (before the next replay can overwrite
the slots) patches the draft rows in and issues the non-blocking copies to the host. So every captured row is the
one the step read, even when a slot is freed and reused right after the step.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .tensorfile import write_tensors
from .wire import CAPTURE_ID_RE

FORMAT = "kdtree-capture/1"
CAPTURE_SUBDIR = "capture"
REQUEST_FILE = "request.json"
STATE_ENV = "KDTREE_STATE_DIR"  # <root>/state; default: derived from where this release lives
RELEASE_ENV = "KDTREE_RELEASE_ID"
POLL_S = 1.0
IF_NODES_ENV = "KDTREE_CAPTURE_IF_NODES"  # 0: never put the graph's capture writes in a conditional node
MAX_STEPS = 64
MAX_LAYERS = 512
CALL_RE = re.compile(r"tp(\d{1,4})-L(\d{1,6})-s(\d{1,9})")
FILES = ("inputs", "sglang", "output")
DIR_MODE = 0o700
# Device memory the calls waiting for the writer may hold (gathered rows, copies of q and out); a step beyond it
# is not taken (a later one is).
DEVICE_BACKLOG_BYTES = 256 << 20
FILE_MODE = 0o600


class CaptureError(ValueError):
    """A malformed request or capture; the message names the field or file."""


def _log(message: str) -> None:
    print(f"kdtree-capture: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class CaptureRequest:
    id: str
    layers: tuple[int, ...]
    steps: int
    max_bytes: int  # per TP rank
    expires_at: float  # epoch seconds, host clock
    requested_at: float = 0.0
    requested_by: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "id": self.id,
            "layers": list(self.layers),
            "steps": self.steps,
            "max_bytes": self.max_bytes,
            "expires_at": self.expires_at,
            "requested_at": self.requested_at,
            "requested_by": self.requested_by,
        }

    def expired(self, now: float) -> bool:
        return now >= self.expires_at


def _int_field(data: Mapping[str, Any], key: str, lo: int, hi: int) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise CaptureError(f"request.{key} must be an integer in {lo}..{hi}, got {value!r}")
    return value


def parse_request(data: object) -> CaptureRequest:
    """A request from its JSON value; every field checked (a bad one is a :class:`CaptureError` naming it)."""
    if not isinstance(data, Mapping):
        raise CaptureError("request must be a JSON object")
    ident = data.get("id")
    if not isinstance(ident, str) or not CAPTURE_ID_RE.fullmatch(ident):
        raise CaptureError(f"request.id must look like c20260601T120000Z-0a1b2c, got {ident!r}")
    layers_raw = data.get("layers")
    if not isinstance(layers_raw, list) or not 1 <= len(layers_raw) <= MAX_LAYERS:
        raise CaptureError(f"request.layers must be a list of 1..{MAX_LAYERS} layer ids, got {layers_raw!r}")
    if any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x < 100_000 for x in layers_raw):
        raise CaptureError(f"request.layers must hold layer ids >= 0, got {layers_raw!r}")
    expires = data.get("expires_at")
    if isinstance(expires, bool) or not isinstance(expires, int | float) or expires != expires:
        raise CaptureError(f"request.expires_at must be a number (epoch seconds), got {expires!r}")
    requested_at = data.get("requested_at", 0.0)
    if isinstance(requested_at, bool) or not isinstance(requested_at, int | float):
        raise CaptureError(f"request.requested_at must be a number, got {requested_at!r}")
    by = data.get("requested_by", "")
    if not isinstance(by, str):
        raise CaptureError(f"request.requested_by must be a string, got {by!r}")
    return CaptureRequest(
        id=ident,
        layers=tuple(sorted(set(layers_raw))),
        steps=_int_field(data, "steps", 1, MAX_STEPS),
        max_bytes=_int_field(data, "max_bytes", 1, 1 << 50),
        expires_at=float(expires),
        requested_at=float(requested_at),
        requested_by=by[:200],
    )


def call_name(tp: int, layer: int, step: int) -> str:
    return f"tp{tp}-L{layer}-s{step}"


def done_name(tp: int) -> str:
    return f"tp{tp}.done.json"


# ---------------------------------------------------------------------------------------------- where


def locate(module_file: str | Path = __file__, environ: Mapping[str, str] | None = None) -> tuple[Path | None, str]:
    """(the capture directory, this release's id). ``$KDTREE_STATE_DIR`` wins; else a release installed as
    ``<root>/releases/<id>/backend/kdtree_backend/`` uses ``<root>/state``. Elsewhere (a checkout, a wheel) capture
    is off: (None, ...)."""
    env = os.environ if environ is None else environ
    here = Path(module_file).resolve()
    release_dir = here.parents[2]
    installed = here.parents[3].name == "releases"
    release = env.get(RELEASE_ENV) or (release_dir.name if installed else "unreleased")
    state = env.get(STATE_ENV)
    if state:
        return Path(state) / CAPTURE_SUBDIR, release
    if installed:
        return here.parents[4] / "state" / CAPTURE_SUBDIR, release
    return None, release


# ---------------------------------------------------------------------------------------------- tensors (pure)


@dataclass(frozen=True)
class StepRows:
    """Which pool rows one verify step reads, and SGLang's index lists remapped to them.

    Rows are laid out request by request, prefix then drafts: that is the order a correct marshaling reads them,
    built here straight from SGLang's lists (not from the running release's marshaling, which may be the bug)."""

    rows: torch.Tensor  # int64 [R]: pool rows, R = sum(prefix) + bs * q_len
    kv_indices: torch.Tensor  # int32 [sum(prefix)]: positions in rows
    out_cache_loc: torch.Tensor  # int64 [bs * q_len]: positions in rows


def step_rows(kv_indptr: torch.Tensor, kv_indices: torch.Tensor, out_cache_loc: torch.Tensor, q_len: int) -> StepRows:
    """Gather plan of one step (one host read: the prefix total)."""
    bs = kv_indptr.numel() - 1
    device = kv_indptr.device
    indptr = kv_indptr.long()
    n_prefix = int(indptr[-1])
    tokens = bs * q_len
    prefix_lens = indptr[1:] - indptr[:-1]
    req_of_prefix = torch.repeat_interleave(torch.arange(bs, device=device), prefix_lens, output_size=n_prefix)
    prefix_pos = torch.arange(n_prefix, device=device) + req_of_prefix * q_len
    token = torch.arange(tokens, device=device)
    draft_pos = indptr[1:][token // q_len] + (token // q_len) * q_len + token % q_len
    rows = torch.empty(n_prefix + tokens, dtype=torch.long, device=device)
    rows[prefix_pos] = kv_indices[:n_prefix].long()
    rows[draft_pos] = out_cache_loc[:tokens].long()
    return StepRows(rows=rows, kv_indices=prefix_pos.to(torch.int32), out_cache_loc=draft_pos)


def remap_keys(keys: torch.Tensor, rows: torch.Tensor, pool_rows: int) -> torch.Tensor:
    """Pool rows in ``keys`` -> their positions in ``rows``; -1 for a row the step does not read."""
    inverse = torch.full((pool_rows,), -1, dtype=torch.int32, device=rows.device)
    inverse[rows] = torch.arange(rows.numel(), dtype=torch.int32, device=rows.device)
    return inverse[keys.long().clamp(0, pool_rows - 1)]


def nbytes(tensors: Mapping[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


# ---------------------------------------------------------------------------------------------- CUDA graphs


def _storage_view(pool: torch.Tensor) -> torch.Tensor:
    """A float8 pool as bytes (not every device build indexes or copies float8 tensors); others as they are."""
    return pool.view(torch.uint8) if pool.element_size() == 1 and pool.dtype.is_floating_point else pool


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
            _log(f"CUDA graph conditional nodes not used on {device} ({why}); capture writes its slots every replay")
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
        storage = _storage_view(torch.empty(0, dtype=kv_dtype)).dtype
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
            torch.index_select(_storage_view(kv_buffer), 0, self.index[:tokens], out=self.drafts[layer][:tokens])

        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            if self.conditional:
                _if_node_body(self.flag, body)
            else:
                body()
        elif bool(self.flag.item()) if not q.is_cuda else self.armed_on_device:
            body()  # not inside a graph (the CPU emulation, warm-up runs): the flag decides here


# ---------------------------------------------------------------------------------------------- writer


@dataclass
class _CallJob:
    directory: Path
    name: str
    # file stem -> tensors: host copies, or (with ``event``) device tensors of the capture's own that the writer
    # copies to the host once the event has passed
    groups: dict[str, dict[str, torch.Tensor]]
    manifest: dict[str, Any]
    event: Any = None  # torch.cuda.Event recorded after the tensors were made, or None on CPU
    device_bytes: int = 0  # device memory the job holds until the writer has copied it


@dataclass
class _DoneJob:
    path: Path
    summary: dict[str, Any]


class _Writer:
    """One daemon thread writing queued calls in order. A failed write is reported and skipped."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.jobs: queue.Queue[_CallJob | _DoneJob | None] = queue.Queue()
        self.log = log
        self.errors = 0
        self.device_backlog = 0  # bytes of device tensors queued and not yet copied to the host
        self._lock = threading.Lock()
        self._stream: Any = None  # the writer's own CUDA stream, for its device-to-host copies
        self.thread = threading.Thread(target=self._run, name="kdtree-capture-writer", daemon=True)
        self.thread.start()

    def put_call(self, job: _CallJob) -> None:
        with self._lock:
            self.device_backlog += job.device_bytes
        self.jobs.put(job)

    def _fetch(self, job: _CallJob) -> None:
        """The job's device tensors to host memory, on the writer's stream once the step's event has passed: the
        serving thread never waits for these copies nor pins memory for them."""
        if job.event is None:
            return
        try:
            device = next(t.device for group in job.groups.values() for t in group.values())
            if self._stream is None:
                self._stream = torch.cuda.Stream(device=device)
            copies: dict[int, torch.Tensor] = {}
            with torch.cuda.stream(self._stream):
                self._stream.wait_event(job.event)
                for tensors in job.groups.values():
                    for key, t in tensors.items():
                        host = copies.get(id(t))
                        if host is None:
                            host = copies[id(t)] = t.to("cpu")
                        tensors[key] = host
            self._stream.synchronize()
            job.event = None
        finally:
            with self._lock:
                self.device_backlog -= job.device_bytes

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                if isinstance(job, _DoneJob):
                    _write_json(job.path, job.summary)
                else:
                    self._fetch(job)
                    _write_call(job)
            except Exception as exc:  # the service must go on; the capture is incomplete and says so
                self.errors += 1
                self.log(f"write failed: {type(exc).__name__}: {exc}")
            finally:
                self.jobs.task_done()

    def drain(self) -> None:
        self.jobs.join()


def _mkdir(path: Path) -> None:
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _write_call(job: _CallJob) -> None:
    partial = job.directory / f".{job.name}.partial"
    final = job.directory / job.name
    if final.exists():
        raise FileExistsError(f"{final} exists already")
    _mkdir(partial)
    files: dict[str, dict[str, Any]] = {}
    meta = {"format": FORMAT, "capture": str(job.manifest["capture"]), "call": job.name}
    for stem, tensors in job.groups.items():
        size, digest = write_tensors(partial / f"{stem}.safetensors", tensors, meta, mode=FILE_MODE)
        files[f"{stem}.safetensors"] = {"bytes": size, "sha256": digest}
    manifest = dict(job.manifest)
    keys = job.groups.get("inputs", {}).get("keys")
    if keys is not None:
        manifest["keys_outside_rows"] = int((keys < 0).sum())
    manifest["files"] = files
    manifest["bytes"] = sum(f["bytes"] for f in files.values())
    _write_json(partial / "manifest.json", manifest)
    os.rename(partial, final)


# ---------------------------------------------------------------------------------------------- the capturer


@dataclass
class _Step:
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


@dataclass
class CaptureProgress:
    request: CaptureRequest
    calls: int = 0
    bytes: int = 0
    steps: int = 0
    layers_seen: set[int] = field(default_factory=set)
    notes: dict[str, object] = field(default_factory=dict)  # extra fields of the done file


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
        log: Callable[[str], None] = _log,
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
        self._step: _Step | None = None
        self._handled: set[str] = set()
        self._complained: str | None = None
        self._writer: _Writer | None = None

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
            _mkdir(self.directory)
            _mkdir(self.directory / request.id)
        except OSError as exc:
            self._complain(f"{self.directory / request.id}: cannot create: {exc}")
            return
        self._handled.add(request.id)
        self.progress = CaptureProgress(request)
        if self._writer is None:
            self._writer = _Writer(self._log)
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
                current = _Step(step, q_len, plan, shared, keys[:key_end], padding=padding)
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

    def _begin_graph_step(self, step: _Step, graph: Mapping[int, GraphLayer], slots: GraphSlots, tokens: int) -> bool:
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
            rows = _gather_rows(graph[layer].pool, step.plan.rows)
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
                    _storage_view(rows)[step.plan.out_cache_loc] = slots.drafts[layer][:tokens]
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
                rows = _gather_rows(kv_buffer, step.plan.rows)
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
        step: _Step,
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
        assert step.remapped_keys is not None
        heads, dl = out.shape[1], out.shape[-1]
        if out.is_cuda:  # views of live buffers (the step's activations, the graph's slots): the capture's own copy
            q, out = q.clone(), out.clone()
        per_call = {
            "inputs": {"q": q, "kv_rows": kv_rows, "keys": step.remapped_keys, **step.shared["inputs"]},
            "sglang": step.shared["sglang"],
            "output": {"out": out},
        }
        size = sum(nbytes(group) for group in per_call.values())
        if budget and progress.bytes + size > progress.request.max_bytes:
            return size
        groups, event, device_bytes = _hand_over(per_call)
        manifest = {
            "format": FORMAT,
            "capture": progress.request.id,
            "release": self.release,
            "tp": self.tp,
            "layer": layer,
            "step": step.index,
            "bs": int(step.shared["sglang"]["kv_indptr"].numel() - 1),
            "q_len": step.q_len,
            "heads": heads,
            "v_head_dim": dl,
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
        writer.put_call(_CallJob(directory / progress.request.id, name, groups, manifest, event, device_bytes))
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
        summary = {
            "format": FORMAT,
            "capture": progress.request.id,
            "release": self.release,
            "tp": self.tp,
            "calls": progress.calls,
            "bytes": progress.bytes,
            "steps": progress.steps,
            "layers": sorted(progress.layers_seen),
            "reason": reason,
            "finished_at": self._wall(),
            **progress.notes,
            **extra,
        }
        path = self.directory / progress.request.id / done_name(self.tp)
        if self._writer is not None:
            self._writer.jobs.put(_DoneJob(path, summary))
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


def _gather_rows(pool: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``pool[rows]``; a float8 pool is gathered as bytes (not every device build indexes float8 tensors)."""
    return _storage_view(pool)[rows].view(pool.dtype)


def _hand_over(
    groups: Mapping[str, Mapping[str, torch.Tensor]],
) -> tuple[dict[str, dict[str, torch.Tensor]], Any, int]:
    """What the writer gets: on CUDA the tensors as they are (the caller made them the capture's own), an event
    recorded after them and their device bytes (the writer copies them to the host off this thread); on CPU plain
    clones. Tensors shared between groups are handed over once."""
    out = {stem: dict(tensors) for stem, tensors in groups.items()}
    unique = {id(t): t for tensors in out.values() for t in tensors.values()}
    if any(t.is_cuda for t in unique.values()):
        event = torch.cuda.Event()
        event.record()
        return out, event, sum(t.numel() * t.element_size() for t in unique.values())
    clones = {key: t.detach().clone() for key, t in unique.items()}
    return {stem: {k: clones[id(t)] for k, t in tensors.items()} for stem, tensors in out.items()}, None, 0


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
