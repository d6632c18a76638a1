import math

import pytest

from opsctl.gate.lines import FallbackLine, ParityLine, ShapesLine, misplaced_marker, parse_line, parse_lines

SHAPES = "[kdtree] shapes q=(9, 8, 576) kv_buf=(195012, 576) bs=1 q_len=9 Dl=512 Dr=64 kv_len_max=30 scale=0.14468 mask=(270,)"
PARITY = "[kdtree] L56 max_abs_diff=1.6934e+00 mean=1.1948e-01 rel=1.0837e+00"
JOURNAL = "May 31 13:04:12 host python[22251]: "
SGLANG = "[2026-05-31 13:04:12 TP3] "


def test_shapes_line_verbatim() -> None:
    rec = parse_line(SHAPES)
    assert isinstance(rec, ShapesLine)
    assert rec.tuple_of("q") == (9, 8, 576)
    assert rec.tuple_of("kv_buf") == (195012, 576)
    assert rec.tuple_of("mask") == (270,)
    assert rec.int_of("kv_len_max") == 30 and rec.fields["scale"] == "0.14468"
    assert rec.rank is None
    d = rec.decode()
    assert (d.tokens, d.heads, d.head_dim, d.mask_row, d.pool_rows) == (9, 8, 576, 30, 195012)
    assert d.warning is None


def test_shapes_decode_flags_the_classic_bug() -> None:
    rec = parse_line(SHAPES.replace("kv_len_max=30", "kv_len_max=21"))
    assert isinstance(rec, ShapesLine)
    d = rec.decode()
    assert d.mask_row == 30 and d.warning is not None and "classic" in d.warning


def test_parity_line_verbatim() -> None:
    rec = parse_line(PARITY)
    assert isinstance(rec, ParityLine)
    assert rec.layer == 56
    assert rec.max_abs_diff == pytest.approx(1.6934) and rec.mean == pytest.approx(0.11948)
    assert rec.rel == pytest.approx(1.0837)
    assert rec.extra == {} and rec.finite


@pytest.mark.parametrize(
    "prefix,rank", [(JOURNAL, None), (SGLANG, 3), (JOURNAL + SGLANG, 3), ("[2026-05-31 13:04:12 DP0 TP7 EP7] ", 7)]
)
def test_prefixes(prefix: str, rank: int | None) -> None:
    journal = prefix.startswith(JOURNAL)  # journalctl's text output adds it: stripped only there
    p = parse_line(prefix + PARITY, journal_prefix=journal)
    s = parse_line(prefix + SHAPES, journal_prefix=journal)
    assert isinstance(p, ParityLine) and p.rank == rank and p.layer == 56
    assert "missing tp" in p.problems  # the design example predates tp=: such a line can never pass
    assert isinstance(s, ShapesLine) and s.rank == rank and s.tuple_of("q") == (9, 8, 576)


def test_hostname_with_tp_is_not_a_rank() -> None:
    rec = parse_line("May 31 13:04:12 gpuTP5 python[1]: " + PARITY, journal_prefix=True)
    assert isinstance(rec, ParityLine) and rec.rank is None


def test_unknown_fields_kept() -> None:
    rec = parse_line(PARITY + " step=12 dtype=bf16")
    assert isinstance(rec, ParityLine)
    assert rec.extra == {"step": "12", "dtype": "bf16"}
    s = parse_line(SHAPES + " topk=4")
    assert isinstance(s, ShapesLine) and s.fields["topk"] == "4"


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "garbage"])
def test_non_finite_and_garbled(value: str) -> None:
    rec = parse_line(f"[kdtree] L3 max_abs_diff=1e-3 mean=1e-4 rel={value}")
    assert isinstance(rec, ParityLine) and not rec.finite


def test_missing_rel_is_nan() -> None:
    rec = parse_line("[kdtree] L3 max_abs_diff=1e-3 mean=1e-4")
    assert isinstance(rec, ParityLine) and math.isnan(rec.rel)


def test_other_lines() -> None:
    assert parse_line("INFO something else") is None
    assert isinstance(parse_line("[kdtree] fallback reason=fp8_kv_cache path=triton"), FallbackLine)
    # An undocumented kind is not "another line" to skip: it is malformed, so the gate fails it.
    other = parse_line("[kdtree] backend ready")
    assert isinstance(other, ParityLine) and other.problems and not other.finite
    assert len(parse_lines([SHAPES, "noise", PARITY])) == 2


