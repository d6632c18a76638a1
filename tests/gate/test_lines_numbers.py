"""One grammar for the numbers of a parity line (issue 36, item 11): the backend's formatter never prints a value
the parser refuses, and the parser refuses what ``%.4e`` never prints (an exponent past the double's range either
way: ``1.7977e+308`` is infinite, ``1.0e-400`` reads as 0)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kdtree_backend.lines import ParityIdentity, format_parity
from kdtree_backend.wire import PARITY_VALUE_MAX

from opsctl.gate.lines import ParityLine, _fast_parity, _parse_full, parse_line

TOKEN = "0123456789abcdef"
FINITE = st.one_of(
    st.sampled_from([0.0, 5e-324, 1e-310, PARITY_VALUE_MAX, 1.79765e308, 1.7976931348623157e308]),
    st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
)


def line(rel: str, a: str = "1.0e-03", mean: str = "1.0e-04") -> str:
    return f"[kdtree] L0 max_abs_diff={a} mean={mean} rel={rel} tp=0 token={TOKEN}"


@given(values=st.tuples(FINITE, FINITE, FINITE))
def test_every_finite_value_the_backend_prints_reads_back(values: tuple[float, float, float]) -> None:
    text = format_parity(0, *values, ParityIdentity(tp=0, token=TOKEN))
    rec = parse_line(text)
    assert isinstance(rec, ParityLine) and rec.problems == (), text
    for got, sent in zip((rec.max_abs_diff, rec.mean, rec.rel), values, strict=True):
        assert got == float(f"{min(sent, PARITY_VALUE_MAX):.4e}")
        assert (got == 0.0) == (sent == 0.0)  # no non-zero value is printed as one that reads as 0


def test_the_largest_double_prints_as_the_maximum_not_as_infinity() -> None:
    text = format_parity(0, 1.7976931348623157e308, 0.0, 1.7976931348623157e308, ParityIdentity(tp=0, token=TOKEN))
    assert "1.7977e+308" not in text and "rel=1.7976e+308" in text
    rec = parse_line(text)
    assert isinstance(rec, ParityLine) and not rec.problems and rec.rel == PARITY_VALUE_MAX


@pytest.mark.parametrize(
    ("rel", "problem"),
    [
        ("1.0e-400", "below the smallest double"),  # used to read as 0.0: a pass
        ("1e-324", "below the smallest double"),
        ("0.5e-400", "below the smallest double"),
        ("1.7977e+308", "not finite"),
        ("1.79765e+308", "above 1.7976e+308"),
        ("1.0e-0400", "garbled"),  # an exponent of 4 digits: %.4e never prints one
        ("1.0e+1000", "garbled"),
    ],
)
def test_numbers_past_the_double_s_range_are_refused(rel: str, problem: str) -> None:
    rec = parse_line(line(rel))
    assert isinstance(rec, ParityLine) and any(problem in p for p in rec.problems), rec.problems
    assert math.isnan(rec.rel)


@pytest.mark.parametrize("rel", ["0", "0.0", "0.0000e+00", "0e-400", "4.9407e-324", "1.7976e+308", "2.0e-03"])
def test_numbers_in_range_are_read(rel: str) -> None:
    rec = parse_line(line(rel))
    assert isinstance(rec, ParityLine) and rec.problems == () and rec.rel == float(rel)


NUMBER_TEXT = st.from_regex(r"[0-9]{1,4}(\.[0-9]{1,5})?([eE][+-]?[0-9]{1,4})?", fullmatch=True)


@given(a=NUMBER_TEXT, mean=NUMBER_TEXT, rel=NUMBER_TEXT)
def test_an_accepted_number_is_finite_in_range_and_zero_only_when_written_so(a: str, mean: str, rel: str) -> None:
    text = line(rel, a, mean)
    fast, full = _fast_parity(text), _parse_full(text)
    assert fast is None or fast == full
    assert isinstance(full, ParityLine)
    if full.problems:
        return
    for value, written in ((full.max_abs_diff, a), (full.mean, mean), (full.rel, rel)):
        assert math.isfinite(value) and 0.0 <= value <= PARITY_VALUE_MAX
        mantissa = written.lower().partition("e")[0]
        assert (value == 0.0) == (mantissa.strip("0.") == ""), written
