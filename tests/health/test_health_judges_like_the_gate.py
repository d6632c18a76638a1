"""`opsctl health` reads journal messages through the gate's own judge (opsctl.gate.decision.judge), not the bare
parser: a message holding the invocation's token anywhere is a well-formed line or a FAIL (issue 36 item 2). A
failing parity line glued behind a served-request line, with the token, made health report OK: the parser drops a
message the marker does not start. Pure: the probe program's JSON in, the checks' levels out."""

from __future__ import annotations

import time

from kdtree_backend.wire import PARITY_TOKEN_VAR

from opsctl.gate.lines import ParityLine, parse_line
from opsctl.health.checks import check_parity, check_probe, evaluate
from opsctl.health.findings import ProbeFacts
from opsctl.health.levels import Level
from opsctl.health.probe import facts_from_probe, judged_line, lock_owner, parity_from_probe, pid_alive
from opsctl.hostdata.facts import parse_facts
from tests.builders import host

TOKEN = "0123456789abcdef0123456789abcdef"
H = host(service={"mode": "standin", "tp": 2}, gpu_arch=None)


def parity(rel: float, rank: int, token: str = TOKEN) -> str:
    return f"[kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel={rel:.4e} tp={rank} token={token}"


GLUED_FAILING = "kdtree-standin: served rid=opsctl-probe-abc-7 e2e_latency=0.540s" + parity(0.9, 1)


def test_the_bare_parser_drops_the_glued_line_the_judge_fails_it() -> None:
    assert parse_line(GLUED_FAILING) is None  # what health read before: nothing
    line = judged_line(GLUED_FAILING, H.gate, TOKEN)
    assert isinstance(line, ParityLine) and line.problems  # a malformed line of the invocation: a FAIL


def test_a_glued_failing_line_with_the_token_makes_the_parity_check_crit() -> None:
    now = time.time()
    raw = {
        "parity_lines": [[now - 3, parity(0.001, 0)], [now - 2, parity(0.001, 1)], [now - 1, GLUED_FAILING]],
        "parity_env": f"{PARITY_TOKEN_VAR}={TOKEN}\n",
    }
    facts = facts_from_probe(
        H,
        parse_facts(""),
        raw,
        local_time=now,
        elapsed_s=0.1,
        lock_owner=lock_owner,
        pid_alive=pid_alive,
        local_hostname="me",
    )
    assert facts.parity_token == TOKEN and len(facts.parity) == 3
    c = check_parity(H, facts.parity, facts.parity_error, facts.parity_token)
    assert c.level is Level.CRIT and c.release_bad, c.detail
    parity_check = next(r for r in evaluate(H, facts).checks if r.name == "parity")
    assert parity_check.level is Level.CRIT


def test_the_marker_inside_another_message_without_the_token_is_not_counted() -> None:
    """The gate IGNOREs it (a logged prompt quoting a parity line cannot fail a release); health does too."""
    quoted = "kdtree-standin: prompt='" + parity(0.9, 1, token="f" * 32) + "'"
    assert judged_line(quoted, H.gate, TOKEN) is None
    samples = parity_from_probe({"parity_lines": [[1.0, parity(0.001, 0)], [2.0, quoted]]}, H.gate, TOKEN)
    assert [s.line.rank for s in samples] == [0]


def test_health_probe_fails_a_glued_failing_fresh_line() -> None:
    lines = tuple(
        line
        for m in (parity(0.001, 0), parity(0.001, 1), GLUED_FAILING)
        if (line := judged_line(m, H.gate, TOKEN)) is not None
    )
    c = check_probe(H, ProbeFacts(sent=1, answered=1, ttft_s=0.05, lines=lines, waited_s=0.8), TOKEN)
    assert c.level is Level.CRIT and c.release_bad and "fail" in c.detail, c.detail
