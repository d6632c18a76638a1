"""The backend's formatter (kdtree_backend/lines.py) and opsctl's parser (opsctl/parity.py) pinned together: every
line the backend can print is a well-formed line of its kind, with the values it printed; whatever else the gate
sees starting with the marker is malformed. Neither side needs torch."""

from __future__ import annotations

import math
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st
from kdtree_backend.lines import ParityIdentity, format_fallback, format_parity, format_shapes
from kdtree_backend.wire import PARITY_VALUE_MAX

from opsctl.gate.lines import FallbackLine, ParityLine, ShapesLine, parse_line

TOKENS = st.text(alphabet="ABCDEFabcdef0123456789_-", min_size=8, max_size=128)
# Every finite non-negative float the backend can be handed: zero, subnormals, tiny, huge.
VALUES = st.one_of(
    st.sampled_from([0.0, 5e-324, 2.2250738585072014e-308, 1e-300, 1e-7, 0.01, 1.0, 1e300, 1.7976931348623157e308]),
    st.floats(min_value=0.0, allow_nan=False, allow_infinity=False),
)
PREFIXES = st.sampled_from(
    [
        "",
        "2026-05-31T13:04:12+0000 ct200 python[22251]: ",
        "May 31 13:04:12 ct200 python3.11[7]: ",
        "Sun 2026-05-31 13:04:12 UTC ct200 python[1]: ",
        "1780232652.123456 ct200 python[1]: ",
        "[ 1234.567890] ct200 python[1]: ",
    ]
)
WORDS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-./:", min_size=1, max_size=40)


def test_neither_side_imports_torch() -> None:
    code = (
        "import sys, kdtree_backend.lines, opsctl.gate.lines, opsctl.gate.parity_check, opsctl.cli.parity; "
        "bad = [m for m in ('torch', 'numpy', 'sglang') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr


@given(
    layer=st.integers(0, 999_999),
    values=st.tuples(VALUES, VALUES, VALUES),
    tp=st.integers(0, 9999),
    token=st.none() | TOKENS,
    mode=st.sampled_from(["eager", "graph"]),
    step=st.integers(0, 10**9),
    prefix=PREFIXES,
)
def test_every_parity_line_the_backend_prints_is_well_formed(
    layer: int, values: tuple[float, float, float], tp: int, token: str | None, mode: str, step: int, prefix: str
) -> None:
    max_abs, mean, rel = values
    line = format_parity(layer, max_abs, mean, rel, ParityIdentity(tp=tp, token=token), mode=mode, step=step)
    rec = parse_line(prefix + line, journal_prefix=bool(prefix))  # the prefix journalctl's text output adds
    assert isinstance(rec, ParityLine)
    # One grammar: every finite value prints as a number the parser reads back; one above PARITY_VALUE_MAX (which
    # %.4e would round past the double's range, 1.7977e+308) prints as the maximum.
    assert rec.problems == (), (line, rec)
    assert (rec.layer, rec.rank, rec.token) == (layer, tp, token)
    assert rec.extra == {"mode": mode, "step": str(step)}
    for got, sent in zip((rec.max_abs_diff, rec.mean, rec.rel), values, strict=True):
        assert got == float(f"{min(sent, PARITY_VALUE_MAX):.4e}") and math.isfinite(got)


@given(
    label=st.from_regex(r"c[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}/tp[0-9]{1,2}-L[0-9]{1,3}-s[0-9]{1,3}", fullmatch=True),
    values=st.tuples(VALUES, VALUES, VALUES, VALUES, VALUES),
    token=TOKENS,
)
def test_capture_replay_lines_are_well_formed(label: str, values: tuple[float, ...], token: str) -> None:
    max_abs, mean, rel, vs_running, running_rel = values
    line = format_parity(
        30,
        max_abs,
        mean,
        rel,
        ParityIdentity(tp=1, token=token),
        capture=label,
        vs_running=f"{vs_running:.4e}",
        running_rel=f"{running_rel:.4e}",
        path="kernel",
    )
    rec = parse_line(line)
    assert isinstance(rec, ParityLine) and rec.extra["capture"] == label
    assert rec.problems == (), rec  # the extras are text to the gate; the values are clamped


@given(
    dims=st.tuples(*(st.integers(0, 10**9) for _ in range(6))),
    bs=st.integers(0, 4096),
    q_len=st.integers(0, 128),
    kv_len_max=st.integers(0, 10**7),
    scale=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    mask=st.integers(0, 10**18 - 1),
)
def test_every_shapes_line_the_backend_prints_is_well_formed(
    dims: tuple[int, ...], bs: int, q_len: int, kv_len_max: int, scale: float, mask: int
) -> None:
    line = format_shapes(
        q=dims[:3],
        kv_buf=dims[3:5],
        bs=bs,
        q_len=q_len,
        dl=512,
        dr=64,
        kv_len_max=kv_len_max,
        scale=scale,
        mask=(mask,),
    )
    rec = parse_line(line)
    assert isinstance(rec, ShapesLine), (line, rec)
    assert rec.tuple_of("q") == dims[:3] and rec.tuple_of("mask") == (mask,) and rec.int_of("bs") == bs


@given(reason=st.from_regex(r"[a-z][a-z0-9_]{0,40}", fullmatch=True), path=WORDS, device=WORDS)
def test_every_fallback_line_the_backend_prints_is_well_formed(reason: str, path: str, device: str) -> None:
    rec = parse_line(format_fallback(reason, path=path, device=device))
    assert isinstance(rec, FallbackLine) and rec.fields == {"reason": reason, "path": path, "device": device}


@given(value=st.sampled_from([math.inf, math.nan, -1.0, -0.0, -5e-324]))
def test_what_the_backend_prints_for_a_non_finite_or_negative_value_is_malformed(value: float) -> None:
    rec = parse_line(format_parity(0, value, 0.0, value, ParityIdentity(tp=0, token="0123456789abcdef")))
    assert isinstance(rec, ParityLine) and rec.problems and not rec.finite
