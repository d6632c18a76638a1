"""Pure health evaluation: facts in, levels out (no I/O)."""

from __future__ import annotations

import math

import pytest

from opsctl.gate.lines import ParityLine, parse_line
from opsctl.health.checks import evaluate, restarts_since, stale_lock_age_s
from opsctl.health.findings import DriftFacts, GpuFacts, HostFacts, HttpFacts, LockFacts, ParitySample, UnitFacts
from opsctl.health.levels import CHECK_NAMES, Level, exit_code
from opsctl.health.localstate import PreviousRun
from tests.builders import host

ACTIVE = UnitFacts("loaded", "active", "running", 0, "inv-1")
MANIFEST = {"backend/a.py": "aa", "kernel/b.cu": "bb"}


def sample(rel: float, at: float = 100.0, layer: int = 3, rank: int = 0, token: str | None = None) -> ParitySample:
    tok = f" token={token}" if token else ""
    line = parse_line(f"[kdtree] L{layer} max_abs_diff=1e-3 mean=1e-4 rel={rel} tp={rank}{tok}")
    assert isinstance(line, ParityLine)
    return ParitySample(at, line)


def healthy(**over: object) -> HostFacts:
    base: dict[str, object] = {
        "host": "h1",
        "unit": ACTIVE,
        "drift": DriftFacts("r1", MANIFEST, dict(MANIFEST)),
        "parity": (sample(1e-3),),
        "disk_free_mb": 50_000.0,
        "host_time": 1000.0,
        "local_time": 1000.5,
        "elapsed_s": 0.2,
    }
    base.update(over)
    return HostFacts(**base)  # type: ignore[arg-type]


REPLAY = {"gpu_arch": None, "service": {"mode": "replay", "tp": 1}}


def levels(result) -> dict[str, Level]:  # type: ignore[no-untyped-def]
    return {c.name: c.level for c in result.checks}


def test_healthy_replay_host_is_ok_with_http_and_gpu_not_applicable() -> None:
    r = evaluate(host(**REPLAY), healthy())
    assert r.level is Level.OK
    assert levels(r)["http"] is Level.SKIP and levels(r)["gpu"] is Level.SKIP
    assert [c.name for c in r.checks] == list(CHECK_NAMES)
    assert exit_code([r]) == 0


def test_unreachable_host_is_crit_and_nothing_else_judged() -> None:
    r = evaluate(host(**REPLAY), HostFacts("h1", reachable=False, error="h1: connection refused"))
    assert r.level is Level.CRIT and exit_code([r]) == 2
    assert levels(r)["ssh"] is Level.CRIT
    assert all(lv is Level.SKIP for name, lv in levels(r).items() if name != "ssh")


@pytest.mark.parametrize(
    ("unit", "previous", "expected"),
    [
        (UnitFacts("loaded", "activating", "auto-restart", 4, ""), None, Level.CRIT),
        (UnitFacts("loaded", "failed", "failed", 5, ""), None, Level.CRIT),
        (UnitFacts("loaded", "inactive", "dead", 0, ""), None, Level.WARN),  # stopped, not failed
        (UnitFacts("not-found", "inactive", "dead", 0, ""), None, Level.CRIT),
        (UnitFacts("loaded", "active", "running", 1, "i"), PreviousRun(0, "i"), Level.WARN),
        (UnitFacts("loaded", "active", "running", 7, "i"), PreviousRun(2, "i"), Level.CRIT),
        (UnitFacts("loaded", "active", "running", 3, "i"), PreviousRun(3, "i"), Level.OK),
    ],
)
def test_unit_states(unit: UnitFacts, previous: PreviousRun | None, expected: Level) -> None:
    r = evaluate(host(**REPLAY), healthy(unit=unit), previous)
    assert levels(r)["unit"] is expected


def test_restart_counter_reset_by_a_manual_restart_counts_from_zero() -> None:
    # a deploy's restart resets NRestarts; the new count is all new restarts, never a negative delta
    assert restarts_since(UnitFacts(n_restarts=1), PreviousRun(5, "old")) == 1
    assert restarts_since(UnitFacts(n_restarts=6), PreviousRun(5, "old")) == 1
    assert restarts_since(UnitFacts(n_restarts=None), PreviousRun(5, "old")) is None


