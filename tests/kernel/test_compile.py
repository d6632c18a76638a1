"""Compile-only check of the torch-free kernel unit with nvcc for sm_120a and sm_90a (runs in CI, no GPU).

Fails on any ptxas error, on more than 99 KB of shared memory per block (the sm_120 limit; the dynamic part
is checked by a static_assert in the header and read back here by a host-only probe), and on large register
spills.
"""

from __future__ import annotations

import functools
import math
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from kdtree_kernel.plan import MAX_ROW_GROUPS

CSRC = Path(__file__).resolve().parents[2] / "kernel" / "csrc"
NVCC = shutil.which("nvcc")
SMEM_LIMIT = 99 * 1024
# The 3-row-group block (14 warps, so 128 registers) spills ~160 bytes on sm_90a and ~60 on sm_120a, in its
# prologue and a few loop-invariant reloads (tolerated); this catches a growing frame.
MAX_SPILL_BYTES = 512

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found on PATH")

ENTRY_RE = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\w+)'")
SPILL_RE = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads"
)
USED_RE = re.compile(r"Used (?P<regs>\d+) registers(?:.*?(?P<smem>\d+) bytes smem)?")


def parse_ptxas(log: str) -> dict[str, dict[str, int]]:
    """Per kernel entry: registers, static smem, stack frame and spill bytes, from `ptxas -v` output."""
    kernels: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in log.splitlines():
        if m := ENTRY_RE.search(line):
            current = kernels.setdefault(m["name"], {"regs": 0, "smem": 0, "stack": 0, "spill": 0})
        elif current is not None and (m := SPILL_RE.search(line)):
            current["stack"] = int(m["stack"])
            current["spill"] = int(m["stores"]) + int(m["loads"])
        elif current is not None and (m := USED_RE.search(line)):
            current["regs"] = int(m["regs"])
            current["smem"] = int(m["smem"] or 0)
    return kernels


# The shipped extension's CUDA units (deploy/build_extension.py; the mma.sync probe is a bench diagnostic now).
UNITS = ("verify_attention.cu", "verify_attention_i32.cu", "verify_attention_i64.cu")
SMEM_PROBE = """#include <cstdio>
#include "verify_attention_kernel.cuh"
int main() {
  std::printf("%d %d %d\\n", kdtree::TileConfig<1, kdtree::stages_for(1)>::kSmemBytes,
              kdtree::TileConfig<2, kdtree::stages_for(2)>::kSmemBytes,
              kdtree::TileConfig<3, kdtree::stages_for(3)>::kSmemBytes);
  std::printf("%d %d %d\\n", kdtree::TileConfig<1, kdtree::stages_for(1), true>::kSmemBytes,
              kdtree::TileConfig<2, kdtree::stages_for(2), true>::kSmemBytes,
              kdtree::TileConfig<3, kdtree::stages_for(3), true>::kSmemBytes);
}
"""


@functools.cache
def dynamic_smem_bytes_by_row_groups() -> tuple[int, ...]:
    """TileConfig<RG, stages_for(RG)>::kSmemBytes for RG = 1..3 (bf16 pool), then the fp8 pool's, read from the
    header itself (a host-only probe built with nvcc and run here; no GPU needed), so the budget check cannot drift
    from the kernel's layout."""
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "smem_probe.cu", Path(tmp) / "smem_probe"
        src.write_text(SMEM_PROBE)
        build = subprocess.run(
            [NVCC, "-std=c++17", "-I", str(CSRC), str(src), "-o", str(exe)], capture_output=True, text=True, timeout=300
        )
        assert build.returncode == 0, f"nvcc failed on the shared-memory probe:\n{build.stderr[-4000:]}"
        run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True)
    return tuple(int(x) for x in run.stdout.split())


def dynamic_smem_bytes(row_groups: int, fp8: bool = False) -> int:
    return dynamic_smem_bytes_by_row_groups()[row_groups - 1 + (MAX_ROW_GROUPS if fp8 else 0)]


def worst_dynamic_smem() -> int:
    return max(dynamic_smem_bytes_by_row_groups())


def test_parse_ptxas_reads_resources() -> None:
    log = (
        "ptxas info    : Compiling entry function '_Z3fooILi4EEvv' for 'sm_90a'\n"
        "ptxas info    : Function properties for _Z3fooILi4EEvv\n"
        "    16 bytes stack frame, 8 bytes spill stores, 24 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem\n"
    )
    assert parse_ptxas(log) == {"_Z3fooILi4EEvv": {"regs": 255, "smem": 1024, "stack": 16, "spill": 32}}


