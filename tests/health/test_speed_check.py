"""`health --probe`'s speed check (opsctl/health/checks.py: check_speed): the running release against the sample
recorded at its deploy, judged by the comparison's judge; WARN beyond health.max_drift; the Prometheus gauges.
Pure, over samples built as the workload records them."""

from __future__ import annotations

from opsctl.cli.render import render_prometheus
from opsctl.comparison.compare import compare
from opsctl.health.checks import check_speed, evaluate, speed_gauges
from opsctl.health.findings import HostFacts, SpeedFacts
from opsctl.health.levels import Level
from opsctl.health.probe import SPEED_PROMPTS, speed_settings
from opsctl.inventory import CompareSettings
from tests import builders
from tests.comparison.test_compare import output, side

HOST = builders.host("tb1", gpu_arch=None, service={"mode": "standin"})


def facts(now_scale: float = 1.0, **kw: object) -> SpeedFacts:
    then, now = side(8), side(8, scale=now_scale, **kw)  # type: ignore[arg-type]
    return SpeedFacts(
        reference="its deploy",
        comparison=compare(then, now, HOST.gate.compare, baseline="its deploy"),
        s_per_token=0.02 * now_scale,
        accept_length=3.2,
    )


def test_the_same_speed_is_ok_and_shows_the_comparison_line() -> None:
    c = check_speed(HOST, facts())
    assert c.level is Level.OK and c.detail.startswith("compared with its deploy on 8 requests: 8/8 answers identical")
    assert c.value is not None and abs(c.value - 1.0) < 1e-9


def test_decode_slower_beyond_max_drift_warns_naming_the_figure() -> None:
    c = check_speed(HOST, facts(1 / 0.78))  # 0.78x of its deploy
    assert c.level is Level.WARN and c.detail.startswith("decode 0.78x of its deploy (p=")
    assert "beyond health.max_drift 0.2" in c.detail and not c.release_bad
    assert check_speed(HOST, facts(1 / 0.85)).level is Level.OK  # within max_drift 0.2


def test_fewer_accepted_drafts_and_changed_answers_warn() -> None:
    assert "accepted drafts 3.28 -> 2.08 of its deploy (p=" in check_speed(HOST, facts(accept=2.0)).detail
    changed = [(9,) * 32 for _ in range(8)]
    c = check_speed(HOST, facts(outputs=changed))
    assert c.level is Level.WARN and "answers changed: 0/8 answers identical" in c.detail


def test_skipped_or_not_run() -> None:
    assert check_speed(HOST, None).level is Level.SKIP
    assert (
        check_speed(HOST, SpeedFacts(skipped="no comparison sample recorded")).detail == "no comparison sample recorded"
    )
    c = check_speed(HOST, SpeedFacts(error="the workload failed on the host (exit 1)"))
    assert c.level is Level.WARN and "could not run" in c.detail


def test_gauges_reach_prometheus() -> None:
    f = facts(1.5)
    assert speed_gauges(f) == (("opsctl_health_decode_seconds_per_token", 0.03), ("opsctl_health_accepted_drafts", 3.2))
    health = evaluate(HOST, HostFacts(host="tb1", speed=f))
    text = render_prometheus([health])
    assert 'opsctl_health_decode_seconds_per_token{host="tb1"} 0.03' in text
    assert 'opsctl_health_accepted_drafts{host="tb1"} 3.2' in text
    assert 'opsctl_health_decode_ratio{host="tb1"} 0.666' in text


def test_the_short_workload_is_the_first_prompts() -> None:
    short = speed_settings(CompareSettings())
    assert short.workload_size == SPEED_PROMPTS and short.prompts == CompareSettings().prompts[:SPEED_PROMPTS]
    ids = speed_settings(CompareSettings(input_ids=[list(output(i)[:4]) for i in range(12)]))
    assert ids.input_ids is not None and len(ids.input_ids) == SPEED_PROMPTS and ids.warmup == 1
