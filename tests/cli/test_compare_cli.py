"""`opsctl compare BASELINE.json CANDIDATE.json` as a user runs it (a whole process): the judge's verdict as exit
0 / 31 / 32, the thresholds' flags, --json, bad input named by file, and no SSH stack loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from opsctl.comparison.sample import ComparisonSample
from tests.comparison.test_compare import side, with_host_s, with_requests

NO_INVENTORY = {"OPSCTL_INVENTORY": "/nonexistent/inventory.yaml", "COLUMNS": "200"}


def _write(tmp_path: Path, name: str, sample: ComparisonSample) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(sample.to_json()))
    return path


def _compare(*args: str | Path) -> subprocess.CompletedProcess[str]:
    # The inventory is never read without --host: a command that read one, or connected, would fail here.
    code = (
        "import sys; from opsctl.cli.main import main; rc = main(sys.argv[1:]); "
        "assert 'paramiko' not in sys.modules, 'opsctl compare loaded the SSH stack'; sys.exit(rc)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, "compare", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, **NO_INVENTORY},
        check=False,
    )


def test_the_same_release_passes(tmp_path: Path) -> None:
    a, b = _write(tmp_path, "old.json", side()), _write(tmp_path, "new.json", side())
    r = _compare(a, b)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("comparison: PASS compared with old.json on 16 requests: 16/16 answers identical; ")


def test_a_slower_release_fails_with_31_and_says_why(tmp_path: Path) -> None:
    a, b = _write(tmp_path, "old.json", side()), _write(tmp_path, "new.json", side(scale=1.5))
    r = _compare(a, b, "--name", "rfb4d975")
    assert r.returncode == 31, r.stderr
    assert "\n  decode 0.67x of rfb4d975 (p=" in r.stdout
    # The same samples under a looser threshold pass: the flags reach the judge.
    assert _compare(a, b, "--max-slowdown", "0.5").returncode == 0


def test_cannot_decide_exits_32(tmp_path: Path) -> None:
    down = {i: {"status": 503, "error": "overloaded", "output_ids": ()} for i in range(12)}
    a = _write(tmp_path, "old.json", with_requests(side(), down))
    b = _write(tmp_path, "new.json", side())
    r = _compare(a, b)
    assert r.returncode == 32 and "too few requests answered on both sides" in r.stdout


def test_json_carries_the_result(tmp_path: Path) -> None:
    a, b = _write(tmp_path, "old.json", side()), _write(tmp_path, "new.json", side(accept=2.0))
    r = _compare(a, b, "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 31 and doc["outcome"] == "FAIL" and doc["drafts"]["outcome"] == "FAIL"
    assert doc["settings"]["max_accept_drop"] == 0.1


def test_bad_input_is_one_line_naming_the_file(tmp_path: Path) -> None:
    good = _write(tmp_path, "good.json", side())
    broken = tmp_path / "broken.json"
    broken.write_text('{"requests": [\n  {"output_ids": [1, 2,]}\n]}')
    r = _compare(good, broken)
    assert r.returncode == 2 and f"{broken}:2: not JSON" in r.stderr
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"requests": [{**side().requests[0].to_json(), "ttft_s": "fast"}]}))
    r = _compare(wrong, good)
    assert r.returncode == 2 and f"{wrong}: not a comparison sample: requests[0].ttft_s" in r.stderr
    r = _compare(tmp_path / "missing.json", good)
    assert r.returncode == 2 and "missing.json: cannot read" in r.stderr


def test_bad_thresholds_are_refused_by_flag(tmp_path: Path) -> None:
    a = _write(tmp_path, "a.json", side())
    r = _compare(a, a, "--alpha", "0")
    assert r.returncode == 2 and "--alpha" in r.stderr
    r = _compare(a, a, "--max-slowdown", "nan")
    assert r.returncode == 2 and "finite" in r.stderr
    r = _compare(a, a, "--min-identical", "1.5", "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["exit_code"] == 2 and "--min-identical" in r.stderr


def test_a_withheld_slowdown_is_unproven_exit_32_and_an_unexplained_one_fails(tmp_path: Path) -> None:
    # The deploy's rule offline (issue 47): the host's contention withholds only the slowdown it can explain.
    old = _write(tmp_path, "old.json", with_host_s(side(), 0.004))
    explained = _write(tmp_path, "busy.json", with_host_s(side(scale=1.5), 0.0058))
    r = _compare(old, explained, "--name", "r1")
    assert r.returncode == 32, r.stdout + r.stderr
    assert r.stdout.startswith("comparison: UNPROVEN compared with r1") and "not proven, never a PASS" in r.stdout
    unexplained = _write(tmp_path, "slow.json", with_host_s(side(scale=1 / 0.63), 0.00464))
    r = _compare(old, unexplained, "--name", "r1", "--json")
    assert r.returncode == 31, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["outcome"] == "FAIL" and doc["load"]["host_differs"] is True and doc["speed"]["note"]
