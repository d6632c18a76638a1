"""opsctl/testbed/localrun.py: a failing local command is an error that carries its output's tail."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl import errors
from opsctl.testbed.localrun import last_log_line, run


def test_failure_names_the_step_its_exit_and_its_stderr() -> None:
    with pytest.raises(errors.TestbedError, match=r"mount of tb1's disk failed \(exit 3\): no such device"):
        run(["sh", "-c", "echo no such device >&2; exit 3"], what="mount of tb1's disk")


def test_failure_with_a_log_points_at_it_with_its_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    with pytest.raises(errors.TestbedError) as caught:
        run(["sh", "-c", 'echo "E: Couldn\'t find package"; exit 1'], log_file=log, what="debootstrap")
    assert f"see {log}" in caught.value.message and "E: Couldn't find package" in caught.value.message
    assert last_log_line(log) == "E: Couldn't find package"


def test_deadline() -> None:
    with pytest.raises(errors.TestbedError, match=r"pip download did not finish within 0\.3s"):
        run(["sleep", "5"], timeout=0.3, what="pip download")
