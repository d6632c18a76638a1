"""The replay service as the units and the deploy run it: a subprocess with PYTHONPATH=kernel:backend."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from kdtree_backend.replay import ReplayOutcome, verdict_exit_code

from tests.backend.helpers import PARITY_RE, PYTHON, REPO, SHAPES_RE, buggy_release, replay_env

ARGS = ["--bs", "2", "--prefix", "64", "--q-len", "9", "--heads", "8", "--layers", "0,30", "--interval", "0"]


def run_replay(root: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "kdtree_backend.replay", *args],
        cwd=root,
        env=replay_env(root),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def parity_rels(stdout: str) -> list[float]:
    return [float(m.group(4)) for m in map(PARITY_RE.match, stdout.splitlines()) if m]


def test_two_steps_print_parseable_lines_and_pass() -> None:
    res = run_replay(REPO, "--steps", "2", "--device", "cpu", "--threshold", "0.02", *ARGS)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    shapes = [m for m in map(SHAPES_RE.match, lines) if m]
    assert len(shapes) == 1  # one signature (all layers alike): printed once
    q_tokens, heads, dim, _, _, bs, q_len, dl, dr, kv_len_max, scale, mask = shapes[0].groups()
    assert (int(q_tokens), int(heads), int(dim), int(bs), int(q_len)) == (18, 8, 576, 2, 9)
    assert (int(dl), int(dr), int(kv_len_max), float(scale)) == (512, 64, 73, 0.14468)
    assert int(mask) >= 9 * (64 + 9)
    rels = parity_rels(res.stdout)
    assert len(rels) == 4 and all(r < 0.02 for r in rels)
    assert "[kdtree] fallback reason=cpu_device" in res.stdout  # said once, not per step
    assert res.stdout.count("fallback") == 1


@pytest.mark.parametrize("bug", ["drafts", "stride"])
def test_classic_bug_release_fails_the_pre_restart_check(bug: str, tmp_path: Path) -> None:
    root = buggy_release(bug, tmp_path)
    res = run_replay(root, "--steps", "1", "--device", "cpu", "--threshold", "0.02", *ARGS)
    assert res.returncode == 3, res.stdout + res.stderr
    rels = parity_rels(res.stdout)
    assert rels and min(rels) > 0.5, rels


def test_service_mode_stops_cleanly_on_sigterm() -> None:
    proc = subprocess.Popen(
        [PYTHON, "-m", "kdtree_backend.replay", "--steps", "0", "--device", "cpu", *ARGS[:-1], "0.2"],
        cwd=REPO,
        env=replay_env(REPO),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        parity = 0
        while parity < 3 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            parity += bool(PARITY_RE.match(line.rstrip("\n")))
        assert parity >= 3, "the service printed no parity lines"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0
        assert "SIGTERM received" in out
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize(
    ("outcome", "threshold", "code"),
    [
        (ReplayOutcome(steps_done=2, parity_lines=6), 0.02, 0),
        (ReplayOutcome(steps_done=2, parity_lines=6, over_threshold=1), 0.02, 3),
        (ReplayOutcome(steps_done=2, parity_lines=0), 0.02, 3),
        (ReplayOutcome(steps_done=2, parity_lines=6, over_threshold=6), None, 0),
    ],
)
def test_verdict_exit_code(outcome: ReplayOutcome, threshold: float | None, code: int) -> None:
    assert verdict_exit_code(outcome, threshold) == code


def test_bad_arguments_exit_2() -> None:
    res = run_replay(REPO, "--steps", "0", "--threshold", "0.1")
    assert res.returncode == 2 and "--threshold needs a finite --steps" in res.stderr