def test_shared_memory_budget() -> None:
    assert worst_dynamic_smem() <= SMEM_LIMIT
    assert dynamic_smem_bytes(2) > dynamic_smem_bytes(1)  # same stages, more rows of P and of partial scores
    assert dynamic_smem_bytes(3, fp8=True) > dynamic_smem_bytes(1, fp8=True)


@pytest.mark.slow  # nvcc, two architectures: ~25 s each
@pytest.mark.parametrize("arch", ["sm_120a", "sm_90a"])
def test_kernels_compile(arch: str, tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [
                NVCC,
                "-O3",
                "-std=c++17",
                f"-arch={arch}",
                "-Xptxas",
                "-v",
                "-c",
                str(CSRC / unit),
                "-o",
                str(tmp_path / f"{unit}.o"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for unit in UNITS
    ]
    log = ""
    for unit, proc in zip(UNITS, procs, strict=True):
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"nvcc failed on {unit} for {arch}:\n{out[-4000:]}"
        log += out
    assert "error" not in log.lower(), log[-4000:]
    # Link the units as the extension does: catches symbols defined in more than one of them.
    link = subprocess.run(
        [NVCC, "-shared", f"-arch={arch}", *(str(tmp_path / f"{u}.o") for u in UNITS), "-o", str(tmp_path / "k.so")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert link.returncode == 0, f"linking the kernel units failed:\n{link.stdout}{link.stderr}"
    kernels = parse_ptxas(log)
    main = {name: k for name, k in kernels.items() if "verify_attention_kernel" in name}
    # int32 / int64 indices x bf16 / fp8 pools; the 3-row-group block in two warp layouts; the fp8 one-row-group
    # block (the e4m3 tensor-core kernel) in two forms (e4m3 mma.sync, and fp16 mma.sync for sm_90)
    expected = 2 * 2 * (MAX_ROW_GROUPS + 1) + 2
    assert len(main) == expected, f"expected {expected} instantiations, got {sorted(main)}"
    assert any("verify_combine_kernel" in name for name in kernels)
    assert not any("mma_rate_kernel" in name for name in kernels), "the mma.sync probe ships in the extension"
    for name, k in kernels.items():
        dynamic = worst_dynamic_smem() if "verify_attention_kernel" in name else 0  # the others use static only
        assert k["smem"] + dynamic <= SMEM_LIMIT, f"{name}: smem over 99 KB"
        assert k["regs"] <= 255, name
        assert k["spill"] <= MAX_SPILL_BYTES, f"{name} on {arch} spills {k['spill']} bytes"


def test_chunk_for_covers_every_key(tmp_path: Path) -> None:
    """chunk_for() (shared by the kernel, the combine and the host): a fixed chunk while the planned splits hold
    the request, else (adaptive chunks, or a request longer than the bound the grid was planned for) keys spread
    over the splits: aligned chunks, every key covered, no split beyond the last that has keys. Built and run on
    the host."""
    src = tmp_path / "chunk.cu"
    src.write_text(
        '#include <cstdio>\n#include "verify_attention.h"\n'
        "int main() {\n"
        "  kdtree::VerifyParams p{};\n"
        "  for (int fixed : {0, 64}) for (int splits : {1, 3, 66, 256}) for (int kv : {1, 31, 32, 33, 1033, 131072}) {\n"
        "    p.chunk_keys = fixed; p.splits = splits;\n"
        '    std::printf("%d %d %d %d\\n", fixed, splits, kv, kdtree::chunk_for(p, kv));\n'
        "  }\n}\n"
    )
    exe = tmp_path / "chunk"
    build = subprocess.run(
        [NVCC, "-std=c++17", f"-I{CSRC}", str(src), "-o", str(exe)], capture_output=True, text=True, check=False
    )
    assert build.returncode == 0, build.stdout + build.stderr
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=60).stdout.split("\n")
    rows = [tuple(map(int, line.split())) for line in lines if line.strip()]
    assert len(rows) == 2 * 4 * 6
    for fixed, splits, kv, chunk in rows:
        if fixed and splits * fixed >= kv:
            assert chunk == fixed
            continue
        assert chunk % 32 == 0 and chunk >= 32
        assert splits * chunk >= kv  # every key lands in some split
        assert chunk - 32 < math.ceil(kv / splits)  # not larger than the alignment needs
