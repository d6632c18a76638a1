"""The comparison sample (opsctl.comparison.sample): round trip, and untrusted JSON refused field by field."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.comparison.sample import CompareRequest, ComparisonSample, SampleError


def _request(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "output_ids": [5, 9, 2],
        "decode_s_per_token": 0.01,
        "ttft_s": 0.2,
        "spec_accept_length": 2.5,
        "spec_verify_ct": 2,
        "completion_tokens": 3,
        "load": 1.0,
        "host_s": 0.004,
        "status": 200,
        "error": None,
        "decode_s": 0.02,
        "concurrency": 8,
    }
    doc.update(over)
    return doc


def test_round_trip_is_identity() -> None:
    doc = {
        "requests": [_request(), _request(output_ids=[], decode_s_per_token=None, status=401, error="HTTP 401")],
        "load_source": "metrics",
    }
    sample = ComparisonSample.from_json(json.loads(json.dumps(doc)))
    assert sample.to_json() == doc
    assert ComparisonSample.from_json(sample.to_json()) == sample
    assert [r.ok for r in sample.requests] == [True, False]
    assert sample.requests[1].client_error


def test_a_sample_written_before_levels_is_still_read() -> None:
    # Issue 48 added decode_s and concurrency; a sample recorded before has neither: read, both null.
    old = {k: v for k, v in _request().items() if k not in ("decode_s", "concurrency")}
    sample = ComparisonSample.from_json({"requests": [old], "load_source": "metrics"})
    assert (sample.requests[0].decode_s, sample.requests[0].concurrency) == (None, None)
    assert sample.to_json()["requests"][0] == {**old, "decode_s": None, "concurrency": None}


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "8", 5000])
def test_a_concurrency_that_is_not_a_level_is_refused(bad: Any) -> None:
    with pytest.raises(SampleError, match=r"requests\[0\]\.concurrency"):
        ComparisonSample.from_json({"requests": [_request(concurrency=bad)]})


def test_minimal_request_takes_defaults() -> None:
    r = CompareRequest.from_json(
        {"output_ids": [1, 2], "decode_s_per_token": 0.5, "ttft_s": 0.1, "spec_accept_length": None}
    )
    assert (r.completion_tokens, r.load, r.status, r.error, r.spec_verify_ct) == (2, None, None, None, None)
    assert r.ok


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"output_ids": [[1]]}, "requests[0].output_ids[0]"),
        ({"output_ids": [True]}, "requests[0].output_ids[0]"),
        ({"output_ids": ["1"]}, "requests[0].output_ids[0]"),
        ({"output_ids": [-1]}, "requests[0].output_ids[0]"),
        ({"output_ids": "12"}, "requests[0].output_ids"),
        ({"decode_s_per_token": float("nan")}, "requests[0].decode_s_per_token"),
        ({"decode_s_per_token": -0.1}, "requests[0].decode_s_per_token"),
        ({"decode_s_per_token": "0.1"}, "requests[0].decode_s_per_token"),
        ({"ttft_s": True}, "requests[0].ttft_s"),
        ({"ttft_s": 1e300}, "requests[0].ttft_s"),
        ({"spec_accept_length": float("inf")}, "requests[0].spec_accept_length"),
        ({"spec_verify_ct": 1.5}, "requests[0].spec_verify_ct"),
        ({"completion_tokens": True}, "requests[0].completion_tokens"),
        ({"status": 200.0}, "requests[0].status"),
        ({"status": 999}, "requests[0].status"),
        ({"error": 3}, "requests[0].error"),
        ({"load": -1}, "requests[0].load"),
        ({"extra": 1}, "requests[0]: unknown key"),
    ],
)
def test_bad_fields_are_named(over: dict[str, Any], field: str) -> None:
    with pytest.raises(SampleError, match=field.replace("[", r"\[").replace("]", r"\]")):
        ComparisonSample.from_json({"requests": [_request(**over)]})


def test_missing_required_key_named() -> None:
    doc = _request()
    del doc["ttft_s"]
    with pytest.raises(SampleError, match=r"missing key.*ttft_s"):
        ComparisonSample.from_json({"requests": [doc]})


@pytest.mark.parametrize(
    "doc",
    [[], "x", {"requests": {}}, {"requests": [], "load_source": "guess"}, {"requests": [], "x": 1}, {"requests": [1]}],
)
def test_not_a_sample(doc: Any) -> None:
    with pytest.raises(SampleError):
        ComparisonSample.from_json(doc)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=4),
    max_leaves=20,
)
_keys = st.sampled_from(
    [
        "output_ids",
        "decode_s_per_token",
        "ttft_s",
        "spec_accept_length",
        "spec_verify_ct",
        "completion_tokens",
        "load",
        "status",
        "error",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.dictionaries(_keys, _json, max_size=9), max_size=3), _json)
def test_untrusted_json_is_a_sample_or_a_sample_error(requests: list[Any], source: Any) -> None:
    """Safety: any JSON either becomes a sample whose numbers are finite and non-negative and whose token ids are
    integers, or is refused with SampleError; nothing else escapes."""
    try:
        sample = ComparisonSample.from_json({"requests": requests, "load_source": source})
    except SampleError:
        return
    for r in sample.requests:
        assert all(type(t) is int and t >= 0 for t in r.output_ids)
        for v in (r.decode_s_per_token, r.ttft_s, r.spec_accept_length, r.load):
            assert v is None or (type(v) is float and math.isfinite(v) and v >= 0)
    assert ComparisonSample.from_json(sample.to_json()) == sample
