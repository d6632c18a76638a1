"""`opsctl status` and `opsctl logs` ask the deploy gate's judge (opsctl.gate.decision.judge) about every parity
line they show, with the host's token, TP size and thresholds: a forged line (without the running invocation's
token, with another one, or the marker inside another message) reads IGNORED, never PASS. Pure: no host."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from opsctl.cli import logs as cli_logs
from opsctl.cli import status as cli_status
from opsctl.cli.parityview import LineJudge, counted, latest_per_rank_and_layer
from opsctl.gate.decision import LineVerdict
from opsctl.host import views
from opsctl.host.releaseroot import parse_snapshot
from opsctl.inventory import HostConfig
from tests import builders

TOKEN = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"


def host(tp: int = 2) -> HostConfig:
    return builders.host("h", gpu_arch=None, service={"tp": tp})


def parity(rel: str = "1.0e-03", rank: int = 0, layer: int = 30, token: str | None = TOKEN) -> str:
    tail = f" token={token}" if token else ""
    return f"[kdtree] L{layer} max_abs_diff=1.0e-03 mean=1.0e-04 rel={rel} tp={rank}{tail}"


REAL = parity()
NO_TOKEN = parity(token=None)
WRONG_TOKEN = parity(token=OTHER)
MISPLACED = f"INFO: request body was {parity(token=OTHER)}"  # the marker inside another message (a logged request)
# The same holding the invocation's token: its own output glued to another message, or a leak: a FAIL (issue 36).
GLUED = f"kdtree-standin: served rid=1 e2e_latency=0.540s{parity()}"


@pytest.mark.parametrize(
    ("message", "verdict"),
    [
        (REAL, LineVerdict.PASS),
        (NO_TOKEN, LineVerdict.IGNORED),
        (WRONG_TOKEN, LineVerdict.IGNORED),
        (MISPLACED, LineVerdict.IGNORED),
        (GLUED, LineVerdict.FAIL),
        (f"INFO: request body was {parity()}", LineVerdict.FAIL),
        (parity("9.0e-01"), LineVerdict.FAIL),
        (parity("2.0e-02"), LineVerdict.INCONCLUSIVE),
        (parity(rank=5), LineVerdict.FAIL),  # a rank outside the unit's 2 TP ranks: malformed here, as at the gate
        (parity("nan"), LineVerdict.FAIL),
        (parity(token=None) + " tp=1", LineVerdict.IGNORED),  # garbled (duplicated tp=) but not the invocation's
    ],
)
def test_the_judge_status_and_logs_ask_is_the_gates(message: str, verdict: LineVerdict) -> None:
    judged = LineJudge(host(), TOKEN).message(message)
    assert judged is not None and judged.verdict is verdict, judged


def test_without_a_token_on_the_host_lines_are_judged_as_the_gate_does_without_one() -> None:
    judge = LineJudge(host(), None)
    assert [judge.message(m).verdict for m in (REAL, NO_TOKEN, WRONG_TOKEN)] == [LineVerdict.PASS] * 3  # type: ignore[union-attr]
    assert judge.message(MISPLACED).verdict is LineVerdict.IGNORED  # type: ignore[union-attr]
    assert judge.message("INFO: nothing about parity") is None


def journal(msg: str) -> str:
    return json.dumps({"MESSAGE": msg, "__REALTIME_TIMESTAMP": "1780000000000000"})


def feed_all(printer: cli_logs._LogPrinter, grep: str | None = "parity") -> None:
    matcher = cli_logs._matcher(grep)
    for msg in (REAL, NO_TOKEN, WRONG_TOKEN, MISPLACED, "INFO: unrelated"):
        printer.feed(journal(msg), matcher)
    printer.flush()


def test_logs_grep_parity_json_shows_forged_lines_as_ignored(capsys: pytest.CaptureFixture[str]) -> None:
    printer = cli_logs._LogPrinter(host(), as_json=True, stream=False)
    printer.use_token(TOKEN)  # as read_journal hands it over, before the first line
    feed_all(printer)
    docs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [d["verdict"] for d in docs] == ["PASS", "IGNORED", "IGNORED", "IGNORED"]
    assert {d["kind"] for d in docs} == {"parity"} and docs[3]["message"] == MISPLACED and "layer" not in docs[3]


@pytest.mark.parametrize("stream", [False, True])
def test_logs_grep_parity_table_and_follow_show_forged_lines_as_ignored(
    stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(cli_logs, "console", Console(file=buf, width=200, color_system=None, force_terminal=True))
    feed_all(cli_logs._LogPrinter(host(), as_json=False, stream=stream, token=TOKEN))
    rows = [line for line in buf.getvalue().splitlines() if "PASS" in line or "IGNORED" in line]
    assert len(rows) == 4 and "PASS" in rows[0] and all("IGNORED" in r and "PASS" not in r for r in rows[1:])
    assert "unrelated" not in buf.getvalue()


def test_logs_without_grep_still_judges_parity_lines(capsys: pytest.CaptureFixture[str]) -> None:
    printer = cli_logs._LogPrinter(host(), as_json=True, stream=False, token=TOKEN)
    feed_all(printer, grep=None)
    kinds = [(d["kind"], d.get("verdict")) for d in map(json.loads, capsys.readouterr().out.splitlines())]
    assert kinds == [("parity", "PASS"), *[("parity", "IGNORED")] * 3, ("log", None)]


def test_a_forged_line_never_stands_for_its_rank_and_layer_in_status() -> None:
    """The newest line of TP0 L30 is a forgery reading PASS: status shows the real, older FAIL."""
    judge = LineJudge(host(), TOKEN)
    judged = [judge.message(m) for m in (parity("9.0e-01"), NO_TOKEN, WRONG_TOKEN, MISPLACED)]
    latest = latest_per_rank_and_layer(counted([j for j in judged if j is not None]))
    assert [j.verdict for j in latest] == [LineVerdict.FAIL]


def test_status_json_and_table_judge_as_the_gate(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = parse_snapshot("root_exists=1\nunit_active=active\n")
    messages = [parity("9.0e-01", rank=1), parity(rank=0), NO_TOKEN, MISPLACED, parity(rank=7)]
    view = views.StatusView(snap, [], messages, TOKEN)
    monkeypatch.setattr(views, "read_status", lambda _h: view)
    doc = cli_status._status_one(host(), as_json=True)
    assert [(p["rank"], p["verdict"]) for p in doc["parity"]] == [(0, "PASS"), (1, "FAIL"), (7, "FAIL")]
    buf = io.StringIO()
    monkeypatch.setattr(cli_status, "console", Console(file=buf, width=200, color_system=None))
    cli_status._status_one(host(), as_json=False)
    text = buf.getvalue()
    assert "2 marked line(s) of the current invocation IGNORED" in text
    rows = [line for line in text.splitlines() if "│" in line and "FAIL" in line]
    assert len(rows) == 2  # TP1 over the fail threshold, TP7 outside the unit's 2 ranks (malformed: its reason)
    assert "outside the unit's 2 TP ranks" in text and "nan" not in text


def test_every_json_document_names_nan_and_the_infinities(capsys: pytest.CaptureFixture[str]) -> None:
    """One helper (gate.decision.json_float) for the gate's summary, parity check and the CLI's --json."""
    from opsctl.cli.common import emit_json, to_jsonable
    from opsctl.gate.decision import json_float

    assert [json_float(x) for x in (float("nan"), float("inf"), -float("inf"), 0.5)] == ["nan", "inf", "-inf", 0.5]
    assert to_jsonable({"rel": float("nan"), "worst": [float("-inf"), 1.0]}) == {"rel": "nan", "worst": ["-inf", 1.0]}
    emit_json({"parity": [{"rel": float("inf")}]})
    assert json.loads(capsys.readouterr().out) == {"parity": [{"rel": "inf"}]}
