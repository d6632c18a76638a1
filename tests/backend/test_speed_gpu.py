"""GPU: the pre-restart speed check as a deploy runs it on a GPU host: its command, config and reader
(``opsctl.speed.check``) for a host with the inventory's defaults, run here instead of over SSH. The same release
twice passes, a release whose verify path does 10% more work in the same launches fails, and both sides were timed
with the kernel through CUDA graphs on the default synthetic set within the check's budget.

The slowed release is ``kernel/bench/speed_ab.py``'s slowed copy (every request's key list holds 10% of its prefix
keys twice): the same copy the GPU machine's ``run_device.sh speed-ab`` times.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from opsctl.speed.check import read_speed, speed_command, speed_config
from opsctl.speed.judge import SpeedJudgement, SpeedVerdict
from tests.backend.helpers import REPO
from tests.builders import host
from tests.gpu_helpers import NEEDS_EXTENSION, require_kernel

pytestmark = list(NEEDS_EXTENSION)
HOST = host("gpu")  # the inventory's defaults: gate.speed, the draft tree size
STARTUP_S = 60.0  # two workers importing torch, the calls built and loaded, 18 graphs captured (7.5 s on an H100)


def bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kdtree_bench_speed_ab", REPO / "kernel" / "bench" / "speed_ab.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(new: Path, old: Path) -> tuple[dict[str, Any], SpeedJudgement]:
    """The host program's document and the deploy's judgement of it."""
    cmd = speed_command(sys.executable, str(new), str(old), speed_config(HOST))
    res = subprocess.run(["bash", "-c", cmd.command], input=cmd.stdin, capture_output=True, text=True,
                         timeout=cmd.timeout_s)  # fmt: skip
    judgement = read_speed(res.stdout, res.returncode, res.stderr, host=HOST, against="old")
    assert judgement.verdict is not SpeedVerdict.SKIPPED, judgement.line()
    return json.loads(res.stdout.strip().splitlines()[-1]), judgement


@pytest.fixture(scope="module")
def slowed_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_kernel()
    return bench_module().slowed(tmp_path_factory.mktemp("speed") / "slowed", 0.10)


def test_the_same_release_twice_passes_timed_as_production_runs_it() -> None:
    require_kernel()
    doc, verdict = check(REPO, REPO)
    assert doc["device"] == "cuda"
    assert doc["paths"] == {"new": "kernel", "old": "kernel"}, "both sides must time the kernel, not the reference"
    assert doc["graphs"] == {"new": True, "old": True}, "a GPU host serves through CUDA graphs: time their replay"
    assert any(c["bs"] >= 8 for c in doc["calls"]), "the synthetic set must hold a bs >= 8 case"
    assert doc["rounds"] >= 3
    assert doc["elapsed_s"] < HOST.gate.speed.budget_s + STARTUP_S
    assert verdict.verdict is SpeedVerdict.PASS, verdict.line()


def test_a_release_doing_more_work_in_its_verify_fails(slowed_release: Path) -> None:
    _, verdict = check(slowed_release, REPO)
    assert verdict.verdict is SpeedVerdict.FAIL, verdict.line()
    assert verdict.speed is not None and verdict.speed < 1 / (1 + HOST.gate.speed.max_slowdown)