GOOD = "[kdtree] L3 max_abs_diff=1.0e-03 mean=1.0e-04 rel=2.0e-03 tp=0 token=feedc0de12345678"


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        JOURNAL,
        SGLANG.replace("TP3", "TP0"),
        "2026-05-31T13:04:12+0000 ct200 python[22251]: ",
        "2026-05-31T13:04:12.123456+00:00 ct200 sglang-k26-ddtree[7]: ",
        "May 31 13:04:12.123456 ct200 python3.11[1]: ",
    ],
)
def test_a_well_formed_line_has_no_problems(prefix: str) -> None:
    rec = parse_line(prefix + GOOD, journal_prefix=bool(prefix) and not prefix.startswith("["))
    assert isinstance(rec, ParityLine), prefix
    assert rec.problems == () and rec.rank == 0 and rec.token == "feedc0de12345678" and rec.rel == 2e-3


@pytest.mark.parametrize(
    "text",
    [
        # A served request whose text the server logs: the marker is not at the start of the message.
        "May 31 13:04:12 host python[1]: INFO: request text: please print [kdtree] L56 max_abs_diff=0 mean=0 rel=0 tp=0",
        "[2026-05-31 13:04:12 TP0] Receive: obj=GenerateReqInput(text='[kdtree] L56 max_abs_diff=0 mean=0 rel=0 tp=0')",
        "x[kdtree] L1 max_abs_diff=0 mean=0 rel=0 tp=0",
        " [kdtree] L1 max_abs_diff=0 mean=0 rel=0 tp=0",
    ],
)
def test_the_marker_must_start_the_message(text: str) -> None:
    assert parse_line(text) is None
    assert misplaced_marker(text)


@pytest.mark.parametrize("journal_prefix", [False, True])
def test_a_journald_prefix_in_the_message_itself_is_not_stripped(journal_prefix: bool) -> None:
    """Issue 36, item 3: a message that starts with a journald-style prefix is its own text, in JSON (bare) and
    after the format's prefix in short* text alike: not a marked line in either reading."""
    message = "May 31 13:04:12 h x[1]: " + PARITY + " tp=0"
    line = JOURNAL + message if journal_prefix else message
    assert parse_line(line, journal_prefix=journal_prefix) is None
    assert misplaced_marker(line, journal_prefix=journal_prefix)
    # The format's prefix alone is stripped; a bare message needs none.
    assert isinstance(parse_line(JOURNAL + PARITY, journal_prefix=True), ParityLine)
    assert parse_line(JOURNAL + PARITY) is None and isinstance(parse_line(PARITY), ParityLine)


def test_a_plain_line_is_not_a_misplaced_marker() -> None:
    assert not misplaced_marker("INFO all good") and not misplaced_marker(GOOD)


@pytest.mark.parametrize(
    "line,problem",
    [
        (GOOD.replace("rel=2.0e-03", "rel=0.9 rel=0.001"), "duplicated rel"),
        (GOOD.replace("tp=0", "tp=0 tp=1"), "duplicated tp"),
        (GOOD + " step=1 step=2", "duplicated step"),
        (GOOD.replace("rel=2.0e-03", "rel=-0.5"), "garbled rel=-0.5"),
        (GOOD.replace("max_abs_diff=1.0e-03", "max_abs_diff=-1"), "garbled max_abs_diff=-1"),
        (GOOD.replace("mean=1.0e-04", "mean=-0.0001"), "garbled mean=-0.0001"),
        (GOOD.replace("mean=1.0e-04 ", ""), "missing mean"),
        (GOOD.replace("rel=2.0e-03", "rel=0x1"), "garbled rel=0x1"),
        (GOOD.replace("rel=2.0e-03", "rel=nan"), "garbled rel=nan"),
        (GOOD.replace("rel=2.0e-03", "rel=inf"), "garbled rel=inf"),
        (GOOD.replace("rel=2.0e-03", "rel=1e999"), "rel=1e999 is not finite"),
        (GOOD.replace("rel=2.0e-03", "rel=1e-3,"), "garbled rel=1e-3,"),
        (GOOD.replace("tp=0 ", ""), "missing tp"),
        (GOOD.replace("tp=0", "tp=-1"), "garbled tp=-1"),
        (GOOD.replace("tp=0", "tp=zero"), "garbled tp=zero"),
        (GOOD + " please ignore", "unexpected text 'please'"),
        ("[2026-05-31 13:04:12 TP5] " + GOOD, "tp=0 but the logger prefix says TP5"),
    ],
)
def test_a_malformed_line_names_its_problem(line: str, problem: str) -> None:
    rec = parse_line(line)
    assert isinstance(rec, ParityLine)
    assert any(p.startswith(problem) for p in rec.problems), rec.problems


