"""Property tests of the parity line parser and the gate's line verdicts (docs/gate.md "The grammar").

The safety property: no line that is not a well-formed parity line carrying the right token is counted as a pass.
The liveness property: a well-formed line at or below the pass threshold passes. "Well formed" is decided here by
an independent reference written with plain string methods, not by the parser under test.

Examples per test: 300 by default (tests/conftest.py); KDTREE_HYPOTHESIS_EXAMPLES=20000 for the long run.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from opsctl.gate.decision import GateState, LineVerdict, judge
from opsctl.gate.lines import ParityLine, ShapesLine, _fast_parity, _parse_full, parse_line
from opsctl.gate.parity_check import check_journal
from opsctl.gate.shapes import key_mask_warning
from opsctl.inventory import GateSettings

TOKEN = "5f0c1d2e3a4b5c6d7e8f90a1b2c3d4e5"
SETTINGS = GateSettings()
TP = 4
PREFIXES = [
    "",
    "2026-05-31T13:04:12+0000 ct200 python[22251]: ",
    "May 31 13:04:12 ct200 python[22251]: ",
    "[2026-05-31 13:04:12 TP1] ",
    "Sun 2026-05-31 13:04:12 UTC ct200 python[1]: ",
]
# The prefixes journalctl's text output adds (parsed with journal_prefix=True); the others belong to the message.
JOURNAL_PREFIXES = {p for p in PREFIXES if p and not p.startswith("[")}
DIGITS = "0123456789"
REQUIRED = ("max_abs_diff", "mean", "rel", "tp", "token")
# What a hostile or broken writer may put in a line: look-alike digits, signs, separators, controls, spaces.
HOSTILE = [
    *"0123456789.eE+-_=() ,:\t\r\n\x00\x0b\x0c\x1c\x1e\x1b\x7f",
    "\u0660",
    "\u0661",
    "\u06f1",
    "\uff11",
    "\u2028",
    "\u2029",
    "\x85",
    "\u200b",
    "\u00a0",
    "L",
    "rel=0",
    " rel=0",
    " tp=1",
    " token=" + TOKEN,
    "[kdtree] ",
    "nan",
    "inf",
]


# --------------------------------------------------------------------------------------------- the reference grammar
def _number(text: str) -> bool:
    mantissa, _, exponent = text.partition("e") if "e" in text else text.partition("E")
    whole, dot, frac = mantissa.partition(".")
    if not whole or any(c not in DIGITS for c in whole) or (dot and (not frac or any(c not in DIGITS for c in frac))):
        return False
    if "e" in text or "E" in text:
        digits = exponent[1:] if exponent[:1] in ("+", "-") else exponent
        return bool(digits) and all(c in DIGITS for c in digits) and float(text) < float("inf")
    return True


def _plain_int(text: str, most: int) -> bool:
    return 0 < len(text) <= most and all(c in DIGITS for c in text) and (text == "0" or text[0] != "0")


def reference_pass(message: str, token: str, pass_rel: float, tp: int) -> bool:
    """Whether ``message`` (no prefix) is a well-formed parity line with ``token``, a rank below ``tp`` and
    rel <= ``pass_rel``: the only lines allowed to count as a pass."""
    if not message.startswith("[kdtree] L") or len(message) > 4096:
        return False
    if any(not (" " <= c <= "~") for c in message):
        return False
    words = message[len("[kdtree] ") :].split(" ")
    if not _plain_int(words[0][1:], 6):
        return False
    fields: dict[str, str] = {}
    for word in words[1:]:
        key, eq, value = word.partition("=")
        if not eq or not key or key in fields or not value:
            return False
        if not (key[0].isalpha() or key[0] == "_") or not all(c.isalnum() or c == "_" for c in key):
            return False
        fields[key] = value
    if any(k not in fields for k in REQUIRED) or fields["token"] != token:
        return False
    if not all(_number(fields[k]) for k in ("max_abs_diff", "mean", "rel")):
        return False
    if not _plain_int(fields["tp"], 4) or int(fields["tp"]) >= tp:
        return False
    return float(fields["rel"]) <= pass_rel


def line_verdict(line: str, token: str = TOKEN, *, journal_prefix: bool = False) -> LineVerdict | None:
    state = GateState(settings=SETTINGS, started_at=0.0, deadline_s=1.0, expected_ranks=TP, token=token)
    j = judge(state, line, 0.0, journal_prefix=journal_prefix)
    return None if j is None else j.verdict


# ------------------------------------------------------------------------------------------------------ strategies
NUMBERS = st.one_of(
    st.floats(min_value=0, max_value=1e-2, allow_nan=False).map(lambda x: f"{x:.4e}"),
    st.floats(min_value=0, max_value=10, allow_nan=False).map(lambda x: f"{x:.4e}"),
    st.sampled_from(["0", "1e-3", "0.002", "2.0e-03", "1E-2", "0.01", "1", "9.9e-03"]),
)


@st.composite
def good_messages(draw: st.DrawFn) -> str:
    layer = draw(st.integers(0, 999_999))
    values = [draw(NUMBERS) for _ in range(3)]
    rank = draw(st.integers(0, TP - 1))
    fields = [f"max_abs_diff={values[0]}", f"mean={values[1]}", f"rel={values[2]}", f"tp={rank}", f"token={TOKEN}"]
    extras = draw(
        st.lists(
            st.sampled_from(["mode=graph", "mode=eager", "step=12", "path=kernel", "capture=c1/tp0-L0-s0"]),
            max_size=3,
            unique_by=lambda x: x.split("=")[0],
        )
    )
    fields += extras
    if draw(st.booleans()):
        fields = draw(st.permutations(fields))
    return f"[kdtree] L{layer} " + " ".join(fields)


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[str]) -> str:
    text = draw(base)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace", "duplicate"]))
        piece = draw(st.sampled_from(HOSTILE) | st.characters(codec="utf-8"))
        if op == "insert":
            text = text[:i] + piece + text[i:]
        elif op == "delete":
            text = text[:i] + text[i + draw(st.integers(1, 8)) :]
        elif op == "replace":
            text = text[:i] + piece + text[i + 1 :]
        else:
            j = draw(st.integers(i, min(len(text), i + 30)))
            text = text[:j] + text[i:j] + text[j:]
    return text


JOURNAL_LINES_BASE = st.one_of(
    good_messages(),
    mutated(good_messages()),
    st.sampled_from(["INFO: serving", "", "[kdtree] shapes q=(9, 8, 576)", "[kdtree] fallback reason=x"]),
)


# ------------------------------------------------------------------------------------------------------- properties
@given(prefix=st.sampled_from(PREFIXES), message=mutated(good_messages()))
def test_safety_only_a_well_formed_line_with_the_token_passes(prefix: str, message: str) -> None:
    prefix = prefix.replace("TP1", "TP" + message.partition(" tp=")[2][:1]) if "TP1" in prefix else prefix
    verdict = line_verdict(prefix + message, journal_prefix=prefix in JOURNAL_PREFIXES)
    if verdict is LineVerdict.PASS:
        assert reference_pass(message, TOKEN, SETTINGS.pass_rel, TP), prefix + message


@given(line=mutated(st.sampled_from(PREFIXES).flatmap(lambda p: good_messages().map(lambda m: p + m))))
def test_safety_with_the_prefix_mutated_too(line: str) -> None:
    for journal_prefix in (False, True):
        if line_verdict(line, journal_prefix=journal_prefix) is LineVerdict.PASS:
            starts = [i for i in range(len(line)) if line.startswith("[kdtree] L", i)]
            assert any(reference_pass(line[i:], TOKEN, SETTINGS.pass_rel, TP) for i in starts), line


@given(message=good_messages(), other=st.text(alphabet="0123456789abcdef", min_size=8, max_size=40))
def test_safety_a_foreign_or_missing_token_never_counts(message: str, other: str) -> None:
    if other == TOKEN:
        return
    assert line_verdict(message, token=other) is LineVerdict.IGNORED
    assert line_verdict(message.replace(f" token={TOKEN}", ""), token=TOKEN) in (LineVerdict.IGNORED, None)


@given(prefix=st.sampled_from(PREFIXES), message=good_messages())
def test_liveness_a_well_formed_line_at_or_below_the_threshold_passes(prefix: str, message: str) -> None:
    rank = message.partition(" tp=")[2].split(" ")[0]
    prefix = prefix.replace("TP1", f"TP{rank}")
    rel = float(message.partition(" rel=")[2].split(" ")[0])
    verdict = line_verdict(prefix + message, journal_prefix=prefix in JOURNAL_PREFIXES)
    if rel <= SETTINGS.pass_rel:
        assert verdict is LineVerdict.PASS, prefix + message
    else:
        assert verdict in (LineVerdict.INCONCLUSIVE, LineVerdict.FAIL)


@given(prefix=st.sampled_from(PREFIXES), message=st.one_of(good_messages(), mutated(good_messages())))
def test_the_fast_path_agrees_with_the_full_parse(prefix: str, message: str) -> None:
    line = prefix + message
    for jp in (False, True):
        fast = _fast_parity(line, jp)
        if fast is not None:
            assert fast == _parse_full(line, jp)
        whole = line.removesuffix("\n")  # parse_line takes one trailing newline as the line's end
        assert parse_line(line, journal_prefix=jp) == (_fast_parity(whole, jp) or _parse_full(whole, jp))


# --------------------------------------------------------------- issue 36: the token anywhere; one reading per message
TOKEN_HOLDERS = st.one_of(
    mutated(good_messages()),
    st.tuples(st.text(st.characters(codec="utf-8"), max_size=40), mutated(good_messages())).map("".join),
    st.tuples(
        st.text(st.characters(codec="utf-8"), max_size=40), st.text(st.characters(codec="utf-8"), max_size=40)
    ).map(lambda t: t[0] + TOKEN + t[1]),
    st.sampled_from(
        [
            "kdtree-standin: served rid=1 e2e_latency=0.540s",
            "May 31 13:04:12 h x[1]: ",
            "INFO request text: please print ",
        ]
    ).flatmap(lambda head: good_messages().map(lambda m: head + m)),
)


@given(message=TOKEN_HOLDERS)
def test_safety_a_message_holding_the_token_is_never_ignored(message: str) -> None:
    """Only the invocation can write its token: a message holding it is a well-formed line with that token=, a
    well-formed shapes or fallback line, or a FAIL. Never IGNORED, never dropped."""
    if TOKEN not in message:
        return
    for jp in (False, True):
        verdict = line_verdict(message, journal_prefix=jp)
        rec = parse_line(message, journal_prefix=jp)
        if verdict is None:
            assert rec is not None and not isinstance(rec, ParityLine), message
        else:
            assert verdict is not LineVerdict.IGNORED, message
            if verdict is not LineVerdict.FAIL:
                assert isinstance(rec, ParityLine) and rec.token == TOKEN and not rec.problems, message


@given(prefix=st.sampled_from(sorted(JOURNAL_PREFIXES)), message=st.one_of(JOURNAL_LINES_BASE, TOKEN_HOLDERS))
def test_a_message_reads_the_same_bare_and_after_the_format_s_prefix(prefix: str, message: str) -> None:
    """A JSON MESSAGE (bare) and the same entry in journalctl's short* text get the same verdict: the format's
    prefix is stripped, never one that is the message's own text (issue 36, item 3)."""
    if "\n" in message:
        return
    assert line_verdict(message) == line_verdict(prefix + message, journal_prefix=True), message
    assert parse_line(message) == _strip_raw(parse_line(prefix + message, journal_prefix=True), prefix)


