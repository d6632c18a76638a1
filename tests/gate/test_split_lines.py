"""A parity line that journald splits (LineMax, 48 KiB by default) is a FAIL wherever the cut falls: live (the JSON
entry's ``_LINE_BREAK``), offline on the JSON journal and on its text form, where ``_LINE_BREAK`` is not visible
and the pieces are told by what they leave of the token (issue 47, case 1)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.gate.decision import GateState, LineVerdict, Verdict, judge
from opsctl.gate.ownership import claims_token, cut_token, token_rest_at_start
from opsctl.gate.parity_check import check_journal
from opsctl.health.probe import parity_from_probe
from opsctl.health.probe_on_host import parity_lines
from opsctl.inventory import GateSettings
from opsctl.journal.query import parse_entries

standin = pytest.importorskip("kdtree_backend.standin", reason="the backend's stand-in needs torch")

TOKEN = "0123456789abcdef0123456789abcdef"
LINE_MAX = 48 * 1024
S = GateSettings()


def good(layer: int, rank: int) -> str:
    return f"[kdtree] L{layer} max_abs_diff=1.0e-03 mean=1.0e-04 rel=2.0e-03 tp={rank} token={TOKEN}"


def failing_padded(cut_in_token: int, rank: int = 1) -> str:
    """A failing line of ``rank`` padded so that byte LINE_MAX falls ``cut_in_token`` characters into its token
    (0: right after ``token=``; negative: that many characters before ``token=``)."""
    head = f"[kdtree] L0 max_abs_diff=5.0e-01 mean=1.0e-01 rel=5.0e-01 tp={rank} pad="
    tail = f" token={TOKEN}"
    pad = LINE_MAX - len(head) - len(" token=") - cut_in_token
    return head + "y" * pad + tail


def pieces(message: str, at: int = LINE_MAX) -> list[str]:
    return [message[i : i + at] for i in range(0, len(message), at)]


def journal(cut_in_token: int, *, at: int = LINE_MAX) -> list[tuple[str, bool]]:
    """Rank 0 passes; rank 1 prints the failing split line first, then passes: (message, cut by journald)."""
    split = pieces(failing_padded(cut_in_token), at)
    out = [(good(layer, 0), False) for layer in (0, 30, 60)]
    out += [(p, i < len(split) - 1) for i, p in enumerate(split)]
    out += [(good(layer, 1), False) for layer in (0, 30, 60)]
    return out


def as_json(entries: list[tuple[str, bool]]) -> list[str]:
    docs = []
    for i, (message, cut) in enumerate(entries):
        doc = {"__CURSOR": f"s=1;i={i}", "MESSAGE": message, "_SYSTEMD_INVOCATION_ID": "ab" * 16}
        if cut:
            doc["_LINE_BREAK"] = "line-max"
        docs.append(json.dumps(doc))
    return docs


def as_text(entries: list[tuple[str, bool]]) -> list[str]:
    return [f"2026-12-06T01:02:03+0000 ct200 python[22251]: {m}" for m, _ in entries]


CUTS = [16, 1, 31, 0, -3, -40]  # inside the token (the reported case: 16), at its edges, before token=


@pytest.mark.parametrize("cut", CUTS)
def test_the_json_journal_with_line_break_fails(cut: int) -> None:
    check = check_journal(as_json(journal(cut)), S, tp=2, token=TOKEN)
    assert check.verdict is Verdict.FAIL, check.state.reason
    assert "journald split" in check.state.reason


@pytest.mark.parametrize("cut", CUTS)
def test_the_text_journal_fails_by_what_the_pieces_leave_of_the_token(cut: int) -> None:
    check = check_journal(as_text(journal(cut)), S, tp=2, token=TOKEN)
    assert check.verdict is Verdict.FAIL, check.state.reason


@pytest.mark.parametrize("cut", [16, 1, 31, 0])
def test_without_a_given_token_the_cut_line_stays_in_its_invocation_and_fails(cut: int) -> None:
    for lines in (as_text(journal(cut)), as_json(journal(cut))):
        check = check_journal(lines, S, tp=2)
        assert check.verdict is Verdict.FAIL and len(check.invocations) == 1, check.state.reason


def test_a_cut_token_as_an_invocations_first_line_does_not_start_one_of_its_own() -> None:
    entries = journal(16)[3:] + [(good(layer, 0), False) for layer in (0, 30, 60)]
    check = check_journal(as_text(entries), S, tp=2)
    assert check.verdict is Verdict.FAIL and len(check.invocations) == 1


def test_three_pieces_and_a_second_piece_alone_fail() -> None:
    three = journal(16, at=LINE_MAX // 2)
    assert sum(cut for _, cut in three) >= 2
    assert check_journal(as_json(three), S, tp=2, token=TOKEN).verdict is Verdict.FAIL
    rest_alone = [e for e in journal(16) if not e[0].startswith("[kdtree] L0 max_abs_diff=5")]
    assert any(m.startswith(TOKEN[16:]) for m, _ in rest_alone)
    check = check_journal(as_text(rest_alone), S, tp=2, token=TOKEN)
    assert check.verdict is Verdict.FAIL and "begins with the last 16 characters" in check.state.reason


def test_the_live_gate_fails_the_first_piece_from_its_json_entry() -> None:
    """The deploy's gate reads the poll's JSON: the piece's _LINE_BREAK reaches judge()."""
    entries = parse_entries("\n".join(as_json(journal(16))))
    assert [e.line_break for e in entries].count("line-max") == 1
    state = GateState(settings=S, started_at=0.0, deadline_s=60.0, expected_ranks=2, token=TOKEN)
    verdicts = [j.verdict for e in entries if (j := judge(state, e.message, 1.0, split=e.line_break))]
    assert state.verdict is Verdict.FAIL and LineVerdict.FAIL in verdicts
    assert "_LINE_BREAK=line-max" in state.reason


