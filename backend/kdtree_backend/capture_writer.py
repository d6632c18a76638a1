"""The capture writer: one daemon thread that copies queued calls off the device and writes their files (safetensors,
then the manifest, renamed into place last), so the verify step never waits for a copy or a disk (docs/capture.md).
"""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .capture_format import FORMAT
from .tensorfile import write_tensors

DIR_MODE = 0o700
FILE_MODE = 0o600


@dataclass
class CallJob:
    directory: Path
    name: str
    # file stem -> tensors: host copies, or (with ``event``) device tensors of the capture's own that the writer
    # copies to the host once the event has passed
    groups: dict[str, dict[str, torch.Tensor]]
    manifest: dict[str, Any]
    event: Any = None  # torch.cuda.Event recorded after the tensors were made, or None on CPU
    device_bytes: int = 0  # device memory the job holds until the writer has copied it


@dataclass
class DoneJob:
    path: Path
    summary: dict[str, Any]


class Writer:
    """One daemon thread writing queued calls in order. A failed write is reported and skipped."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.jobs: queue.Queue[CallJob | DoneJob | None] = queue.Queue()
        self.log = log
        self.errors = 0
        self.device_backlog = 0  # bytes of device tensors queued and not yet copied to the host
        self._lock = threading.Lock()
        self._stream: Any = None  # the writer's own CUDA stream, for its device-to-host copies
        self.thread = threading.Thread(target=self._run, name="kdtree-capture-writer", daemon=True)
        self.thread.start()

    def put_call(self, job: CallJob) -> None:
        with self._lock:
            self.device_backlog += job.device_bytes
        self.jobs.put(job)

    def _fetch(self, job: CallJob) -> None:
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
                if isinstance(job, DoneJob):
                    write_json(job.path, job.summary)
                else:
                    self._fetch(job)
                    write_call(job)
            except Exception as exc:  # the service must go on; the capture is incomplete and says so
                self.errors += 1
                self.log(f"write failed: {type(exc).__name__}: {exc}")
            finally:
                self.jobs.task_done()

    def drain(self) -> None:
        self.jobs.join()


def mkdir(path: Path) -> None:
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path, DIR_MODE)


def write_json(path: Path, doc: Mapping[str, Any]) -> None:
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


def write_call(job: CallJob) -> None:
    partial = job.directory / f".{job.name}.partial"
    final = job.directory / job.name
    if final.exists():
        raise FileExistsError(f"{final} exists already")
    mkdir(partial)
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
    write_json(partial / "manifest.json", manifest)
    os.rename(partial, final)


def hand_over(
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
