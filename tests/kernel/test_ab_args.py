"""The A/B stage's case lists (kernel/bench/ab_kernel.py; CPU, no GPU): AB_CASES and AB_SHAPES are read with commas
or spaces between items, and a bad item is refused with its text before any build is timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "kernel" / "bench"


@pytest.fixture(scope="module")
def ab_kernel() -> ModuleType:
    sys.path.insert(0, str(BENCH))
    try:
        import ab_kernel
    finally:
        sys.path.remove(str(BENCH))
    return ab_kernel


def test_cases_take_commas_or_spaces(ab_kernel: ModuleType) -> None:
    assert ab_kernel.parse_cases("0,1 2,5  9") == {0, 1, 2, 5, 9}
    assert ab_kernel.parse_cases("") == set()


@pytest.mark.parametrize("bad", ["x", "-1", "99", "1.5"])
def test_a_case_outside_tree_cases_is_refused(ab_kernel: ModuleType, bad: str) -> None:
    with pytest.raises(ValueError, match="not an index into TREE_CASES"):
        ab_kernel.parse_cases(f"0,{bad}")


def test_shapes_take_commas_or_spaces(ab_kernel: ModuleType) -> None:
    got = ab_kernel.parse_shapes("1x4096x9x8, 64x8192x2x8:fp8 8x512x9x16")
    assert got == [(1, 4096, 9, 8, False), (64, 8192, 2, 8, True), (8, 512, 9, 16, False)]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("1x4096x9", "not BSxPREFIXxQLENxHEADS"),
        ("1x0x9x8", "not BSxPREFIXxQLENxHEADS"),
        ("1x4096x9x8:fp16", "pool kind"),
    ],
)
def test_a_malformed_shape_is_refused_by_its_text(ab_kernel: ModuleType, bad: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        ab_kernel.parse_shapes(f"1x1024x9x8,{bad}")
    assert bad in str(err.value)


def test_the_stage_check_refuses_a_bad_list_before_any_build() -> None:
    """run_device.sh's ab stage runs this first and stops on its exit code (call 1 of AL lost a build to a list)."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "ab_kernel.py"), "--check-args", "--cases", "0 5", "--shapes", "1x4096x9"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "'1x4096x9' is not BSxPREFIXxQLENxHEADS" in done.stderr
    fine = [sys.executable, str(BENCH / "ab_kernel.py"), "--check-args", "--cases", "0 5", "--shapes", "1x4096x9x8"]
    assert subprocess.run(fine, capture_output=True, check=False).returncode == 0