def test_http_check_on_sglang_hosts() -> None:
    h = host(gpu_arch=None, service={"mode": "sglang", "port": 30001}, health={"http_path": "/healthz"})
    ok = evaluate(h, healthy(http=HttpFacts(200, 0.01)))
    assert levels(ok)["http"] is Level.OK and ":30001/healthz" in ok.check("http").detail  # type: ignore[union-attr]
    assert levels(evaluate(h, healthy(http=HttpFacts(503, 0.01))))["http"] is Level.CRIT
    assert levels(evaluate(h, healthy(http=HttpFacts(error="timed out"))))["http"] is Level.CRIT


@pytest.mark.parametrize(
    ("gpu", "expected"),
    [
        (GpuFacts((("NVIDIA RTX PRO 6000", "12.0"),) * 8), Level.OK),
        (GpuFacts((("NVIDIA H200", "9.0"),)), Level.CRIT),
        (GpuFacts(()), Level.CRIT),
        (GpuFacts(error="nvidia-smi: not found"), Level.CRIT),
    ],
)
def test_gpu_arch(gpu: GpuFacts, expected: Level) -> None:
    h = host(gpu_arch="12.0", service={"mode": "replay"})
    assert levels(evaluate(h, healthy(gpu=gpu)))["gpu"] is expected


def test_drift_changed_missing_and_extra_files() -> None:
    h = host(**REPLAY)
    changed = evaluate(h, healthy(drift=DriftFacts("r1", MANIFEST, {**MANIFEST, "kernel/b.cu": "XX"})))
    assert levels(changed)["drift"] is Level.CRIT and "kernel/b.cu" in changed.check("drift").detail  # type: ignore[union-attr]
    missing = evaluate(h, healthy(drift=DriftFacts("r1", MANIFEST, {"backend/a.py": "aa"})))
    assert levels(missing)["drift"] is Level.CRIT and "missing" in missing.check("drift").detail  # type: ignore[union-attr]
    # build outputs land inside the release and are not in the manifest: not drift
    extra = evaluate(h, healthy(drift=DriftFacts("r1", MANIFEST, {**MANIFEST, "kernel/build/x.so": "cc"})))
    assert levels(extra)["drift"] is Level.OK
    assert levels(evaluate(h, healthy(drift=DriftFacts(error="no current"))))["drift"] is Level.CRIT


def test_parity_levels_follow_gate_thresholds() -> None:
    h = host(**REPLAY, gate={"pass_rel": 0.01, "fail_rel": 0.05})
    assert levels(evaluate(h, healthy(parity=(sample(0.001),))))["parity"] is Level.OK
    assert levels(evaluate(h, healthy(parity=(sample(0.02),))))["parity"] is Level.WARN
    assert levels(evaluate(h, healthy(parity=(sample(1.08),))))["parity"] is Level.CRIT
    assert levels(evaluate(h, healthy(parity=())))["parity"] is Level.WARN
    # a failing line among the latest K of a rank fails, even if a later line passes
    mixed = (sample(0.001, at=1), sample(0.9, at=2, layer=5), sample(0.001, at=3))
    assert levels(evaluate(h, healthy(parity=mixed)))["parity"] is Level.CRIT
    nan = evaluate(h, healthy(parity=(sample(math.nan),)))
    assert levels(nan)["parity"] is Level.CRIT


def test_disk_thresholds() -> None:
    h = host(**REPLAY, min_free_disk_mb=1000, health={"disk_warn_mb": 5000})
    assert levels(evaluate(h, healthy(disk_free_mb=500.0)))["disk"] is Level.CRIT
    assert levels(evaluate(h, healthy(disk_free_mb=3000.0)))["disk"] is Level.WARN
    assert levels(evaluate(h, healthy(disk_free_mb=9000.0)))["disk"] is Level.OK


def test_lock_states() -> None:
    h = host(**REPLAY)
    dead = LockFacts(True, 30.0, "ctl", 4242, owner_alive=False)
    alive = LockFacts(True, 30.0, "ctl", 4242, owner_alive=True)
    old_elsewhere = LockFacts(True, stale_lock_age_s(h) + 1, "other", 1, owner_alive=None)
    assert levels(evaluate(h, healthy(lock=dead)))["lock"] is Level.CRIT
    assert levels(evaluate(h, healthy(lock=alive)))["lock"] is Level.OK
    assert levels(evaluate(h, healthy(lock=old_elsewhere)))["lock"] is Level.WARN
    assert levels(evaluate(h, healthy(lock=LockFacts(True, 5.0))))["lock"] is Level.OK  # being taken right now
    assert levels(evaluate(h, healthy(lock=LockFacts(True, 600.0))))["lock"] is Level.WARN  # its taker died
    detail = evaluate(h, healthy(lock=dead)).check("lock").detail  # type: ignore[union-attr]
    assert "4242" in detail and "release --force" in detail


