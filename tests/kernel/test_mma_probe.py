"""The mma.sync rate probe lives with the benchmark (kernel/bench/mma_rate.cu + mma_probe.py), not in the shipped
extension: the build's sources and the binding no longer carry it, and the bench builds and runs it on its own."""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
CSRC = REPO / "kernel" / "csrc"
BENCH = REPO / "kernel" / "bench"


def load_file(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mma_probe() -> ModuleType:
    return load_file("kdtree_bench_mma_probe", BENCH / "mma_probe.py")


def test_shipped_extension_has_no_probe() -> None:
    build = load_file("kdtree_build_extension", REPO / "deploy" / "build_extension.py")
    assert all((CSRC / source).is_file() for source in build.SOURCES)
    assert not any("mma_rate" in source for source in build.SOURCES)
    shipped = "".join(p.read_text() for p in CSRC.iterdir() if p.suffix in {".cu", ".cuh", ".h", ".cpp"})
    assert "mma_rate" not in shipped


def test_library_name_follows_sources_and_arch(mma_probe: ModuleType, tmp_path: Path) -> None:
    sm90 = mma_probe.library_path("9.0", tmp_path)
    assert sm90.parent == tmp_path and "sm90" in sm90.name
    assert mma_probe.library_path("12.0", tmp_path) != sm90


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found on PATH")
def test_probe_builds_and_counts_flops(mma_probe: ModuleType, tmp_path: Path) -> None:
    """Built for sm_90 here (no GPU needed); the host entry point counts 8 m16n8k16 mma per warp and iteration."""
    lib_path = mma_probe.build("9.0", tmp_path)
    assert mma_probe.build("9.0", tmp_path) == lib_path  # cached: a second call does not rebuild
    lib = ctypes.CDLL(str(lib_path))
    flops = lib.kdtree_mma_rate_flops
    flops.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]
    flops.restype = ctypes.c_double
    assert flops(3, 4, 5) == 3 * 4 * 5 * 8 * 2 * 16 * 8 * 16
    assert hasattr(lib, "kdtree_mma_rate_launch")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_probe_runs_on_the_gpu(mma_probe: ModuleType, tmp_path: Path) -> None:
    probe = mma_probe.load_mma_probe(cache_dir=tmp_path)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sink = torch.zeros(sms, dtype=torch.float32, device="cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe.run(sink, sms, 8, 64)  # warm-up
    start.record()
    flops = probe.run(sink, sms, 8, 4096)
    end.record()
    end.synchronize()
    tflops = flops / start.elapsed_time(end) / 1e9
    # A real mma.sync rate: above a CUDA-core fp32 rate, below any tensor-core peak shipped so far.
    assert 50 < tflops < 5000, tflops
    with pytest.raises(ValueError):
        probe.run(torch.zeros(1, device="cuda"), sms, 8, 1)
