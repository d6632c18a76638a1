"""`opsctl health --probe`'s verdict (opsctl.health.checks.check_probe): one probe request's outcome and the fresh parity
lines the running invocation printed after it, judged by the gate's rules. Pure: facts in, a level out."""

from __future__ import annotations

from opsctl.gate.lines import ParityLine, parse_line
from opsctl.health.checks import check_probe
from opsctl.health.findings import ProbeFacts
from opsctl.health.levels import Level
from tests.builders import host

TOKEN = "0123456789abcdef0123456789abcdef"
H = host(service={"mode": "standin", "tp": 2}, gpu_arch=None)


def line(rel: float, rank: int, token: str | None = TOKEN) -> ParityLine:
    tok = f" token={token}" if token else ""
    parsed = parse_line(f"[kdtree] L0 max_abs_diff=1e-3 mean=1e-4 rel={rel} tp={rank}{tok}")
    assert isinstance(parsed, ParityLine)
    return parsed


def answered(*lines: ParityLine) -> ProbeFacts:
    return ProbeFacts(sent=1, answered=1, ttft_s=0.05, lines=lines, waited_s=0.8)


def test_fresh_passing_lines_from_every_rank_are_ok() -> None:
    c = check_probe(H, answered(line(0.001, 0), line(0.002, 1), line(0.001, 1)), TOKEN)
    assert c.level is Level.OK
    assert c.detail == "request answered (TTFT 50 ms); 3 fresh parity line(s) from each of 2 rank(s) pass"


def test_a_silent_rank_is_crit_naming_it() -> None:
    c = check_probe(H, answered(line(0.001, 0)), TOKEN)
    assert c.level is Level.CRIT and "TP rank(s) 1 of 2 printed no fresh parity line within 1s" in c.detail


def test_no_line_at_all_names_every_rank_and_lines_of_another_token_do_not_count() -> None:
    c = check_probe(
        H, answered(line(0.001, 0, token="fedcba9876543210fedcba9876543210"), line(0.001, 1, token=None)), TOKEN
    )
    assert c.level is Level.CRIT and "TP rank(s) 0, 1 of 2" in c.detail and "2 line(s) without" in c.detail


def test_a_failing_fresh_line_is_crit_and_evidence_against_the_release() -> None:
    c = check_probe(H, answered(line(0.001, 0), line(0.9, 1)), TOKEN)
    assert c.level is Level.CRIT and c.release_bad and "rel=0.9" in c.detail


def test_a_failed_request_is_crit_a_refused_one_is_not_evidence() -> None:
    failed = check_probe(H, ProbeFacts(sent=1, error="HTTP 500: simulated failure"), TOKEN)
    assert (
        failed.level is Level.CRIT
        and failed.release_bad
        and failed.detail == ("probe request failed: HTTP 500: simulated failure")
    )
    refused = check_probe(H, ProbeFacts(sent=1, error="HTTP 401: Unauthorized", refused=True), TOKEN)
    assert refused.level is Level.CRIT and not refused.release_bad and "refused" in refused.detail


def test_not_asked_or_no_http_api_is_skipped() -> None:
    assert check_probe(H, None, TOKEN).level is Level.SKIP
    replay = host(service={"mode": "replay"}, gpu_arch=None)
    assert check_probe(replay, None, TOKEN).detail == "replay service has no HTTP API"
