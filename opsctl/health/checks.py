"""Health checks: facts gathered from a host -> pure evaluation -> OK / WARN / CRIT per check and per host.

Shape: ``ssh_probe`` (one SSH round trip running opsctl.health.probe's command: the host facts and a small
read-only Python script) returns ``HostFacts``; ``evaluate`` turns facts + the previous run's record into
``HostHealth`` with no I/O; ``check_hosts`` does that for many hosts at once (opsctl.fleet.fanout); ``HealthHistory``
keeps one JSON line per host and run on the machine running opsctl (the NRestarts baseline for the crash-loop
check lives there). This module returns data: the table, JSON and Prometheus text are opsctl.cli.render's.

Exit codes: 0 when every host is OK, 1 when the worst is WARN, 2 when any host is CRIT (an unreachable host is
CRIT); 3 when the check itself failed (``EXIT_HEALTH_ERROR``). A check that does not apply to a host (no GPU
expected, no HTTP port in replay mode) is ``skip`` and never changes the verdict.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ..errors import OpsError
from ..fleet.fanout import DEFAULT_WORKERS, run_on_hosts
from ..gate.decision import GateState, LineVerdict
from ..gate.lines import ParityLine, parse_line
from ..gate.traffic import ProbeClient, serves_http
from ..host.facts import SystemFacts, parse_facts
from ..host.releaseroot import parse_parity_env
from ..inventory import HostConfig
from ..journal.follower import parse_entries, parse_mark
from ..journal.query import SEPARATOR as JOURNAL_SEPARATOR
from ..journal.query import mark_command, poll_command
from ..release import Manifest
from ..ssh.remote import Remote
from . import probe as host_probe

# ----------------------------------------------------------------------------------------------------------------
# Levels and results


class Level(StrEnum):
    OK = "ok"
    WARN = "warn"
    CRIT = "crit"
    SKIP = "skip"

    @property
    def severity(self) -> int:
        """0/1/2 as in the exit codes; a skipped check weighs nothing."""
        return {Level.OK: 0, Level.WARN: 1, Level.CRIT: 2, Level.SKIP: 0}[self]


CHECK_NAMES = ("ssh", "unit", "http", "gpu", "drift", "parity", "disk", "lock", "clock", "probe")
# `--rollback-on-fail` acts only on evidence that the running release itself is bad (CheckResult.release_bad):
# failing parity lines among the latest of the current invocation, or a crash loop. A stopped unit, a slow HTTP
# endpoint, disk, GPU, lock, drift and clock problems are not fixed by switching releases: a person decides.
CLOCK_SKEW_WARN_S = 30.0
# A lock directory is created first and its owner record written right after: a lock still without one after
# this long was left by a run that died in between.
UNOWNED_LOCK_WARN_S = 60.0


@dataclass(frozen=True)
class CheckResult:
    name: str
    level: Level
    detail: str
    value: float | None = None  # the figure the check looked at, for JSON/Prometheus
    release_bad: bool = False  # evidence that the running release is bad: a rollback may act on it


@dataclass(frozen=True)
class HostHealth:
    host: str
    checks: tuple[CheckResult, ...]
    checked_at: float  # local epoch seconds
    elapsed_s: float
    n_restarts: int | None = None
    invocation_id: str | None = None
    release: str | None = None

    @property
    def level(self) -> Level:
        worst = max((c.level.severity for c in self.checks), default=0)
        return {0: Level.OK, 1: Level.WARN, 2: Level.CRIT}[worst]

    def check(self, name: str) -> CheckResult | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def wants_rollback(self) -> bool:
        return any(c.level is Level.CRIT and c.release_bad for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "status": self.level.value,
            "checked_at": self.checked_at,
            "elapsed_s": round(self.elapsed_s, 3),
            "release": self.release,
            "n_restarts": self.n_restarts,
            "invocation_id": self.invocation_id,
            "checks": {c.name: {"status": c.level.value, "detail": c.detail, "value": c.value} for c in self.checks},
        }


def exit_code(results: Iterable[HostHealth]) -> int:
    return max((r.level.severity for r in results), default=0)


# The health check itself failed (bad inventory or option, an alert hook that could not even be tried, a bug):
# none of 0/1/2, which are findings about hosts, so the opsctl-health timer (SuccessExitStatus=1 2) shows it
# as a failed run instead of a CRIT it only reports.
EXIT_HEALTH_ERROR = 3
FINDING_EXIT_CODES = (1, 2)  # WARN, CRIT: a run that found problems, not a failed run (the timer's SuccessExitStatus)


# ----------------------------------------------------------------------------------------------------------------
# Facts (what a probe found; plain data so tests can build them by hand)


@dataclass(frozen=True)
class UnitFacts:
    load_state: str = ""
    active_state: str = ""
    sub_state: str = ""
    n_restarts: int | None = None
    invocation_id: str = ""


@dataclass(frozen=True)
class HttpFacts:
    status: int | None = None
    elapsed_s: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class GpuFacts:
    gpus: tuple[tuple[str, str], ...] = ()  # (name, compute capability)
    error: str | None = None


@dataclass(frozen=True)
class DriftFacts:
    release: str | None = None
    manifest: Mapping[str, str] | None = None  # relative path -> sha256, as the release's manifest.json says
    actual: Mapping[str, str] = field(default_factory=dict)  # relative path -> sha256 found on the host
    error: str | None = None


@dataclass(frozen=True)
class ParitySample:
    at: float  # host epoch seconds (journal timestamp)
    line: ParityLine

    @property
    def label(self) -> str:
        rank = f" TP{self.line.rank}" if self.line.rank is not None else ""
        return f"L{self.line.layer}{rank}"

    @property
    def rel(self) -> float:
        return self.line.rel


@dataclass(frozen=True)
class LockFacts:
    present: bool = False
    age_s: float | None = None
    owner_host: str | None = None
    owner_pid: int | None = None
    owner_alive: bool | None = None  # None: the owner runs on another machine, so its pid cannot be checked
    owner_text: str = ""


@dataclass(frozen=True)
class ProbeFacts:
    """``--probe``: one probe request through the service's own API (opsctl/traffic.py) and the parity lines the
    running invocation printed after it was sent."""

    sent: int = 0
    answered: int = 0
    error: str | None = None  # why the request failed, or why the probe could not run
    refused: bool = False  # the server refused the request (HTTP 4xx): the probe could not ask
    ttft_s: float | None = None
    lines: tuple[ParityLine, ...] = ()
    waited_s: float = 0.0  # how long the lines were waited for after the answer


@dataclass(frozen=True)
class HostFacts:
    host: str
    reachable: bool = True
    error: str | None = None
    unit: UnitFacts = field(default_factory=UnitFacts)
    http: HttpFacts | None = None  # None: not probed (replay mode)
    gpu: GpuFacts | None = None  # None: not probed (no GPU expected)
    drift: DriftFacts = field(default_factory=DriftFacts)
    parity: tuple[ParitySample, ...] = ()
    parity_error: str | None = None
    parity_token: str | None = None  # the token the running invocation was handed (state/parity.env)
    disk_free_mb: float | None = None
    lock: LockFacts = field(default_factory=LockFacts)
    host_time: float | None = None  # host epoch seconds when probed
    local_time: float = 0.0  # local epoch seconds when the probe answered
    elapsed_s: float = 0.0
    probe: ProbeFacts | None = None  # None: no probe request was sent (not asked for, or no HTTP API)


@dataclass(frozen=True)
class PreviousRun:
    """What the last health run recorded for a host (from the local history)."""

    n_restarts: int | None = None
    invocation_id: str | None = None


# ----------------------------------------------------------------------------------------------------------------
# Pure evaluation


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
    )
    return HostHealth(
        host.name,
        checks,
        facts.local_time,
        facts.elapsed_s,
        n_restarts=facts.unit.n_restarts,
        invocation_id=facts.unit.invocation_id or None,
        release=facts.drift.release,
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
    ignored = len(samples) - len(counted)
    note = f"; {ignored} line(s) without this invocation's token ignored" if ignored else ""
    if not counted:
        return CheckResult("parity", Level.WARN, f"no parity line from this invocation in the last {window}s{note}")
    k = host.gate.consecutive_passes
    by_rank: dict[int | None, list[ParitySample]] = {}
    for sample in counted:
        by_rank.setdefault(sample.line.rank, []).append(sample)
    latest = [s for lines in by_rank.values() for s in lines[-k:]]
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
    silent = [r for r in range(host.service.tp) if r not in by_rank]
    newest = counted[-1]
    if failed_before:
        old = failed_before[-1]
        detail = (
            f"an earlier line failed ({old.label} rel={old.rel:.3g}); the latest {len(latest)} pass or are inconclusive"
        )
        return CheckResult("parity", Level.WARN, detail + note, old.rel)
    if silent:
        return CheckResult(
            "parity", Level.WARN, f"TP rank(s) {', '.join(map(str, silent))} printed no parity line in {window}s{note}"
        )
    level = max((levels[id(s)] for s in latest), key=lambda lv: lv.severity)
    verdict = "pass" if level is Level.OK else "inconclusive"
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
    ignored = verdicts.count(LineVerdict.IGNORED)
    note = f"; {ignored} line(s) without this invocation's token ignored" if ignored else ""
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


# ----------------------------------------------------------------------------------------------------------------
# Local files


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write next to the target and rename, so a collector never reads half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------------------------------------------
# Local state: health history


def state_dir() -> Path:
    """$OPSCTL_STATE_DIR, else $XDG_STATE_HOME/kdtree-engine, else ~/.local/state/kdtree-engine."""
    explicit = os.environ.get("OPSCTL_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "kdtree-engine"


class HealthHistory:
    """Append-only JSON lines, one per host and run. Only the tail is read back (the newest run of each host)."""

    TAIL_BYTES = 1 << 20

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or state_dir() / "health-history.jsonl"

    def latest(self) -> dict[str, dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - self.TAIL_BYTES))
                data = f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for line in data.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a torn first line of the tail, or a line cut by a crash
            if isinstance(rec, dict) and isinstance(rec.get("host"), str):
                out[rec["host"]] = rec
        return out

    def previous(self, host: str) -> PreviousRun | None:
        rec = self.latest().get(host)
        if rec is None:
            return None
        return PreviousRun(n_restarts=rec.get("n_restarts"), invocation_id=rec.get("invocation_id"))

    def append(self, results: Iterable[HostHealth]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in results)
        # One write of whole lines in append mode: concurrent runs interleave lines, never halves of them.
        with open(self.path, "a") as f:
            f.write(lines)


# ----------------------------------------------------------------------------------------------------------------
# Probe: the I/O edge. One SSH round trip runs opsctl.health.probe's command: the host facts, then a JSON document.


def health_url(host: HostConfig) -> str:
    """The service's health endpoint on the host itself (opsctl.health.probe.health_url)."""
    return host_probe.health_url(host.service.port, host.health.http_path)


