"""What journalctl hides, and where prefixes come from (issue 36, items 1 and 3): the offline check fails a message
journalctl left out, judges a long line as malformed, and reads a message the same way in JSON and in text."""

from __future__ import annotations

import json

import pytest

from opsctl.gate.decision import GateState, LineVerdict, Verdict, judge
from opsctl.gate.parity_check import check_journal
from opsctl.inventory import GateSettings
from opsctl.journal.query import message_text

TOKEN = "0123456789abcdef0123456789abcdef"
J = "2026-05-31T13:04:12+0000 ct200 python[22251]: "
S = GateSettings()


def good(layer: int, rank: int = 0, rel: str = "2.0e-03", token: str = TOKEN) -> str:
    return f"[kdtree] L{layer} max_abs_diff=1.0e-03 mean=1.0e-04 rel={rel} tp={rank} token={token}"


PASSING = [good(layer) for layer in (0, 30, 60)]


def as_json(message: object, invocation: str = "inv1") -> str:
    return json.dumps({"__CURSOR": "s=1", "MESSAGE": message, "_SYSTEMD_INVOCATION_ID": invocation})


def padded(length: int = 5116, rel: str = "9.0e-01") -> str:
    """The issue's reproducer: rank 1's failing L30 line, padded to ``length`` characters, with the right token."""
    head = good(30, 1, rel=rel) + " pad="
    return head + "x" * (length - len(head))


# ------------------------------------------------------------------------------ 1. a message journalctl left out
@pytest.mark.parametrize("token", [TOKEN, None])
def test_a_null_message_fails_the_check_instead_of_passing(token: str | None) -> None:
    """``journalctl -o json`` without --all prints a message of 4096 bytes or more as null: it used to PASS."""
    entries = [as_json(m) for m in PASSING[:1]] + [as_json(None)] + [as_json(m) for m in PASSING]
    check = check_journal("\n".join(entries), S, tp=1, token=token)
    assert check.verdict is Verdict.FAIL and "journalctl left the message out" in check.state.reason
    assert check.left_out == 1


def test_a_null_message_first_in_its_invocation_fails_it_without_a_token() -> None:
    """It sets no token: the lines after it stay in its invocation (they would start another, judged alone)."""
    entries = [as_json(None), *(as_json(m) for m in PASSING)]
    check = check_journal("\n".join(entries), S, tp=1)
    assert check.verdict is Verdict.FAIL and len(check.invocations) == 1


def test_a_null_message_after_an_automatic_restart_still_fails_the_run() -> None:
    """The same token after a restart boundary is one run; a left-out message at its start is judged in it."""
    first = [as_json(m, "inv1") for m in PASSING[:2]]
    after = [as_json(None, "inv2"), *(as_json(m, "inv2") for m in PASSING)]
    check = check_journal("\n".join([*first, *after]), S, tp=1)
    assert check.verdict is Verdict.FAIL and "journalctl left the message out" in check.state.reason


@pytest.mark.parametrize("size", ["76B", "5.0K", "1.2M"])
@pytest.mark.parametrize("prefix", [J, ""])
def test_blob_data_in_text_fails_the_check(size: str, prefix: str) -> None:
    """journalctl's text without -a writes ``[N blob data]`` for a message with a control character, where its
    JSON gives the bytes (judged: a FAIL). The text used to PASS; now both FAIL."""
    hidden = good(0, rel="9.0e-01") + "\x1b"
    text = [prefix + m for m in PASSING[:1]] + [f"{prefix}[{size} blob data]"] + [prefix + m for m in PASSING]
    check = check_journal(text, S, tp=1, token=TOKEN)
    assert check.verdict is Verdict.FAIL and f"[{size} blob data]" in check.state.reason
    as_bytes = [as_json(m) for m in PASSING[:1]] + [as_json(list(hidden.encode()))] + [as_json(m) for m in PASSING]
    assert check_journal("\n".join(as_bytes), S, tp=1, token=TOKEN).verdict is Verdict.FAIL


