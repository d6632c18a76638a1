"""Health checks: a host's facts (opsctl.health.findings) -> pure evaluation -> OK / WARN / CRIT per check and per
host (opsctl.health.levels).

``evaluate`` turns one host's facts + the previous run's record into ``HostHealth`` with no I/O; ``check_hosts``
probes many hosts at once (opsctl.fleet.fanout; the probe is opsctl.health.probe's ``ssh_probe``), evaluates them
against the local history (opsctl.health.localstate) and appends the new records. This module returns data: the
table, JSON and Prometheus text are opsctl.cli.render's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..comparison.results import Outcome
from ..fleet.fanout import DEFAULT_WORKERS, run_on_hosts
from ..gate.decision import GateState, LineVerdict
from ..inventory import HostConfig
from ..probe.traffic import serves_http
from .findings import (
    DriftFacts,
    GpuFacts,
    HostFacts,
    HttpFacts,
    LockFacts,
    ParitySample,
    ProbeFacts,
    SpeedFacts,
    UnitFacts,
)
from .levels import CHECK_NAMES, CheckResult, HealthRun, HostHealth, Level
from .localstate import HealthHistory, PreviousRun

CLOCK_SKEW_WARN_S = 30.0
# A lock directory is created first and its owner record written right after: a lock still without one after
# this long was left by a run that died in between.
UNOWNED_LOCK_WARN_S = 60.0


def stale_lock_age_s(host: HostConfig) -> float:
    """No honest deploy holds the lock longer than a build, two gates (deploy + rollback) and some slack."""
    return host.build_timeout_s + 2 * host.gate.deadline_s + 600.0


_LINE_LEVEL = {LineVerdict.PASS: Level.OK, LineVerdict.INCONCLUSIVE: Level.WARN, LineVerdict.FAIL: Level.CRIT}


def evaluate(host: HostConfig, facts: HostFacts, previous: PreviousRun | None = None) -> HostHealth:
    if not facts.reachable:
        checks: tuple[CheckResult, ...] = (
            CheckResult("ssh", Level.CRIT, facts.error or "unreachable"),
            *(CheckResult(n, Level.SKIP, "host not reachable") for n in CHECK_NAMES[1:]),
        )
        return HostHealth(host.name, checks, facts.local_time, facts.elapsed_s, release=None)
    checks = (
        CheckResult("ssh", Level.OK, f"answered in {facts.elapsed_s:.2f}s", facts.elapsed_s),
        check_unit(host, facts.unit, previous),
        check_http(host, facts.http, facts.unit),
        check_gpu(host, facts.gpu),
        check_drift(facts.drift),
        check_parity(host, facts.parity, facts.parity_error, facts.parity_token),
        check_disk(host, facts.disk_free_mb),
        check_lock(host, facts.lock),
        check_clock(facts.host_time, facts.local_time),
        check_probe(host, facts.probe, facts.parity_token),
        check_speed(host, facts.speed),
    )
    return HostHealth(
        host.name,
        checks,
        facts.local_time,
        facts.elapsed_s,
        n_restarts=facts.unit.n_restarts,
        invocation_id=facts.unit.invocation_id or None,
        release=facts.drift.release,
        gauges=speed_gauges(facts.speed),
    )


def restarts_since(unit: UnitFacts, previous: PreviousRun | None) -> int | None:
    """Automatic restarts since the last health run.

    systemd resets NRestarts when the unit is started by hand (a deploy's restart), which also gives it a new
    InvocationID; a counter that went down therefore means a fresh start, and everything it counts is new.
    With no previous record, the counter itself is the best figure.
    """
    if unit.n_restarts is None:
        return None
    if previous is None or previous.n_restarts is None:
        return unit.n_restarts
    if unit.n_restarts < previous.n_restarts:
        return unit.n_restarts
    return unit.n_restarts - previous.n_restarts


def check_unit(host: HostConfig, unit: UnitFacts, previous: PreviousRun | None) -> CheckResult:
    state = f"{unit.active_state}/{unit.sub_state}" if unit.sub_state else unit.active_state or "unknown"
    if unit.load_state == "not-found":
        return CheckResult("unit", Level.CRIT, f"{host.unit} is not installed")
    delta = restarts_since(unit, previous)
    value = float(delta) if delta is not None else None
    if unit.sub_state == "auto-restart" or unit.active_state == "failed":
        return CheckResult(
            "unit", Level.CRIT, f"{state}: crash loop or failed (NRestarts={unit.n_restarts})", value, release_bad=True
        )
    if unit.active_state == "inactive":
        # Stopped cleanly (not failed): an operator's `systemctl stop`, not evidence against the release.
        return CheckResult("unit", Level.WARN, f"{state}: stopped (not failed); start it or deploy", value)
    if unit.active_state != "active":
        return CheckResult("unit", Level.CRIT, f"{state}: not running", value)
    if delta is not None and delta > host.gate.max_restarts:
        return CheckResult(
            "unit", Level.CRIT, f"active, but restarted {delta}x since the last check", value, release_bad=True
        )
    if delta is not None and host.health.restarts_warn and delta >= host.health.restarts_warn:
        return CheckResult("unit", Level.WARN, f"active, restarted {delta}x since the last check", value)
    return CheckResult("unit", Level.OK, f"{state}, {delta or 0} restart(s) since the last check", value)


def check_http(host: HostConfig, http: HttpFacts | None, unit: UnitFacts | None = None) -> CheckResult:
    if host.service.mode == "replay" or http is None:
        return CheckResult("http", Level.SKIP, "replay service has no HTTP port")
    if unit is not None and unit.load_state != "not-found" and unit.active_state == "inactive":
        # A unit stopped cleanly closes its port: the unit check reports the stop (WARN); a CRIT here would turn an
        # operator's `systemctl stop` into a critical finding.
        return CheckResult("http", Level.SKIP, "unit stopped: no server to ask")
    where = f":{host.service.port}{host.health.http_path}"
    if http.error:
        return CheckResult("http", Level.CRIT, f"{where}: {http.error}")
    if http.status is None or not 200 <= http.status < 300:
        return CheckResult("http", Level.CRIT, f"{where}: HTTP {http.status}", http.elapsed_s)
    return CheckResult("http", Level.OK, f"{where}: HTTP {http.status} in {http.elapsed_s or 0:.2f}s", http.elapsed_s)


def check_gpu(host: HostConfig, gpu: GpuFacts | None) -> CheckResult:
    if host.gpu_arch is None:
        return CheckResult("gpu", Level.SKIP, "no GPU expected")
    if gpu is None or gpu.error:
        return CheckResult("gpu", Level.CRIT, (gpu.error if gpu else None) or "not probed")
    if not gpu.gpus:
        return CheckResult("gpu", Level.CRIT, "nvidia-smi lists no GPU")
    wrong = sorted({cap for _, cap in gpu.gpus if cap != host.gpu_arch})
    if wrong:
        return CheckResult(
            "gpu", Level.CRIT, f"compute capability {', '.join(wrong)} where {host.gpu_arch} is expected"
        )
    return CheckResult("gpu", Level.OK, f"{len(gpu.gpus)}x {gpu.gpus[0][0]} (sm {host.gpu_arch})", len(gpu.gpus))


def check_drift(drift: DriftFacts) -> CheckResult:
    if drift.error:
        return CheckResult("drift", Level.CRIT, drift.error)
    if drift.manifest is None:
        return CheckResult("drift", Level.CRIT, "no manifest.json in the current release")
    missing = sorted(p for p in drift.manifest if p not in drift.actual)
    changed = sorted(p for p, sha in drift.manifest.items() if p in drift.actual and drift.actual[p] != sha)
    if missing or changed:
        parts = []
        if changed:
            parts.append(f"{len(changed)} changed ({', '.join(changed[:3])}{'...' if len(changed) > 3 else ''})")
        if missing:
            parts.append(f"{len(missing)} missing ({', '.join(missing[:3])}{'...' if len(missing) > 3 else ''})")
        return CheckResult("drift", Level.CRIT, "; ".join(parts), float(len(missing) + len(changed)))
    return CheckResult("drift", Level.OK, f"{len(drift.manifest)} files match the manifest", 0.0)


def check_parity(
    host: HostConfig, samples: Sequence[ParitySample], error: str | None, token: str | None = None
) -> CheckResult:
    """The current invocation's parity lines in the window, judged by the gate's rules on the *latest* lines:
    the last K (consecutive_passes) of each TP rank. A failing or malformed one among them is CRIT and evidence
    against the release; an older failure that passing lines followed is WARN (it happened, it is not current).
    Lines without the invocation's token (when one was handed out) are ignored, as the gate ignores them."""
    window = host.health.parity_window_s
    if error:
        return CheckResult("parity", Level.WARN, f"journal not readable: {error}")
    gate = GateState(settings=host.gate, started_at=0.0, deadline_s=window, expected_ranks=host.service.tp, token=token)
    counted = [s for s in sorted(samples, key=lambda s: s.at) if gate.ignored_reason(s.line) is None]
    note = ignored_note(len(samples) - len(counted))
    if not counted:
        return CheckResult("parity", Level.WARN, f"no parity line from this invocation in the last {window}s{note}")
    return _judge_parity(host, gate, counted, note)


def ignored_note(ignored: int) -> str:
    """The detail's tail that counts the lines left out for want of the invocation's token (none: nothing)."""
    return f"; {ignored} line(s) without this invocation's token ignored" if ignored else ""


def latest_per_rank(
    counted: Sequence[ParitySample], k: int
) -> tuple[dict[int | None, list[ParitySample]], list[ParitySample]]:
    """Lines, oldest first -> (each rank's lines, the last ``k`` of each rank): the lines that decide."""
    by_rank: dict[int | None, list[ParitySample]] = {}
    for sample in counted:
        by_rank.setdefault(sample.line.rank, []).append(sample)
    return by_rank, [s for lines in by_rank.values() for s in lines[-k:]]


def _judge_parity(host: HostConfig, gate: GateState, counted: Sequence[ParitySample], note: str) -> CheckResult:
    """The counted lines (oldest first, at least one) -> the parity check: a failing line among the latest is CRIT,
    an older one WARN, a silent rank WARN; else the latest lines' worst level."""
    by_rank, latest = latest_per_rank(counted, host.gate.consecutive_passes)
    levels = {id(s): _sample_level(gate, s) for s in counted}
    failing_now = [s for s in latest if levels[id(s)] is Level.CRIT]
    if failing_now:
        worst = failing_now[-1]
        return CheckResult(
            "parity",
            Level.CRIT,
            f"{len(failing_now)} of the latest {len(latest)} line(s) failing, last {worst.label} rel={worst.rel:.3g}"
            + note,
            worst.rel,
            release_bad=True,
        )
    failed_before = [s for s in counted if levels[id(s)] is Level.CRIT]
    if failed_before:
        old = failed_before[-1]
        detail = (
            f"an earlier line failed ({old.label} rel={old.rel:.3g}); the latest {len(latest)} pass or are inconclusive"
        )
        return CheckResult("parity", Level.WARN, detail + note, old.rel)
    silent = [r for r in range(host.service.tp) if r not in by_rank]
    if silent:
        return CheckResult(
            "parity",
            Level.WARN,
            f"TP rank(s) {', '.join(map(str, silent))} printed no parity line in {host.health.parity_window_s}s{note}",
        )
    level = max((levels[id(s)] for s in latest), key=lambda lv: lv.severity)
    verdict = "pass" if level is Level.OK else "inconclusive"
    newest = counted[-1]
    return CheckResult(
        "parity",
        level,
        f"latest {newest.label} rel={newest.rel:.3g} ({verdict}), {len(counted)} line(s){note}",
        newest.rel,
    )


def _sample_level(gate: GateState, sample: ParitySample) -> Level:
    """The gate's own verdict on one line (malformed or non-finite fails, never passes), as a health level."""
    return _LINE_LEVEL[gate.judge_line(sample.line)]


def check_probe(host: HostConfig, probe: ProbeFacts | None, token: str | None) -> CheckResult:
    """``--probe``: the probe request must be answered, and every TP rank must have printed a fresh parity line
    with the running invocation's token, judged by the gate's rules: the verify path works end to end. A failing
    line or a request the server could not serve is evidence against the release; a silent rank is CRIT too."""
    if probe is None:
        why = (
            "replay service has no HTTP API"
            if not serves_http(host)
            else "not asked for (--probe, or health.probe: true)"
        )
        return CheckResult("probe", Level.SKIP, why)
    if probe.error:
        what = "probe request refused" if probe.refused else "probe request failed"
        return CheckResult("probe", Level.CRIT, f"{what}: {probe.error}", release_bad=not probe.refused)
    gate = GateState(settings=host.gate, started_at=0.0, deadline_s=1.0, expected_ranks=host.service.tp, token=token)
    verdicts = [gate.feed(line, 0.0) for line in probe.lines]
    note = ignored_note(verdicts.count(LineVerdict.IGNORED))
    ttft = f" (TTFT {probe.ttft_s * 1000:.0f} ms)" if probe.ttft_s is not None else ""
    failing = [line for line, v in zip(probe.lines, verdicts, strict=True) if v is LineVerdict.FAIL]
    if failing:
        worst = failing[-1]
        return CheckResult(
            "probe",
            Level.CRIT,
            f"request answered{ttft}, but {len(failing)} fresh parity line(s) fail: {gate.reason}{note}",
            worst.rel,
            release_bad=True,
        )
    silent = gate.silent_ranks() if host.service.tp else []
    if silent or gate.lines == 0:
        ranks = ", ".join(map(str, silent or range(host.service.tp)))
        return CheckResult(
            "probe",
            Level.CRIT,
            f"request answered{ttft}, but TP rank(s) {ranks} of {host.service.tp} printed no fresh parity line "
            f"within {probe.waited_s:.0f}s (verify path not proven){note}",
        )
    if verdicts.count(LineVerdict.INCONCLUSIVE):
        return CheckResult(
            "probe", Level.WARN, f"request answered{ttft}; {gate.lines} fresh parity line(s), some inconclusive{note}"
        )
    return CheckResult(
        "probe",
        Level.OK,
        f"request answered{ttft}; {gate.lines} fresh parity line(s) from each of {host.service.tp} rank(s) pass{note}",
        probe.ttft_s,
    )


def check_speed(host: HostConfig, speed: SpeedFacts | None) -> CheckResult:
    """``--probe``: the running release against the sample recorded when it was deployed (a short run of the
    comparison workload, judged by the comparison's judge). WARN when decode speed or accepted drafts drifted down
    by more than ``health.max_drift`` with p < ``gate.compare.alpha`` (``decode 0.78x of its deploy``), or the
    answers changed (fewer than ``min_identical`` identical): thermal throttling, a noisy neighbour, a driver
    update. Never CRIT and never evidence for a rollback: the release is the one that passed; the host changed."""
    if speed is None:
        why = "replay service has no HTTP API" if not serves_http(host) else "not asked for (--probe)"
        return CheckResult("speed", Level.SKIP, why)
    if speed.skipped:
        return CheckResult("speed", Level.SKIP, speed.skipped)
    c = speed.comparison
    if speed.error or c is None:
        return CheckResult("speed", Level.WARN, f"the comparison workload could not run: {speed.error or 'no result'}")
    floor, alpha = 1 - host.health.max_drift, host.gate.compare.alpha
    found = []
    s = c.speed
    if s.ratio is not None and s.p is not None and s.ratio < floor and s.p < alpha:
        found.append(f"decode {s.ratio:.2f}x of {c.baseline} (p={s.p:.2g}, {s.n_old} vs {s.n_new} requests)")
    d = c.drafts
    if d is not None and d.ratio is not None and d.p is not None and d.ratio < floor and d.p < alpha:
        found.append(f"accepted drafts {d.old_mean:.2f} -> {d.new_mean:.2f} of {c.baseline} (p={d.p:.2g})")
    if c.answers is not None and c.answers.outcome is Outcome.FAIL:
        found.append(f"answers changed: {c.answers.describe()}")
    if c.failures.new_failed:
        found.append(f"{len(c.failures.new_failed)} of {c.requests} requests failed")
    if found:
        return CheckResult(
            "speed", Level.WARN, "; ".join(found) + f" (beyond health.max_drift {host.health.max_drift:g})", s.ratio
        )
    return CheckResult("speed", Level.OK, c.line(), s.ratio)


def speed_gauges(speed: SpeedFacts | None) -> tuple[tuple[str, float], ...]:
    """The speed check's figures measured now, for Prometheus."""
    if speed is None:
        return ()
    figures = (
        ("opsctl_health_decode_seconds_per_token", speed.s_per_token),
        ("opsctl_health_accepted_drafts", speed.accept_length),
    )
    return tuple((name, value) for name, value in figures if value is not None)


def check_disk(host: HostConfig, free_mb: float | None) -> CheckResult:
    if free_mb is None:
        return CheckResult("disk", Level.WARN, "free space unknown")
    text = f"{free_mb / 1024:.1f} GiB free"
    if free_mb < host.min_free_disk_mb:
        return CheckResult("disk", Level.CRIT, f"{text} (< {host.min_free_disk_mb} MB needed to deploy)", free_mb)
    if free_mb < host.health.disk_warn_mb:
        return CheckResult("disk", Level.WARN, f"{text} (< {host.health.disk_warn_mb} MB)", free_mb)
    return CheckResult("disk", Level.OK, text, free_mb)


def check_lock(host: HostConfig, lock: LockFacts) -> CheckResult:
    if not lock.present:
        return CheckResult("lock", Level.OK, "free")
    owner = f"{lock.owner_host or '?'}:{lock.owner_pid or '?'}"
    age = lock.age_s or 0.0
    release_hint = f"check and run `opsctl lock {host.name} release --force`"
    if lock.owner_alive is False:
        return CheckResult("lock", Level.CRIT, f"stale: owner {owner} is dead ({age:.0f}s old); {release_hint}", age)
    if lock.owner_host is None and lock.owner_pid is None and age > UNOWNED_LOCK_WARN_S:
        return CheckResult("lock", Level.WARN, f"held for {age:.0f}s with no owner record; {release_hint}", age)
    if age > stale_lock_age_s(host):
        return CheckResult(
            "lock", Level.WARN, f"held by {owner} for {age:.0f}s, longer than any deploy; {release_hint}", age
        )
    return CheckResult("lock", Level.OK, f"held by {owner} for {age:.0f}s (deploy in progress)", age)


def check_clock(host_time: float | None, local_time: float) -> CheckResult:
    if host_time is None:
        return CheckResult("clock", Level.SKIP, "host time unknown")
    skew = host_time - local_time
    if abs(skew) > CLOCK_SKEW_WARN_S:
        return CheckResult("clock", Level.WARN, f"host clock off by {skew:+.0f}s (journal windows use host time)", skew)
    return CheckResult("clock", Level.OK, f"{skew:+.1f}s", skew)


ProbeFn = Callable[[HostConfig], HostFacts]


def check_hosts(
    hosts: Sequence[HostConfig],
    probe: ProbeFn,
    history: HealthHistory | None = None,
    *,
    max_workers: int = DEFAULT_WORKERS,
) -> HealthRun:
    """Probe every host (in parallel), evaluate against the history, append the new records."""
    latest = history.latest() if history else {}

    def one(host: HostConfig) -> HostHealth:
        rec = latest.get(host.name)
        previous = PreviousRun.from_record(rec) if rec else None
        return evaluate(host, probe(host), previous)

    results = tuple(run_on_hosts(hosts, one, workers=max_workers, thread_name_prefix="health").values())
    if history is not None:
        history.append(results)
    return HealthRun(results)