def probe_command(host: HostConfig, python: str = "python3") -> str:
    return host_probe.probe_command(
        host_probe.ProbeParams(
            unit=host.unit,
            root=host.root,
            http_url=None if host.service.mode == "replay" else health_url(host),
            http_timeout_s=host.health.http_timeout_s,
            parity_window_s=host.health.parity_window_s,
        ),
        python,
    )


def read_probe(stdout: str) -> tuple[SystemFacts, dict[str, Any]]:
    """The probe's output -> (the host facts, the script's JSON). ValueError when it is not the probe's."""
    facts_text, raw = host_probe.split_probe_output(stdout)
    return parse_facts(facts_text), raw


def facts_from_probe(
    host: HostConfig,
    system: SystemFacts,
    raw: Mapping[str, Any],
    *,
    local_time: float,
    elapsed_s: float,
    lock_owner: Callable[[str], tuple[str | None, int | None]],
    pid_alive: Callable[[int], bool],
    local_hostname: str,
) -> HostFacts:
    """The probe's findings -> HostFacts. The format knowledge of other modules comes in as functions."""
    u = system.unit
    n_restarts = u.get("NRestarts")
    unit = UnitFacts(
        load_state=u.get("LoadState", ""),
        active_state=u.get("ActiveState", ""),
        sub_state=u.get("SubState", ""),
        n_restarts=int(n_restarts) if isinstance(n_restarts, str) and n_restarts.isdigit() else None,
        invocation_id=u.get("InvocationID", ""),
    )
    http = None
    if "http" in raw:
        h = raw["http"]
        http = HttpFacts(status=h.get("status"), elapsed_s=h.get("elapsed_s"), error=h.get("error"))
    gpu = None
    if host.gpu_arch is not None:  # a GPU nobody expects is not looked at
        rows = tuple((g.name, g.compute_cap) for g in system.gpus if g.compute_cap is not None)
        gpu = GpuFacts(error=system.gpu_error) if system.gpu_error else GpuFacts(gpus=rows)
    if "release_error" in raw:
        drift = DriftFacts(error=f"no current release ({host.root}/current: {_strip_errno(raw['release_error'])})")
    elif "manifest" in raw:
        try:
            manifest: Mapping[str, str] | None = {f.path: f.sha256 for f in Manifest.from_json(raw["manifest"]).files}
            drift = DriftFacts(release=raw.get("release"), manifest=manifest, actual=raw.get("hashes") or {})
        except (ValueError, KeyError, TypeError) as e:
            drift = DriftFacts(release=raw.get("release"), error=f"manifest.json unreadable: {e}")
    else:
        drift = DriftFacts(release=raw.get("release"), error=f"manifest.json missing: {raw.get('manifest_error')}")
    samples = []
    for at, message in raw.get("parity_lines") or ():
        parsed = parse_line(message)
        if isinstance(parsed, ParityLine):
            samples.append(ParitySample(at=float(at), line=parsed))
    lock = LockFacts()
    if "lock" in raw:
        text = raw["lock"].get("text", "")
        owner_host, owner_pid = lock_owner(text)
        alive = pid_alive(owner_pid) if owner_pid is not None and owner_host == local_hostname else None
        lock = LockFacts(
            present=True,
            age_s=raw["lock"].get("age_s"),
            owner_host=owner_host,
            owner_pid=owner_pid,
            owner_alive=alive,
            owner_text=text[:500],
        )
    return HostFacts(
        host=host.name,
        unit=unit,
        http=http,
        gpu=gpu,
        drift=drift,
        parity=tuple(samples),
        parity_error=raw.get("journal_error"),
        parity_token=parse_parity_env(raw.get("parity_env") or ""),
        disk_free_mb=None if system.disk_avail_kb is None else system.disk_avail_kb / 1024,
        lock=lock,
        host_time=raw.get("host_time"),
        local_time=local_time,
        elapsed_s=elapsed_s,
    )