def test_the_live_reader_hands_a_null_message_on_to_be_failed() -> None:
    gate = GateState.every_line(S, expected_ranks=1, token=TOKEN)
    j = judge(gate, message_text(None), 0.0)
    assert j is not None and j.verdict is LineVerdict.FAIL and gate.verdict is Verdict.FAIL
    assert message_text(list(b"[kdtree] L0")) == "[kdtree] L0" and message_text("x") == "x"


# ------------------------------------------------------------------------------- 1. a line over the length limit
@pytest.mark.parametrize("length", [4097, 5116, 60_000])
def test_a_padded_failing_line_with_the_token_fails_in_json_and_text(length: int) -> None:
    line = padded(length)
    for given in (TOKEN, None):
        json_text = "\n".join(as_json(m) for m in [*PASSING[:2], line, *PASSING])
        check = check_journal(json_text, S, tp=2 if given else None, token=given)
        assert check.verdict is Verdict.FAIL and "longer than 4096" in check.state.reason, check.state.reason
        text = [J + m for m in [*PASSING[:2], line, *PASSING]]
        assert check_journal(text, S, token=given).verdict is Verdict.FAIL


def test_a_padded_passing_line_fails_too() -> None:
    """Over the limit is malformed whatever its values: the backend never prints such a line."""
    check = check_journal([J + padded(rel="1.0e-04"), *(J + m for m in PASSING)], S, token=TOKEN)
    assert check.verdict is Verdict.FAIL


# ------------------------------------------------------------------ 3. prefixes only where the output format adds them
EMBEDDED = f"May 31 13:04:12 h x[1]: [kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel={{rel}} tp=0 token={TOKEN}"


@pytest.mark.parametrize("rel", ["9.0e-01", "1.0e-04"])
@pytest.mark.parametrize("given", [TOKEN, None])
def test_a_message_that_starts_with_a_journald_prefix_reads_the_same_in_json_and_text(
    rel: str, given: str | None
) -> None:
    """The issue's reproducer: from -o json it was judged (FAIL), in -o short-iso text IGNORED (PASS). The message
    itself is not a marked line (its prefix is its own text), and it holds the token: a FAIL in every reading."""
    message = EMBEDDED.format(rel=rel)
    messages = [*PASSING[:2], message, *PASSING]
    readings = {
        "json": check_journal("\n".join(as_json(m) for m in messages), S, tp=1, token=given),
        "short-iso": check_journal([J + m for m in messages], S, tp=1, token=given),
        "short": check_journal(["May 31 13:04:12 ct200 python[22251]: " + m for m in messages], S, tp=1, token=given),
        "cat": check_journal(messages, S, tp=1, token=given),
    }
    verdicts = {name: c.verdict for name, c in readings.items()}
    assert set(verdicts.values()) == {Verdict.FAIL}, verdicts
    for check in readings.values():
        assert "inside another message" in check.state.reason


def test_without_the_token_such_a_message_is_ignored_in_every_reading() -> None:
    message = EMBEDDED.format(rel="9.0e-01").replace(TOKEN, "f" * 32)
    messages = [*PASSING, message]
    json_check = check_journal("\n".join(as_json(m) for m in messages), S, tp=1, token=TOKEN)
    text_check = check_journal([J + m for m in messages], S, tp=1, token=TOKEN)
    assert json_check.verdict is text_check.verdict is Verdict.PASS
    assert json_check.judged.ignored == text_check.judged.ignored == 1


def test_text_is_cat_or_short_by_its_first_line() -> None:
    """A bare (``-o cat``) journal keeps each line whole; a short-iso one strips one prefix per line."""
    cat = check_journal(["-- Journal begins at Sun 2026-05-31 --", *PASSING], S, tp=1, token=TOKEN)
    short = check_journal(["-- Boot 0123abcd --", *(J + m for m in PASSING)], S, tp=1, token=TOKEN)
    assert cat.verdict is short.verdict is Verdict.PASS
    # In short output a line without the format's prefix is not a message the format printed: never counted.
    mixed = check_journal([J + PASSING[0], *PASSING[1:]], S, tp=1, token=TOKEN)
    assert mixed.verdict is Verdict.FAIL and "inside another message" in mixed.state.reason
