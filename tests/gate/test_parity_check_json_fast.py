"""The JSON journal's fast path (issue 47 item 11, the benchmark): entries the check would pass over are told from
their raw text without parsing them, and the rest go through the JSON scanner without json.loads' Python layers.
Property: on any journal of hostile entries, the verdict and every invocation's figures are those of the slow path
(each entry parsed in full), with or without a given token."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.gate.parity_check import check_entries
from opsctl.inventory import GateSettings
from opsctl.journal import reader as journal_reader
from opsctl.journal.reader import JournalReader

TOKEN = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"
S = GateSettings()


def good(layer: int, rank: int, token: str, rel: str = "2.0e-03") -> str:
    return f"[kdtree] L{layer} max_abs_diff=1.0e-03 mean=1.0e-04 rel={rel} tp={rank} token={token}"


MESSAGES = st.sampled_from(
    [
        good(0, 0, TOKEN),
        good(30, 1, TOKEN),
        good(0, 1, TOKEN, rel="9.0e-01"),
        good(0, 0, OTHER),
        f"INFO: a request {TOKEN[-16:]} quoted",
        f"INFO: a request \\u005bkdtree] L0 rel=0 tp=0 token={TOKEN}",
        "INFO: decode batch, #running-req: 3",
        "kdtree-launch: preflight ok (sglang 0.5.23); exec python",
        "Starting sglang-k26-ddtree.service - SGLang...",
        "Started sglang-k26-ddtree.service.",
        TOKEN[16:] + " the rest of a token",
        "Start of something else",
        "",
    ]
)
EXTRA = st.sampled_from(
    [
        {},
        {"_LINE_BREAK": "line-max"},
        {"MESSAGE": None},
        {"MESSAGE": [91, 107, 100]},
        {"SYSLOG_IDENTIFIER": "systemd", "_PID": "1"},
        {"invocation": "inv9"},
    ]
)


def entry(message: str, invocation: str | None, extra: dict[str, object], raw_mode: int) -> str:
    doc: dict[str, object] = {"__CURSOR": "s=1;i=2", "_PID": "22251", "SYSLOG_IDENTIFIER": "python"}
    if invocation is not None:
        doc["_SYSTEMD_INVOCATION_ID"] = invocation
    doc["MESSAGE"] = message
    doc.update(extra)
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=raw_mode != 1)
    if raw_mode == 2:  # a key given twice: the last one wins
        text = text[:-1] + ',"MESSAGE":' + json.dumps(good(0, 0, TOKEN, rel="9.0e-01")) + "}"
    elif raw_mode == 3:  # cut short
        text = text[: len(text) // 2]
    elif raw_mode == 4:  # not an entry
        text = "{" + message + "}"
    return text


ENTRIES = st.lists(
    st.builds(
        entry,
        MESSAGES,
        st.sampled_from(["inv1", "inv2", None]),
        EXTRA,
        st.sampled_from([0, 0, 0, 1, 2, 3, 4]),
    ),
    min_size=1,
    max_size=40,
)


def figures(text: str, token: str | None, fast: bool) -> tuple[object, ...]:
    reader = JournalReader()
    if not fast:
        reader._skippable = lambda _line: False  # type: ignore[method-assign]
    check = check_entries(reader.read([text.encode()]), S, tp=2, token=token, reader=reader)
    invocations = [(i.token, str(i.verdict), i.state.reason, i.state.lines, i.ignored) for i in check.invocations]
    return str(check.verdict), check.state.reason, invocations, reader.left_out


@settings(max_examples=300, deadline=None)
@given(ENTRIES, st.sampled_from([None, TOKEN]))
def test_the_fast_path_judges_as_the_full_parse(lines: list[str], token: str | None) -> None:
    text = "\n".join(['{"__CURSOR":"s=0","MESSAGE":"first","_SYSTEMD_INVOCATION_ID":"inv1"}', *lines]) + "\n"
    assert figures(text, token, fast=True) == figures(text, token, fast=False)


def test_the_scanner_refuses_what_json_loads_refuses() -> None:
    reader = JournalReader()
    for text in ('{"MESSAGE":"x"} trailing', '{"MESSAGE":"x"', '{"MESSAGE":' + "9" * 5000 + "}", "[" * 100_000, "[1]"):
        assert reader._json_entry(text, 1) is not None
    assert reader.unreadable == 5
    assert journal_reader._SCAN('{"a":"b"}', 0) == ({"a": "b"}, 9)
