"""Property tests of the probe's readers of untrusted text: what the server streams back (the host program's
StreamReader, error_text, json_answer) and what the program prints (opsctl.probe.answers.parse_wave / parse_ready). They
never raise anything but the documented ValueError, and an answer counts as answered only when it is shaped like
SGLang's. Bounded example counts: tests/conftest.py's profile."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from opsctl.probe import envfile, readings, stream
from opsctl.probe.answers import parse_ready, parse_wave

ENDPOINTS = st.sampled_from(["/generate", "/v1/completions"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
GOOD_CHUNK = {"text": "x", "output_ids": [1], "meta_info": {"id": "r", "completion_tokens": 1}}


def stream_lines() -> st.SearchStrategy[list[str]]:
    return st.lists(
        st.one_of(
            st.text(max_size=60),
            JSON_VALUES.map(lambda v: "data: " + json.dumps(v)),
            st.just("data: [DONE]"),
            st.just(""),
        ),
        max_size=12,
    )


@given(ENDPOINTS, stream_lines())
def test_any_stream_ends_in_a_known_kind_and_ok_needs_a_chunk_and_done(endpoint: str, lines: list[str]) -> None:
    reader = stream.StreamReader(endpoint)
    for line in lines:
        reader.feed(line + "\n")
    kind, error = reader.outcome()
    assert kind in ("ok", "malformed", "error")
    if kind == "ok":
        assert error is None and reader.chunks >= 1 and reader.done
        assert "data: [DONE]" in lines
    else:
        assert error and len(error) < 300


@given(st.lists(st.just(GOOD_CHUNK), min_size=1, max_size=5))
def test_a_well_formed_generate_stream_is_answered(chunks: list[dict[str, object]]) -> None:
    reader = stream.StreamReader("/generate")
    for c in chunks:
        reader.feed("data: " + json.dumps(c) + "\n")
        reader.feed("\n")
    reader.feed("data: [DONE]\n")
    assert reader.outcome() == ("ok", None) and reader.tokens == 1


@given(ENDPOINTS, st.binary(max_size=300))
def test_any_error_body_or_plain_answer_is_read_without_raising(endpoint: str, body: bytes) -> None:
    assert len(stream.error_text(body)) <= stream.ERROR_TEXT_MAX
    kind, error, _tokens = stream.json_answer(endpoint, body)
    assert kind in ("ok", "malformed", "error") and (kind == "ok") == (error is None)


@given(st.text(max_size=400) | JSON_VALUES.map(json.dumps))
def test_the_programs_output_parses_or_is_refused_with_a_value_error(text: str) -> None:
    for parse in (parse_wave, parse_ready):
        try:
            parse(text)
        except ValueError:
            pass


@given(st.lists(JSON_VALUES, max_size=5))
def test_a_wave_of_arbitrary_request_objects_counts_answered_only_when_ok_is_true(items: list[object]) -> None:
    requests = [i if isinstance(i, dict) else {"ok": i} for i in items]
    try:
        wave = parse_wave(json.dumps({"requests": requests}))
    except ValueError:
        return
    assert wave.answered == sum(1 for r in requests if r.get("ok") is True)


# ------------------------------------------------------------------------------------------------ the host's own files

ENV_TEXT = st.text(alphabet=st.sampled_from(list("AB_1= \t\n\r#;x\x85\u2028\x0c")), max_size=80)


def reference_env(text: str) -> dict[str, str]:
    """systemd's reading of a file without quotes or backslashes: lines end at \\n or \\r only; '#'/';' first
    starts a comment; key and value stripped of spaces and tabs (a value's trailing ones too)."""
    out: dict[str, str] = {}
    for line in text.replace("\r", "\n").split("\n"):
        line = line.lstrip(" \t")
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        key = key.rstrip(" \t")
        if key and (key[0].isalpha() or key[0] == "_") and all(c.isalnum() or c == "_" for c in key):
            out[key] = value.strip(" \t")
    return out


@given(ENV_TEXT)
def test_environment_files_split_at_newline_and_cr_only(text: str) -> None:
    """Safety: no assignment starts after U+0085, U+2028 or a form feed (str.splitlines() would split there);
    on text without quotes or backslashes the reading is the line-based reference's."""
    assert envfile.parse_environment_file(text) == reference_env(text)


@given(st.text(max_size=40).filter(lambda k: "'" not in k))
def test_a_key_is_sent_only_when_header_safe_and_a_refusal_never_shows_it(key: str) -> None:
    """Safety: a key that reaches the header encodes as Latin-1 with no control character; a refused one is named
    by its variable and file only: no character of it that is not plain ASCII text, and not the key itself."""
    with tempfile.TemporaryDirectory() as d:
        env = Path(d) / "k.env"
        env.write_text(f"SECRET_KEY='{key}'\n", encoding="utf-8")
        value, why = envfile.read_env_value(str(env), "SECRET_KEY")
        if value is not None:
            assert value == key and not envfile.header_problem(value)
            value.encode("latin-1")  # what http.client does with a header value
        elif key:
            assert why is not None and envfile.header_problem(key)
            shown = why.replace(str(env), "")
            assert all(0x20 <= ord(c) <= 0x7E for c in shown)
            assert len(key) < 8 or key not in shown


@given(st.text(max_size=300))
def test_metric_value_is_a_finite_non_negative_sum_or_none(text: str) -> None:
    value = readings.metric_value(text)
    assert value is None or (value >= 0 and value != float("inf"))


@given(st.lists(st.integers(0, 9), max_size=6), JSON_VALUES)
def test_merged_ids_only_grow_and_stay_integers(so_far: list[int], chunk: object) -> None:
    merged = stream.merged_ids(so_far, chunk)
    assert merged[: len(so_far)] == so_far and all(type(t) is int for t in merged)
