"""The mma.sync rate probe (kernel/bench/mma_rate.cu), built for the bench scripts that need it.

It is a benchmark diagnostic, so it stays out of the shipped extension (deploy/build_extension.py): on first
use this module compiles it with nvcc into a small torch-free shared library (seconds; cached per source and
arch under the temp dir) and launches it through ctypes on torch's current stream, so CUDA events and graphs
time it like any other kernel.

    probe = load_mma_probe()
    flops = probe.run(sink, blocks, warps, iters)  # enqueued; time it with CUDA events
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

BENCH_DIR = Path(__file__).resolve().parent
SOURCE = BENCH_DIR / "mma_rate.cu"
KERNEL_CSRC = BENCH_DIR.parent / "csrc"  # mma_primitives.cuh, shared with the verify kernel
CACHE_ENV = "KDTREE_MMA_PROBE_DIR"


class MmaProbeError(RuntimeError):
    """The probe could not be built or launched."""


def nvcc_path() -> str:
    """The nvcc that builds the probe: $CUDA_HOME/bin/nvcc (as torch sees it), else the one on PATH."""
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME:
        candidate = Path(cpp_extension.CUDA_HOME, "bin", "nvcc")
        if candidate.exists():
            return str(candidate)
    found = shutil.which("nvcc")
    if found is None:
        raise MmaProbeError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    return found


def nvcc_command(arch: str, out: Path) -> list[str]:
    """The compile line for compute capability ``arch`` ('9.0'): SASS for it, a shared library at ``out``."""
    cc = arch.replace(".", "")
    return [
        nvcc_path(),
        "-O3",
        "-std=c++17",
        "-shared",
        "-Xcompiler",
        "-fPIC",
        f"-gencode=arch=compute_{cc},code=sm_{cc}",
        "-I",
        str(KERNEL_CSRC),
        str(SOURCE),
        "-o",
        str(out),
    ]


def library_path(arch: str, cache_dir: Path) -> Path:
    """Where the library built from today's sources for ``arch`` lives (a new name whenever they change)."""
    digest = hashlib.sha256(SOURCE.read_bytes() + (KERNEL_CSRC / "mma_primitives.cuh").read_bytes()).hexdigest()
    return cache_dir / f"kdtree_mma_probe_sm{arch.replace('.', '')}_{digest[:12]}.so"


def build(arch: str, cache_dir: Path) -> Path:
    """Compile the probe for ``arch`` into ``cache_dir`` unless an up-to-date build is there; returns its path."""
    lib = library_path(arch, cache_dir)
    if lib.exists():
        return lib
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = lib.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run(nvcc_command(arch, partial), capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        raise MmaProbeError(f"nvcc failed on {SOURCE}:\n{(proc.stdout + proc.stderr)[-4000:]}")
    partial.replace(lib)  # atomic: a concurrent build of the same sources writes the same bytes
    return lib


class MmaProbe:
    """The built probe: ``run`` enqueues one launch on the current stream and returns the flops it performs."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._launch = lib.kdtree_mma_rate_launch
        self._launch.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        self._launch.restype = ctypes.c_int
        self._flops = lib.kdtree_mma_rate_flops
        self._flops.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
        self._flops.restype = ctypes.c_double

    def run(self, sink: torch.Tensor, blocks: int, warps: int, iters: int) -> float:
        if not sink.is_cuda or sink.dtype != torch.float32 or sink.numel() < blocks:
            raise ValueError("sink must be a CUDA float32 tensor with at least `blocks` elements")
        stream = torch.cuda.current_stream(sink.device).cuda_stream
        err = self._launch(sink.data_ptr(), blocks, warps, iters, stream)
        if err != 0:
            raise MmaProbeError(f"mma probe launch failed (cudaError {err})")
        return float(self._flops(blocks, warps, iters))


def load_mma_probe(arch: str | None = None, cache_dir: Path | None = None) -> MmaProbe:
    """Build (once) and load the probe for ``arch`` (default: the current GPU's compute capability)."""
    if arch is None:
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}.{minor}"
    if cache_dir is None:
        cache_dir = Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "kdtree-mma-probe")
    return MmaProbe(ctypes.CDLL(str(build(arch, cache_dir))))
