"""GPU: the pre-restart speed check's host program (``python -m kdtree_backend.speed_ab``) as a deploy runs it on a
GPU host, judged by the judge a deploy calls (``opsctl.speed.judge``) at the inventory's defaults: the same release
twice passes, a release whose verify path does 10% more work in the same launches fails, and both sides were timed
with the kernel through CUDA graphs on the default synthetic set within the check's budget.

The slowed release is ``kernel/bench/speed_ab.py``'s slowed copy (every request's key list holds 10% of its prefix
keys twice): the same copy the GPU machine's ``run_device.sh speed-ab`` times.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from opsctl.inventory.settings import SpeedSettings
from opsctl.speed.judge import SpeedVerdict, judge_speed, timed_calls
from tests.backend.helpers import REPO
from tests.gpu_helpers import NEEDS_EXTENSION, require_kernel

pytestmark = list(NEEDS_EXTENSION)
STARTUP_S = 60.0  # two workers importing torch, the calls built and loaded, 18 graphs captured (7.5 s on an H100)


def bench_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kdtree_bench_speed_ab", REPO / "kernel" / "bench" / "speed_ab.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check(new: Path, old: Path) -> dict[str, Any]:
    settings = SpeedSettings()
    config = {"rounds": settings.rounds, "budget_s": settings.budget_s}
    res = subprocess.run(
        [sys.executable, "-m", "kdtree_backend.speed_ab", "--against", str(old)],
        input=json.dumps(config), capture_output=True, text=True, cwd=new, timeout=300,
        env={**os.environ, "PYTHONPATH": f"{new / 'kernel'}:{new / 'backend'}"},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert "calls" in doc, doc
    return doc


@pytest.fixture(scope="module")
def slowed_release(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_kernel()
    return bench_module().slowed(tmp_path_factory.mktemp("speed") / "slowed", 0.10)


def judged(doc: dict[str, Any]) -> Any:
    settings = SpeedSettings()
    return judge_speed(timed_calls(doc), max_slowdown=settings.max_slowdown, alpha=settings.alpha, against="old")


def test_the_same_release_twice_passes_timed_as_production_runs_it() -> None:
    require_kernel()
    doc = check(REPO, REPO)
    assert doc["device"] == "cuda"
    assert doc["paths"] == {"new": "kernel", "old": "kernel"}, "both sides must time the kernel, not the reference"
    assert doc["graphs"] == {"new": True, "old": True}, "a GPU host serves through CUDA graphs: time their replay"
    assert any(c["bs"] >= 8 for c in doc["calls"]), "the synthetic set must hold a bs >= 8 case"
    assert doc["rounds"] >= 3
    assert doc["elapsed_s"] < SpeedSettings().budget_s + STARTUP_S
    verdict = judged(doc)
    assert verdict.verdict is SpeedVerdict.PASS, verdict.line()


def test_a_release_doing_more_work_in_its_verify_fails(slowed_release: Path) -> None:
    doc = check(slowed_release, REPO)
    verdict = judged(doc)
    assert verdict.verdict is SpeedVerdict.FAIL, verdict.line()
    assert verdict.speed is not None and verdict.speed < 1 / (1 + SpeedSettings().max_slowdown)
