"""The diagnostic kernel patches under kernel/bench/patches still apply to kernel/csrc (CPU, no GPU).

`run_device.sh trace` and `run_device.sh phases` copy kernel/csrc aside, apply these diffs and build; a diff whose
context the kernel has moved away from stops the stage at the patch, which is found only on a GPU session.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GIT = shutil.which("git")


@pytest.mark.skipif(GIT is None, reason="git not found on PATH")
@pytest.mark.parametrize("diff", ["trace-kernel.diff", "phases-kernel.diff"])
def test_diagnostic_patch_applies_to_the_kernel_sources(diff: str) -> None:
    patch = REPO / "kernel" / "bench" / "patches" / diff
    done = subprocess.run(
        [GIT, "apply", "--check", "-p1", "--directory=kernel/csrc", str(patch)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, f"{diff} no longer applies to kernel/csrc: {done.stderr.strip()}"
