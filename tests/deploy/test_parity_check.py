"""`opsctl parity check`: the offline verdict is the deploy gate's verdict on the same text."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from opsctl.gate import LineVerdict, Verdict
from opsctl.inventory import GateSettings
from opsctl.parity_check import check_journal

TOKEN = "0123456789abcdef0123456789abcdef"
J = "2026-05-31T13:04:12+0000 ct200 python[22251]: "


def good(layer: int, rank: int, rel: str = "2.0e-03", token: str = TOKEN) -> str:
    return f"{J}[kdtree] L{layer} max_abs_diff=1.0e-03 mean=1.0e-04 rel={rel} tp={rank} token={token}"


def passing(ranks: int) -> list[str]:
    return [good(layer, rank) for rank in range(ranks) for layer in (0, 30, 60)]


S = GateSettings()


def test_all_ranks_passing_is_pass() -> None:
    check = check_journal(passing(2), S, tp=2, token=TOKEN)
    assert check.verdict is Verdict.PASS and len(check.lines) == 6


def test_a_silent_rank_is_nodata() -> None:
    check = check_journal(passing(1), S, tp=2, token=TOKEN)
    assert check.verdict is Verdict.NODATA and "TP rank(s) 1" in check.state.reason


def test_forged_lines_cannot_pass() -> None:
    forged = [
        f"{J}INFO request text: please print [kdtree] L56 max_abs_diff=0 mean=0 rel=0 tp=0 token={TOKEN}",
        *(good(layer, 0, token="ffffffffffffffff") for layer in (0, 30, 60)),
        *(good(layer, 0).replace(f" token={TOKEN}", "") for layer in (0, 30, 60)),
    ]
    check = check_journal(forged, S, tp=1, token=TOKEN)
    assert check.verdict is Verdict.NODATA
    # Every one is ignored and counted as such; the first few are listed.
    assert check.judged.ignored == 7 and check.state.lines == 0
    assert [c.judgement.verdict for c in check.lines] == [LineVerdict.IGNORED] * 5
    assert "inside another message" in check.lines[0].judgement.reason


def test_without_a_token_everything_else_is_still_checked() -> None:
    lines = [*passing(1)[:2], good(60, 0, rel="0.9 rel=0.001")]
    check = check_journal(lines, S, tp=1)
    assert check.verdict is Verdict.FAIL and "duplicated rel" in check.state.reason


def test_thresholds_decide_inconclusive() -> None:
    check = check_journal([good(0, 0, rel="0.02")] * 5, S, tp=1, token=TOKEN)
    assert check.verdict is Verdict.INCONCLUSIVE
    assert "neither pass nor fail" in check.lines[0].judgement.reason


def opsctl(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "opsctl", "parity", "check", *args], input=stdin, capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("args", "lines", "rc", "verdict"),
    [
        (["--tp", "2", "--token", TOKEN], passing(2), 0, "PASS"),
        (["--tp", "2", "--token", TOKEN], passing(1), 31, "NODATA"),
        (["--tp", "1", "--token", "ffffffffffffffff"], passing(1), 31, "NODATA"),
        (["--tp", "1", "--fail-rel", "0.001", "--pass-rel", "0.0005"], passing(1), 31, "FAIL"),
    ],
)
def test_cli_exit_code_and_json(args: list[str], lines: list[str], rc: int, verdict: str) -> None:
    res = opsctl("-", "--json", *args, stdin="\n".join(lines) + "\n")
    assert res.returncode == rc, res.stderr
    doc = json.loads(res.stdout)
    assert doc["verdict"] == verdict and len(doc["lines"]) == len(lines)


def test_cli_text_names_each_line_and_the_aggregate() -> None:
    res = opsctl("-", "--tp", "1", stdin="\n".join(passing(1)) + "\n")
    assert res.returncode == 0, res.stderr
    assert res.stdout.count(": PASS rel 0.002 <= 0.01") == 3
    assert "gate: PASS" in res.stdout and "token checked (the invocation's own)" in res.stdout


def test_cli_unreadable_file_is_one_line_and_exit_2(tmp_path: object) -> None:
    res = opsctl("/nonexistent/journal.txt", stdin="")
    assert res.returncode == 2 and "cannot read" in res.stderr and "Traceback" not in res.stderr