def test_a_duplicated_rel_is_never_read_as_the_passing_value() -> None:
    rec = parse_line(GOOD.replace("rel=2.0e-03", "rel=0.9 rel=0.001"))
    assert isinstance(rec, ParityLine) and math.isnan(rec.rel)


# ---------------------------------------------------------------------------------------------- fail closed (grammar)
T = "feedc0de12345678"
PASSING = [f"[kdtree] L{n} max_abs_diff=1.0e-03 mean=1.0e-04 rel=2.0e-03 tp=0 token={T}" for n in (0, 30, 60)]
BAD_TAIL = "max_abs_diff=1.69 mean=0.12 rel=1.08 tp=0 token=" + T


@pytest.mark.parametrize(
    "head", ["L56:", "l56", "L 56", "L-56", "L56x", "L56\t", "L٥٦", "Ｌ56", "L056", "", "fallback:", "shapes:"]
)
def test_a_garbled_head_carrying_the_token_fails_the_gate(head: str) -> None:
    """A marked line whose head is not exactly L<n> (or a known kind) is malformed, never "another kind": with the
    token it fails the gate, even followed by passing lines (it used to be skipped, and the check passed)."""
    from opsctl.gate.decision import LineVerdict, Verdict
    from opsctl.gate.parity_check import check_journal
    from opsctl.inventory import GateSettings

    line = f"[kdtree] {head} {BAD_TAIL}" if head else f"[kdtree] {BAD_TAIL}"
    rec = parse_line(line)
    assert isinstance(rec, ParityLine) and rec.problems and not rec.finite, rec
    check = check_journal([line, *PASSING], GateSettings(), tp=1, token=T)
    assert check.verdict is Verdict.FAIL, check.state.reason
    assert check.lines[0].judgement.verdict is LineVerdict.FAIL
    # Without the token it is not this invocation's line: ignored, as a forgery is.
    other = check_journal([line.replace(T, "0" * 16)], GateSettings(), tp=1, token=T)
    assert other.judged.ignored == 1 and other.state.lines == 0


@pytest.mark.parametrize(
    ("value", "what"),
    [
        ("+1e-3", "sign"),
        ("1_0e-4", "underscore"),
        ("٠.٠٠١", "Arabic-Indic digits"),
        ("０.００１", "fullwidth digits"),
        ("1e-3\x00", "NUL"),
        ("1e-3\x1b[0m", "escape"),
        ("0x1p-10", "hex float"),
        (" 1e-3", "double space"),
        ("1e-3 ", "trailing space"),
        (".001", "no integer part"),
        ("1.", "no fraction digits"),
        ("Infinity", "word"),
    ],
)
def test_only_the_backends_number_grammar_is_a_value(value: str, what: str) -> None:
    line = GOOD.replace("rel=2.0e-03", f"rel={value}")
    rec = parse_line(line)
    assert isinstance(rec, ParityLine) and rec.problems, (what, rec)


@pytest.mark.parametrize(
    "line",
    [
        GOOD.replace("tp=0", "tp=٠"),
        GOOD.replace("tp=0", "tp=+0"),
        GOOD.replace("tp=0", "tp=00"),
        GOOD.replace(" tp=0", "  tp=0"),
        GOOD.replace(" tp=0", "\ttp=0"),
        GOOD.replace("[kdtree] ", "[kdtree]  "),
        GOOD.replace("[kdtree] ", "[kdtree]\t"),
        GOOD + " ",
        GOOD + "\r",
        GOOD + "\u2028rel=0.9",
        GOOD.replace("token=", "token=\u200b"),
        GOOD + " note=" + "x" * 5000,
    ],
)
def test_spacing_control_characters_and_length_are_part_of_the_grammar(line: str) -> None:
    rec = parse_line(line)
    assert isinstance(rec, ParityLine) and rec.problems, rec
    assert rec.carries(T)  # the token is in it: the gate fails it rather than ignoring it


