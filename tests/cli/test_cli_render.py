"""The CLI's pure renderers: log lines (shapes decoded, parity verdicts), release metadata."""

import io
import json
import re

import pytest
from rich.console import Console

from opsctl.cli import logs as cli_logs
from opsctl.host import releaseroot
from opsctl.inventory import HostConfig
from tests import builders

SHAPES = "[kdtree] shapes q=(9, 8, 576) kv_buf=(195012, 576) bs=1 q_len=9 Dl=512 Dr=64 kv_len_max=21 scale=0.14468 mask=(270,)"
PARITY = "[2026-05-31 13:04:12 TP3] [kdtree] L56 max_abs_diff=1.6934e+00 mean=1.1948e-01 rel=1.0837e+00 tp=3"


def journal(msg: str) -> str:
    return json.dumps({"MESSAGE": msg, "__REALTIME_TIMESTAMP": "1780000000000000"})


@pytest.fixture
def out(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    buf = io.StringIO()
    monkeypatch.setattr(cli_logs, "console", Console(file=buf, width=200, color_system=None, force_terminal=True))
    return buf


@pytest.fixture
def piped(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    buf = io.StringIO()
    monkeypatch.setattr(cli_logs, "console", Console(file=buf, width=80, color_system=None))
    return buf


def host() -> HostConfig:
    return builders.host("h", gpu_arch=None)


def test_shapes_decoded_with_bug_warning(out: io.StringIO) -> None:
    p = cli_logs._LogPrinter(host(), as_json=False, stream=False)
    p.feed(journal(SHAPES), cli_logs._matcher("shapes"))
    p.feed(journal(PARITY), cli_logs._matcher("shapes"))
    p.flush()
    text = out.getvalue()
    assert "kv_len_max=21" in text and "9 query tokens x 8 heads x 576" in text
    assert "classic marshaling bug" in text and "L56" not in text


def test_parity_table_with_verdicts(out: io.StringIO) -> None:
    p = cli_logs._LogPrinter(host(), as_json=False, stream=False)
    for line in (PARITY, PARITY.replace("rel=1.0837e+00", "rel=1.0e-03"), "unrelated"):
        p.feed(journal(line), cli_logs._matcher("parity"))
    p.flush()
    text = out.getvalue()
    assert "TP3" in text and "L56" in text and "FAIL" in text and "PASS" in text and "unrelated" not in text


def test_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    p = cli_logs._LogPrinter(host(), as_json=True, stream=False)
    p.feed(journal(PARITY), cli_logs._matcher(None))
    p.feed(journal("[kdtree] L1 max_abs_diff=nan mean=nan rel=nan tp=0"), cli_logs._matcher("parity"))
    docs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert docs[0]["kind"] == "parity" and docs[0]["rank"] == 3 and docs[0]["verdict"] == "FAIL"
    assert docs[1]["rel"] == "nan" and docs[1]["verdict"] == "FAIL"


def test_regex_grep_and_bad_regex() -> None:
    m = cli_logs._matcher("kv_len_max=2[01]")
    assert m(SHAPES, None, None) and not m(PARITY, None, None)
    with pytest.raises(cli_logs.UsageError):
        cli_logs._matcher("(")


def test_release_meta() -> None:
    text = '== r00000000000a\n "created_at": "2026-01-01T00:00:00Z",\n  "commit": "abc",\n  "dirty": true\n== r0-00000000000b\n'
    meta = releaseroot.parse_release_meta(text)
    assert meta["r00000000000a"] == {"created_at": "2026-01-01T00:00:00Z", "commit": "abc", "dirty": True}
    assert meta["r0-00000000000b"] == {}


TOKEN = "0123456789abcdef0123456789abcdef"


def journal_of_two_deploys() -> list[str]:
    """`journalctl -o json` of two invocations (the second a bad release), as `opsctl logs` reads it."""
    out = []
    for n, (token, rel) in enumerate(((TOKEN, "2.0e-03"), (TOKEN[::-1], "9.0e-01"))):
        out.append(json.dumps({"MESSAGE": "Started sglang-k26-ddtree.service.", "__REALTIME_TIMESTAMP": "1"}))
        for layer in (0, 30, 60):
            msg = f"[kdtree] L{layer} max_abs_diff=1.0e-03 mean=1.0e-04 rel={rel} tp=0 token={token} mode=graph"
            out.append(json.dumps({"MESSAGE": msg, "__REALTIME_TIMESTAMP": f"178000000{n}000000"}))
        out.append(json.dumps({"MESSAGE": "INFO: a log line with a\u2028separator", "__REALTIME_TIMESTAMP": "2"}))
    return out


def test_logs_grep_parity_piped_is_decoded_one_line_an_entry(piped: io.StringIO) -> None:
    """Piped without --raw (issue 38): each parity entry one decoded line with its verdict (and, unless it passed,
    why), never the journal's text and never wrapped."""
    entries = journal_of_two_deploys()
    p = cli_logs._LogPrinter(host(), as_json=False, stream=False)
    for e in entries:
        p.feed(e, cli_logs._matcher("parity"))
    p.flush()
    lines = piped.getvalue().splitlines()
    assert len(lines) == 6 and not any("[kdtree]" in line for line in lines), lines
    assert all(
        re.search(r" parity (TP\d+ )?L\d+ rel=\S+ max_abs_diff=\S+ mean=\S+ (PASS|FAIL|IGNORED|INCONCLUSIVE)", line)
        for line in lines
    ), lines
    assert all(line.endswith("PASS") or "(" in line for line in lines)  # a line that did not pass says why


@pytest.mark.parametrize("as_json", [False, True])
def test_logs_grep_parity_pipes_into_parity_check(
    as_json: bool, piped: io.StringIO, capsys: pytest.CaptureFixture[str]
) -> None:
    """`opsctl logs HOST --grep parity --raw|--json | opsctl parity check -` reaches the journal's own verdict (it was
    NODATA from the table, and every line IGNORED from --json)."""
    from opsctl.gate.parity_check import check_journal
    from opsctl.inventory import GateSettings

    entries = journal_of_two_deploys()
    p = cli_logs._LogPrinter(host(), as_json=as_json, stream=False, raw=not as_json)
    for e in entries:
        p.feed(e, cli_logs._matcher("parity"))
    p.flush()
    shown = capsys.readouterr().out if as_json else piped.getvalue()
    assert shown.count("[kdtree] L") == 6
    direct = check_journal(entries, GateSettings(), tp=1)
    via_logs = check_journal(shown, GateSettings(), tp=1)
    assert direct.verdict == via_logs.verdict and str(via_logs.verdict) == "FAIL"
    assert via_logs.judged.token == TOKEN[::-1] and len(via_logs.invocations) == 2
    assert via_logs.judged.ignored == 0 and via_logs.state.lines == 1
    first = check_journal(shown, GateSettings(), tp=1, token=TOKEN)
    assert str(first.verdict) == "PASS" and first.judged.ignored == 3
