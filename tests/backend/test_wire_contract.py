"""The backend's half of the opsctl/backend wire contract (``kdtree_backend.wire``): what the backend prints, reads
and exits with is what the contract says, observed through the backend's own code, not read off its constants.

opsctl's half (its parser, token writer, capture-id checks and replay exit handling against the same module) is
pinned by the lead's opsctl tests; :func:`backend_view` is what they can compare with.
"""

from __future__ import annotations

import json
import string
import time
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st
from kdtree_backend import replay, replay_captures, wire
from kdtree_backend.batch import make_verify_batch
from kdtree_backend.capture import Capturer
from kdtree_backend.capture_format import REQUEST_FILE, CaptureError, parse_request
from kdtree_backend.config import ParityConfig
from kdtree_backend.engine import VerifyEngine
from kdtree_backend.lines import ParityIdentity, format_fallback, format_parity, format_shapes

GOOD_TOKEN = "wire-contract_0123"
TOKEN_TEXT = st.text(alphabet=string.ascii_letters + string.digits + "_- =\t.", max_size=140)
CAPTURE_ID_TEXT = st.from_regex(wire.CAPTURE_ID_RE, fullmatch=True)


def backend_lines() -> list[str]:
    """One line of each kind, as the backend formats them."""
    identity = ParityIdentity(tp=1, token=GOOD_TOKEN)
    return [
        format_shapes(
            q=(9, 8, 576), kv_buf=(64, 576), bs=1, q_len=9, dl=512, dr=64, kv_len_max=30, scale=0.1, mask=(9,)
        ),
        format_parity(56, 1e-3, 1e-4, 2e-3, identity),
        format_fallback("fp8_kv_cache", path="triton"),
    ]


def backend_view() -> dict[str, object]:
    """The contract as the backend behaves: the marker its lines start with, the variable its token is read from,
    the exit statuses of its replay programs. The opsctl half of the pin compares its own view with this one."""
    marker = {line.split(" ", 1)[0] for line in backend_lines()}
    assert len(marker) == 1, marker
    return {
        "marker": marker.pop(),
        "token_var": wire.PARITY_TOKEN_VAR
        if ParityIdentity.from_env(0, {wire.PARITY_TOKEN_VAR: GOOD_TOKEN}).token == GOOD_TOKEN
        else None,
        "exit_ok": replay.verdict_exit_code(replay.ReplayOutcome(parity_lines=1), 0.1),
        "exit_parity_failed": replay.verdict_exit_code(replay.ReplayOutcome(), 0.1),
        "exit_usage": replay.main(["--threshold", "0.1"]),  # a threshold without --steps N
    }


def test_the_backend_view_is_the_wire_contract() -> None:
    assert backend_view() == {
        "marker": wire.MARKER,
        "token_var": wire.PARITY_TOKEN_VAR,
        "exit_ok": wire.REPLAY_EXIT_OK,
        "exit_parity_failed": wire.REPLAY_EXIT_PARITY_FAILED,
        "exit_usage": wire.REPLAY_EXIT_USAGE,
    }


def test_every_line_starts_with_the_marker_and_a_space() -> None:
    assert all(line.startswith(wire.MARKER + " ") for line in backend_lines())


@given(TOKEN_TEXT | st.from_regex(wire.TOKEN_RE, fullmatch=True))
def test_the_token_is_accepted_exactly_when_it_fullmatches_token_re(raw: str) -> None:
    stripped = raw.strip()
    expected = stripped if wire.TOKEN_RE.fullmatch(stripped) else None
    assert ParityIdentity.from_env(0, {wire.PARITY_TOKEN_VAR: raw}).token == expected


def test_the_token_is_read_from_the_wire_variable_only() -> None:
    assert ParityIdentity.from_env(0, {}).token is None
    assert ParityIdentity.from_env(0, {"KDTREE_TOKEN": GOOD_TOKEN}).token is None
    assert ParityIdentity.from_env(3, {wire.PARITY_TOKEN_VAR: GOOD_TOKEN}) == ParityIdentity(3, GOOD_TOKEN)


def request_doc(ident: object) -> dict[str, object]:
    return {"id": ident, "layers": [0], "steps": 1, "max_bytes": 50_000_000, "expires_at": time.time() + 600}


@given(CAPTURE_ID_TEXT | st.text(alphabet="cTZ0123456789abcdef-", max_size=30))
def test_a_request_id_is_accepted_exactly_when_it_fullmatches_capture_id_re(ident: str) -> None:
    try:
        accepted = parse_request(request_doc(ident)).id == ident
    except CaptureError:
        accepted = False
    assert accepted == bool(wire.CAPTURE_ID_RE.fullmatch(ident))


def test_the_capture_the_backend_stores_and_replays_is_named_by_a_wire_capture_id(tmp_path: Path) -> None:
    """Arm one step of the real engine (CPU, reference path), then replay it: the directory the backend makes and
    the ``capture=`` it prints are named by an id of the wire's form."""
    directory = tmp_path / "capture"
    directory.mkdir()
    ident = "c20260601T120000Z-0a1b2c"
    (directory / REQUEST_FILE).write_text(json.dumps(request_doc(ident)))
    capturer = Capturer(directory, release="rwire", poll_s=0.0, log=lambda _: None)
    engine = VerifyEngine(
        q_len=9, heads=4, parity=ParityConfig(False, 1, ()), use_kernel=False, sink=lambda _: None, capturer=capturer
    )
    batch = make_verify_batch(bs=1, prefix=16, q_len=9, heads=4, layers=(0,), seed=0)
    engine.prepare(**batch.metadata(), graph=False)
    engine.forward(0, batch.q[0], batch.kv_buffers[0], torch.empty(9, 4, 512, dtype=torch.bfloat16), batch.sm_scale)
    capturer.drain()
    made = [p.name for p in directory.iterdir() if p.is_dir()]
    assert made == [ident] and all(wire.CAPTURE_ID_RE.fullmatch(name) for name in made)

    lines: list[str] = []
    summary = replay_captures.replay_captures(
        directory, torch.device("cpu"), threshold=0.05, identity=ParityIdentity(0, GOOD_TOKEN), sink=lines.append
    )
    assert summary.exit_code(0.05) == wire.REPLAY_EXIT_OK and summary.exit_code(None) == wire.REPLAY_EXIT_OK
    (line,) = lines
    assert line.startswith(wire.MARKER + " ")
    printed = dict(kv.split("=", 1) for kv in line.split()[2:])["capture"].split("/")[0]
    assert wire.CAPTURE_ID_RE.fullmatch(printed)


def test_the_capture_replay_exits_with_the_wire_statuses(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert replay_captures.run_cli(not_a_dir, torch.device("cpu"), None) == wire.REPLAY_EXIT_USAGE
    assert replay_captures.ReplaySummary(calls=1, damaged=1).exit_code(0.05) == wire.REPLAY_EXIT_PARITY_FAILED
    assert replay_captures.ReplaySummary(calls=1, over_threshold=1).exit_code(0.05) == wire.REPLAY_EXIT_PARITY_FAILED