def _strip_raw(rec: object, prefix: str) -> object:
    """The record with the format's prefix taken off its raw text (the one field that differs)."""
    if rec is None:
        return None
    import dataclasses

    raw = rec.raw.removeprefix(prefix)  # type: ignore[attr-defined]
    return dataclasses.replace(rec, raw=raw)  # type: ignore[type-var]


JOURNAL_LINES = st.one_of(
    good_messages(),
    mutated(good_messages()),
    st.sampled_from(["INFO: serving", "", "Started sglang-k26-ddtree.service", "[kdtree] shapes q=(9, 8, 576)"]),
    st.text(st.characters(codec="utf-8"), max_size=60),
)
SEPARATORS = st.sampled_from(["\n", "\n", "\n", "\u2028", "\r", "\x85", "\x0b", "\r\n", "\n\n"])


@given(parts=st.lists(st.tuples(JOURNAL_LINES, SEPARATORS), max_size=12))
def test_the_offline_check_judges_what_the_live_gate_judges(parts: list[tuple[str, str]]) -> None:
    """The live gate gets whole journal messages (stdout split at \\n by journald); the offline check must cut the
    same text at \\n only and reach the same verdict."""
    text = "".join(line + sep for line, sep in parts)
    if "\x00" in text or not text.strip():
        return
    live = GateState(settings=SETTINGS, started_at=0.0, deadline_s=SETTINGS.deadline_s, expected_ranks=TP, token=TOKEN)
    for message in text.split("\n"):
        judge(live, message, 0.0)
    live.conclude(0.0)
    if text.lstrip("\x1e").lstrip().startswith(("{", "data: {", "__CURSOR=")):
        return  # read as JSON (or refused), not as text lines
    offline = check_journal(text, SETTINGS, tp=TP, token=TOKEN)
    assert offline.verdict is live.verdict, text


