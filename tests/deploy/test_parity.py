import math

import pytest

from opsctl.parity import OtherKdtreeLine, ParityLine, ShapesLine, parse_line, parse_lines

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
    p = parse_line(prefix + PARITY)
    s = parse_line(prefix + SHAPES)
    assert isinstance(p, ParityLine) and p.rank == rank and p.layer == 56
    assert isinstance(s, ShapesLine) and s.rank == rank and s.tuple_of("q") == (9, 8, 576)


def test_hostname_with_tp_is_not_a_rank() -> None:
    rec = parse_line("May 31 13:04:12 gpuTP5 python[1]: " + PARITY)
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
    assert isinstance(parse_line("[kdtree] backend ready"), OtherKdtreeLine)
    assert len(parse_lines([SHAPES, "noise", PARITY])) == 2