def _strip_errno(message: str) -> str:
    """ "[Errno 2] No such file or directory: '/x'" -> "No such file or directory"."""
    text = message.split("] ", 1)[-1]
    return text.split(":", 1)[0]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def local_hostname() -> str:
    return socket.gethostname()


@dataclass(frozen=True)
class HealthRun:
    results: tuple[HostHealth, ...]

    @property
    def exit_code(self) -> int:
        return exit_code(self.results)


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
        previous = PreviousRun(rec.get("n_restarts"), rec.get("invocation_id")) if rec else None
        return evaluate(host, probe(host), previous)

    results = tuple(run_on_hosts(hosts, one, workers=max_workers, thread_name_prefix="health").values())
    if history is not None:
        history.append(results)
    return HealthRun(results)


def lock_owner(text: str) -> tuple[str | None, int | None]:
    """hoststate's owner.json -> (client hostname, pid); anything unreadable -> unknown owner."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(doc, dict):
        return None, None
    pid = doc.get("pid")
    client = doc.get("client")
    return (client if isinstance(client, str) else None), (pid if isinstance(pid, int) else None)


def verify_probe(r: Remote, host: HostConfig) -> ProbeFacts:
    """``--probe``'s I/O: mark the journal, send one probe request from the host (``health.probe_max_new_tokens``
    new tokens: enough verify steps for one sampled parity step after the start's burst), then read the running
    invocation's entries after the mark until every TP rank has printed a parity line or ``health.probe_wait_s``
    has passed."""
    mark = parse_mark(r.run(mark_command(host.unit), timeout=60).stdout)
    client = ProbeClient(host, lambda: r)
    try:
        wave = client.wave(requests=1, max_new_tokens=host.health.probe_max_new_tokens)
    except OpsError as e:
        return ProbeFacts(error=e.message)
    if wave.failed:
        first = wave.failed[0]
        return ProbeFacts(sent=1, error=first.error or first.kind, refused=first.refused)
    ttft = wave.requests[0].ttft_s if wave.requests else None
    lines: list[ParityLine] = []
    cursor, t0 = mark.cursor, time.monotonic()
    while True:
        res = r.run(poll_command(host.unit, cursor), timeout=60, check=False)
        for entry in parse_entries(res.stdout.partition(JOURNAL_SEPARATOR)[2]):
            cursor = entry.cursor
            parsed = parse_line(entry.message)
            if entry.invocation == mark.old_invocation and isinstance(parsed, ParityLine):
                lines.append(parsed)
        ranks = {line.rank for line in lines}
        waited = time.monotonic() - t0
        if all(rank in ranks for rank in range(host.service.tp)) or waited >= host.health.probe_wait_s:
            return ProbeFacts(sent=1, answered=1, ttft_s=ttft, lines=tuple(lines), waited_s=waited)
        time.sleep(0.5)


def ssh_probe(host: HostConfig, *, accept_new_host_key: bool = False, probe: bool = False) -> HostFacts:
    """Probe one host in one SSH round trip (with ``probe``, and an HTTP API, a few more: :func:`verify_probe`).
    Any SSH failure is an unreachable host, never an exception."""
    from ..ssh.client import connect

    t0 = time.monotonic()
    verify = None
    try:
        with connect(host, accept_new_host_key=accept_new_host_key) as r:
            res = r.run(probe_command(host), timeout=host.health.http_timeout_s + 60, check=True)
            if probe and serves_http(host):
                verify = verify_probe(r, host)
        system, raw = read_probe(res.stdout)
    except OpsError as e:
        return unreachable_facts(host, e, time.monotonic() - t0)
    except ValueError as e:
        return unreachable_facts(
            host, OpsError(f"{host.name}: health probe output unreadable: {e}"), time.monotonic() - t0
        )
    facts = facts_from_probe(
        host,
        system,
        raw,
        local_time=time.time(),
        elapsed_s=time.monotonic() - t0,
        lock_owner=lock_owner,
        pid_alive=pid_alive,
        local_hostname=local_hostname(),
    )
    return dataclasses.replace(facts, probe=verify)


def unreachable_facts(host: HostConfig, error: OpsError | Exception, elapsed_s: float) -> HostFacts:
    msg = error.message if isinstance(error, OpsError) else str(error)
    return HostFacts(host=host.name, reachable=False, error=msg, local_time=time.time(), elapsed_s=elapsed_s)


def as_dict(facts: HostFacts) -> dict[str, Any]:
    return asdict(facts)