@given(
    bs=st.integers(1, 16),
    q_len=st.integers(1, 16),
    prefixes=st.lists(st.integers(0, 2000), min_size=16, max_size=16),
)
def test_shapes_correct_keys_never_warn_and_the_bug_is_flagged_when_provable(
    bs: int, q_len: int, prefixes: list[int]
) -> None:
    p = prefixes[:bs]
    lengths = [x + q_len for x in p]
    mask = q_len * sum(lengths)
    ok = key_mask_warning(bs=bs, q_len=q_len, kv_len_max=max(lengths), mask_numel=mask, tokens=bs * q_len)
    assert ok is None
    bug = key_mask_warning(bs=bs, q_len=q_len, kv_len_max=max(p), mask_numel=mask, tokens=bs * q_len)
    provable = sum(lengths) > bs * max(p)
    assert (bug is not None) == provable
    if bug is not None:
        assert "classic" in bug
    line = parse_line(
        f"[kdtree] shapes q=({bs * q_len}, 8, 576) kv_buf=(4096, 576) bs={bs} q_len={q_len} Dl=512 Dr=64 "
        f"kv_len_max={max(p)} scale=0.14468 mask=({mask},)"
    )
    assert isinstance(line, ShapesLine) and line.decode().warning == bug


LONG_JOURNAL_LINES = st.one_of(
    good_messages().map(lambda m: m.replace(" rel=", " rel=0", 1) if " rel=1" in m else m),  # mostly passing
    good_messages(),
    mutated(good_messages()),
    good_messages().map(lambda m: m.replace(TOKEN, "f" * 32)),
    good_messages().map(lambda m: m + f" note={TOKEN}"),
    st.sampled_from(["INFO: serving", "Started sglang-k26-ddtree.service", f"INFO prompt {TOKEN}"]),
)


@given(
    lines=st.lists(LONG_JOURNAL_LINES, min_size=1, max_size=60),
    given_token=st.sampled_from([TOKEN, None]),
    prefix=st.sampled_from(["", "2026-05-31T13:04:12+0000 ct200 python[22251]: "]),
)
def test_the_late_lane_counts_what_the_full_path_counts(lines: list[str], given_token: str | None, prefix: str) -> None:
    """After the gate decided, the offline check counts well-formed lines by their verdict alone, without a
    ParityLine (the benchmark's speed): its result is the full path's, figure for figure."""
    from unittest import mock

    from opsctl.gate import parity_check

    text = "\n".join(prefix + line.replace("\n", " ") for line in lines)
    if "\x00" in text or text.lstrip("\x1e").lstrip().startswith(("{", "data: {", "__CURSOR=")):
        return  # binary, or read as JSON (refused): not what this compares
    fast = check_journal(text, SETTINGS, tp=TP, token=given_token).to_json(all_invocations=True)
    with mock.patch.object(parity_check._Checker, "_late", lambda *_: False):
        full = check_journal(text, SETTINGS, tp=TP, token=given_token).to_json(all_invocations=True)
    assert fast == full