def test_unknown_kind_and_malformed_shapes_or_fallback_are_malformed() -> None:
    for line in (
        f"[kdtree] backend ready token={T}",
        "[kdtree] shapes q=(9, 8 576) kv_buf=(1, 576) bs=1 q_len=9 Dl=512 Dr=64 kv_len_max=30 scale=0.1 mask=(270,)",
        SHAPES.replace(" bs=1", ""),
        SHAPES.replace("bs=1", "bs=-1"),
        "[kdtree] fallback path=triton",
        "[kdtree] fallback reason=fp8 kv",
        "[kdtree]",
        "[kdtree] ",
    ):
        rec = parse_line(line)
        assert isinstance(rec, ParityLine) and rec.problems, line


def test_a_huge_marked_line_parses_in_linear_time() -> None:
    """The old field pattern rescanned the rest of the line at every 'key=(': 48 KB took seconds, 1 MB never ended."""
    import time

    for body in (" a=(" * 250_000, " x=(1, 2" * 100_000, " " + "k=v " * 200_000):
        line = f"[kdtree] L0 max_abs_diff=0 mean=0 rel=0 tp=0 token={T}" + body
        start = time.thread_time()  # CPU time: three test workers share two cores in CI
        rec = parse_line(line)
        assert time.thread_time() - start < 1.0
        assert isinstance(rec, ParityLine) and any("longer than" in p for p in rec.problems)
        assert rec.carries(T)


def test_fast_and_full_parse_agree_on_the_examples() -> None:
    from opsctl.gate.lines import _fast_parity, _parse_full

    for line in (GOOD, PARITY, SHAPES, GOOD + " mode=graph step=3", "[2026-05-31 13:04:12 TP0] " + GOOD):
        fast = _fast_parity(line)
        if fast is not None:
            assert fast == _parse_full(line)


# ---------------------------------------------------------------------------------- shapes: the classic bug, any bs
def shapes(bs: int, q_len: int, kv_len_max: int, mask: int, tokens: int | None = None) -> ShapesLine:
    t = bs * q_len if tokens is None else tokens
    rec = parse_line(
        f"[kdtree] shapes q=({t}, 8, 576) kv_buf=(4096, 576) bs={bs} q_len={q_len} Dl=512 Dr=64 "
        f"kv_len_max={kv_len_max} scale=0.14468 mask=({mask},)"
    )
    assert isinstance(rec, ShapesLine)
    return rec


def test_the_testbeds_bug_line_at_bs2_is_flagged() -> None:
    """bs=2, q_len=9, prefixes 64 and 64: the mask covers 9*(64+9)*2 = 1314 entries, the bug's keys only 64."""
    d = shapes(2, 9, 64, 1314).decode()
    assert d.warning is not None and "classic" in d.warning
    assert shapes(2, 9, 73, 1314).decode().warning is None  # the same batch with correct keys


@pytest.mark.parametrize("bs", [1, 2, 3, 4, 8, 64])
def test_equal_prefixes_bug_is_flagged_at_every_batch_size(bs: int) -> None:
    q_len, prefix = 9, 100
    mask = bs * q_len * (prefix + q_len)
    assert "classic" in (shapes(bs, q_len, prefix, mask).decode().warning or "")
    assert shapes(bs, q_len, prefix + q_len, mask).decode().warning is None


def test_what_the_line_cannot_tell_and_the_other_mismatches() -> None:
    # bs=2, prefixes 100 and 10 with the bug: kv_len_max=100, mask 9*(109+19): a correct batch could show the same.
    assert shapes(2, 9, 100, 9 * (109 + 19)).decode().warning is None
    assert "at least" in (shapes(2, 9, 73, 9 * 50).decode().warning or "")  # rows shorter than the keys
    assert "q_len" in (shapes(2, 9, 73, 1315).decode().warning or "")  # not whole rows
    assert "query tokens" in (shapes(2, 9, 73, 1314, tokens=9).decode().warning or "")
