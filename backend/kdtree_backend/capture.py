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

The running service never changes what it returns: capture only reads the step's tensors. On CUDA the copies
to pinned host memory are issued without blocking and a writer thread waits for them, hashes and writes; the
verify step itself pays the gathers and the copies' launch, plus one host read of three offsets per captured
step (eager mode only). Not armed, the per-step cost is :meth:`Capturer.armed`: one monotonic clock read and a
compare; the request file is looked at once per POLL_S.

CUDA graphs: not captured yet (a graph-mode step finishes the request with reason ``cuda_graphs_unsupported``,
so that opsctl says so instead of waiting); the design is in docs/capture.md.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .tensorfile import write_tensors

FORMAT = "kdtree-capture/1"
CAPTURE_SUBDIR = "capture"
REQUEST_FILE = "request.json"
STATE_ENV = "KDTREE_STATE_DIR"  # <root>/state; default: derived from where this release lives
RELEASE_ENV = "KDTREE_RELEASE_ID"
POLL_S = 1.0
MAX_STEPS = 64
MAX_LAYERS = 512
ID_RE = re.compile(r"c\d{8}T\d{6}Z-[0-9a-f]{6}")
CALL_RE = re.compile(r"tp(\d{1,4})-L(\d{1,6})-s(\d{1,9})")
FILES = ("inputs", "sglang", "output")
DIR_MODE = 0o700
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
    if not isinstance(ident, str) or not ID_RE.fullmatch(ident):
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


# ---------------------------------------------------------------------------------------------- writer


@dataclass
class _CallJob:
    directory: Path
    name: str
    groups: dict[str, dict[str, torch.Tensor]]  # file stem -> tensors (host copies, maybe still landing)
    manifest: dict[str, Any]
    event: Any = None  # torch.cuda.Event after the copies, or None on CPU


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
        self.thread = threading.Thread(target=self._run, name="kdtree-capture-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                if isinstance(job, _DoneJob):
                    _write_json(job.path, job.summary)
                else:
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
    if job.event is not None:
        job.event.synchronize()  # the device-to-host copies have landed
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


@dataclass
class CaptureProgress:
    request: CaptureRequest
    calls: int = 0
    bytes: int = 0
    steps: int = 0
    layers_seen: set[int] = field(default_factory=set)


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
        graph: bool = False,
    ) -> bool:
        """Start capturing this step (armed only). Returns whether :meth:`record` should be called for it."""
        if self.progress is None:
            return False
        if graph:
            self.finish("cuda_graphs_unsupported")
            return False
        try:
            with torch.no_grad():
                indptr = kv_indptr[: bs + 1]
                plan = step_rows(indptr, kv_indices, out_cache_loc, q_len)
                mask_end = int(mask_indptr[bs])
                key_end = int(key_indptr[bs])
                seq_lens = (indptr[1:] - indptr[:-1]).long()
                shared = {
                    "inputs": {
                        "key_indptr": key_indptr[: bs + 1].to(torch.int32).clone(),
                        "qo_indptr": qo_indptr[: bs + 1].to(torch.int32).clone(),
                        "draft_mask": draft_mask[: bs * q_len].clone(),
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
                self._step = _Step(step, q_len, plan, shared, keys[:key_end])
            self.progress.steps += 1
            return True
        except Exception as exc:
            self._fail(exc)
            return False

    def wants(self, layer: int) -> bool:
        return self._step is not None and self.progress is not None and layer in self.progress.request.layers

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
        """Queue one layer's call of the current step (reads only; copies leave without blocking on CUDA)."""
        step, progress, writer, directory = self._step, self.progress, self._writer, self.directory
        if step is None or progress is None or writer is None or directory is None:
            return
        try:
            with torch.no_grad():
                tokens, heads, dl = out.shape[0], out.shape[1], out.shape[-1]
                pool_rows = kv_buffer.shape[0]
                if step.remapped_keys is None:
                    step.remapped_keys = remap_keys(step.release_keys, step.plan.rows, pool_rows)
                per_call = {
                    "inputs": {
                        "q": q.reshape(tokens, heads, -1),
                        "kv_rows": _gather_rows(kv_buffer, step.plan.rows),
                        "keys": step.remapped_keys,
                        **step.shared["inputs"],
                    },
                    "sglang": step.shared["sglang"],
                    "output": {"out": out[:tokens]},
                }
                size = sum(nbytes(group) for group in per_call.values())
                if progress.bytes + size > progress.request.max_bytes:
                    self.finish("max_bytes", needed=size)
                    return
                groups, event = _to_host(per_call)
                name = call_name(self.tp, layer, step.index)
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
                    "keys_outside_rows": None,  # counted by the writer on the host copy
                    "captured_at": self._wall(),
                    "device": str(out.device),
                    "tensors": {
                        f"{stem}/{key}": {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
                        for stem, group in groups.items()
                        for key, t in group.items()
                    },
                }
                job = _CallJob(directory / progress.request.id, name, groups, manifest, event)
                writer.jobs.put(job)
            progress.calls += 1
            progress.bytes += size
            progress.layers_seen.add(layer)
        except Exception as exc:
            self._fail(exc)

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
    if pool.element_size() == 1 and pool.dtype.is_floating_point:
        return pool.view(torch.uint8)[rows].view(pool.dtype)
    return pool[rows]


def _to_host(
    groups: Mapping[str, Mapping[str, torch.Tensor]],
) -> tuple[dict[str, dict[str, torch.Tensor]], Any]:
    """Host copies of every tensor: pinned and non-blocking on CUDA (with an event the writer waits on), plain
    clones on CPU. Tensors shared between groups are copied once."""
    copies: dict[int, torch.Tensor] = {}
    on_cuda = False
    out: dict[str, dict[str, torch.Tensor]] = {}
    for stem, tensors in groups.items():
        out[stem] = {}
        for key, t in tensors.items():
            host = copies.get(id(t))
            if host is None:
                if t.is_cuda:
                    on_cuda = True
                    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    host.copy_(t, non_blocking=True)
                else:
                    host = t.detach().clone()
                copies[id(t)] = host
            out[stem][key] = host
    event = None
    if on_cuda:
        event = torch.cuda.Event()
        event.record()
    return out, event


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
