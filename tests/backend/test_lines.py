"""The [kdtree] lines must read exactly as docs/lines.md shows them (opsctl parses them verbatim)."""

from __future__ import annotations

from kdtree_backend.lines import OncePer, ParityIdentity, format_fallback, format_parity, format_shapes

from opsctl.gate.lines import ParityLine, ShapesLine, parse_line

SHAPES = (
    "[kdtree] shapes q=(9, 8, 576) kv_buf=(195012, 576) bs=1 q_len=9 Dl=512 Dr=64 kv_len_max=30 "
    "scale=0.14468 mask=(270,)"
)
PARITY = "[kdtree] L56 max_abs_diff=1.6934e+00 mean=1.1948e-01 rel=1.0837e+00"


def test_shapes_line_is_the_design_example() -> None:
    line = format_shapes(
        q=(9, 8, 576), kv_buf=(195012, 576), bs=1, q_len=9, dl=512, dr=64, kv_len_max=30, scale=0.144679, mask=(270,)
    )
    assert line == SHAPES
    assert isinstance(parse_line(line), ShapesLine)


def test_parity_line_is_the_design_example_plus_rank_and_token_and_parses() -> None:
    line = format_parity(56, 1.69341, 0.119481, 1.08372, ParityIdentity(tp=3, token="0123456789abcdef"))
    assert line == PARITY + " tp=3 token=0123456789abcdef"
    record = parse_line(line)
    assert isinstance(record, ParityLine)
    assert record.layer == 56 and abs(record.rel - 1.0837) < 1e-9
    assert record.rank == 3 and record.token == "0123456789abcdef" and record.problems == ()


def test_identity_reads_the_token_from_the_environment_and_drops_a_malformed_one() -> None:
    assert ParityIdentity.from_env(2, {"KDTREE_PARITY_TOKEN": "ab12cd34ef56ab78"}) == ParityIdentity(
        2, "ab12cd34ef56ab78"
    )
    assert ParityIdentity.from_env(0, {}).token is None
    # A token that would break the line's key=value fields is never printed.
    assert ParityIdentity.from_env(0, {"KDTREE_PARITY_TOKEN": "abc def rel=0"}).token is None
    line = format_parity(1, 0.0, 0.0, 0.0, ParityIdentity(0, None))
    assert "token=" not in line and line.endswith(" tp=0")


def test_extra_fields_are_appended_as_key_value() -> None:
    assert format_parity(0, 0.0, 0.0, 0.0, ParityIdentity(), mode="graph").endswith(" mode=graph")
    assert format_fallback("fp8_kv_cache", path="triton") == "[kdtree] fallback reason=fp8_kv_cache path=triton"


def test_once_per_key() -> None:
    seen: list[str] = []
    once = OncePer(seen.append)
    assert once("a", "one") and not once("a", "again") and once("b", lambda: "two")
    assert seen == ["one", "two"]