def test_a_cut_piece_without_the_marker_or_the_token_is_not_evidence() -> None:
    """A long log message of the server's that journald cut, with nothing of ours in it, changes nothing."""
    state = GateState(settings=S, started_at=0.0, deadline_s=60.0, expected_ranks=1, token=TOKEN)
    assert judge(state, "INFO request " + "x" * 60_000, 1.0, split="line-max") is None
    assert state.verdict is Verdict.PENDING and not state.cut_rests


def test_health_reads_the_cut_piece_as_the_gate_does() -> None:
    raw = {"parity_lines": parity_lines("\n".join(as_json(journal(16))), "[kdtree]", 100)}
    assert any(len(item) == 3 for item in raw["parity_lines"])
    samples = parity_from_probe(raw, S, TOKEN)
    assert any(s.line.problems and "journald split" in s.line.problems[0] for s in samples)


def test_the_token_rules() -> None:
    assert claims_token(TOKEN, TOKEN[:16], "x") and claims_token(TOKEN, None, f"a token={TOKEN[:5]}")
    assert claims_token(TOKEN, None, "a token=") and not claims_token(TOKEN, None, "a token=ffff")
    assert not claims_token(TOKEN, "ffffffffffffffff", "x") and not claims_token(TOKEN, TOKEN + "0", "x")
    assert cut_token(f"x token={TOKEN[:9]}", TOKEN) == TOKEN[:9] and cut_token(f"x token={TOKEN}", TOKEN) is None
    assert token_rest_at_start(TOKEN[-8:] + " x", TOKEN) == TOKEN[-8:]
    assert token_rest_at_start(TOKEN[-7:] + " x", TOKEN) is None  # too short to tell alone ...
    assert token_rest_at_start(TOKEN[-7:] + " x", TOKEN, {TOKEN[-7:]}) == TOKEN[-7:]  # ... unless a cut left it
    assert token_rest_at_start("0123456789 unrelated", TOKEN) is None


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(min_value=-60, max_value=len(TOKEN) - 1), json_form=st.booleans(), given_token=st.booleans())
def test_property_a_failing_line_split_anywhere_near_its_token_never_passes(
    cut: int, json_form: bool, given_token: bool
) -> None:
    """Safety: wherever journald cuts rank 1's failing line, the journal's verdict is never PASS."""
    entries = journal(cut)
    lines = as_json(entries) if json_form else as_text(entries)
    check = check_journal(lines, S, tp=2, token=TOKEN if given_token else None)
    assert check.verdict is not Verdict.PASS, (cut, json_form, given_token)


def test_the_standins_split_line_fault_is_cut_inside_its_token_and_fails() -> None:
    """standin.fault split-line:1 (the testbed's hostile release): rank 1's first line, cut at LineMax, leaves
    16 of the token's characters in the first piece; rank 0's and later lines are untouched."""
    fault = standin.StandinFault("split-line", 1)
    seen: set[int] = set()
    line = standin.fault_line(fault, good(0, 1), seen)
    assert standin.fault_line(fault, good(30, 1), seen) == good(30, 1)
    assert standin.fault_line(fault, good(0, 0), set()) == good(0, 0)
    first, rest = pieces(line)
    assert first.endswith("token=" + TOKEN[:16]) and rest == TOKEN[16:]
    entries = [(good(layer, 0), False) for layer in (0, 30, 60)] + [(first, True), (rest, False)]
    entries += [(good(layer, 1), False) for layer in (0, 30, 60)]
    for lines in (as_json(entries), as_text(entries)):
        assert check_journal(lines, S, tp=2, token=TOKEN).verdict is Verdict.FAIL