def test_clock_skew_warns() -> None:
    h = host(**REPLAY)
    assert levels(evaluate(h, healthy(host_time=1000.0, local_time=1200.0)))["clock"] is Level.WARN
    assert levels(evaluate(h, healthy(host_time=1000.0, local_time=1001.0)))["clock"] is Level.OK


def test_rollback_wanted_only_for_release_checks() -> None:
    h = host(**REPLAY)
    crash = evaluate(h, healthy(unit=UnitFacts("loaded", "activating", "auto-restart", 3, "")))
    disk = evaluate(h, healthy(disk_free_mb=1.0))
    assert crash.wants_rollback and not disk.wants_rollback
    assert disk.level is Level.CRIT


def test_a_stopped_unit_is_a_warning_never_a_rollback() -> None:
    h = host(**REPLAY)
    stopped = evaluate(h, healthy(unit=UnitFacts("loaded", "inactive", "dead", 0, ""), parity=()))
    assert levels(stopped)["unit"] is Level.WARN and not stopped.wants_rollback
    assert "stopped" in stopped.check("unit").detail  # type: ignore[union-attr]


def test_http_down_alone_is_crit_but_not_evidence_against_the_release() -> None:
    h = host(gpu_arch=None, service={"mode": "sglang", "tp": 1})
    down = evaluate(h, healthy(http=HttpFacts(error="connection refused")))
    assert levels(down)["http"] is Level.CRIT and not down.wants_rollback


def test_an_old_nan_line_followed_by_passing_lines_is_not_a_rollback() -> None:
    h = host(**REPLAY)
    history = (sample(math.nan, at=1), *(sample(0.001, at=t) for t in range(2, 40)))
    r = evaluate(h, healthy(parity=history))
    assert levels(r)["parity"] is Level.WARN and not r.wants_rollback
    assert "earlier line failed" in r.check("parity").detail  # type: ignore[union-attr]
    # ... while a failing line among the latest of its rank is evidence
    fresh = evaluate(h, healthy(parity=(*history, sample(0.3, at=50))))
    assert levels(fresh)["parity"] is Level.CRIT and fresh.wants_rollback


def test_health_judges_each_rank_and_only_the_invocations_token() -> None:
    h = host(gpu_arch=None, service={"mode": "replay", "tp": 2})
    tok = "0123456789abcdef"
    rank0 = tuple(sample(0.001, at=t, rank=0, token=tok) for t in range(5))
    silent = evaluate(h, healthy(parity=rank0, parity_token=tok))
    assert levels(silent)["parity"] is Level.WARN and "TP rank(s) 1" in silent.check("parity").detail  # type: ignore[union-attr]
    forged = (*rank0, *(sample(0.9, at=10 + t, rank=1) for t in range(3)))  # no token: ignored
    r = evaluate(h, healthy(parity=forged, parity_token=tok))
    assert not r.wants_rollback and "without this invocation's token ignored" in r.check("parity").detail  # type: ignore[union-attr]
    real = (*rank0, *(sample(0.9, at=10 + t, rank=1, token=tok) for t in range(3)))
    assert evaluate(h, healthy(parity=real, parity_token=tok)).wants_rollback


def test_exit_code_is_worst_host() -> None:
    h = host(**REPLAY)
    ok = evaluate(h, healthy())
    warn = evaluate(h, healthy(parity=()))
    crit = evaluate(h, healthy(disk_free_mb=1.0))
    assert exit_code([ok]) == 0 and exit_code([ok, warn]) == 1 and exit_code([warn, crit, ok]) == 2


def test_a_stopped_unit_makes_http_a_skip_not_a_second_finding() -> None:
    """An operator's stop closes the port: the unit check's WARN says so; http is not asked (no CRIT)."""
    h = host(gpu_arch=None, service={"mode": "standin", "tp": 1})
    stopped = UnitFacts("loaded", "inactive", "dead", 0, "")
    r = evaluate(h, healthy(unit=stopped, http=HttpFacts(error="connection refused")))
    assert levels(r)["unit"] is Level.WARN and levels(r)["http"] is Level.SKIP and not r.wants_rollback
    assert "unit stopped" in r.check("http").detail  # type: ignore[union-attr]
