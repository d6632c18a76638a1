"""What a deploy would do on a host, or why it refuses; where a rollback goes. Pure: data in, data out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..host.history import DeployVerdict, HistoryEvent, HistoryRecord
from ..host.releaseroot import HostSnapshot
from ..hostdata.layout import Layout
from ..inventory import HostConfig
from ..lock import hostlock
from ..probe.traffic import plan_lines
from ..release import Manifest
from ..unit import unitfile
from .compareplan import comparison_plan

PRE_RESTART_PARITY_STEPS = 3


@dataclass(frozen=True)
class DeployOptions:
    dry_run: bool = False
    no_restart: bool = False
    gate_timeout_s: float | None = None
    force: bool = False
    skip_prerestart_parity: bool = False


@dataclass(frozen=True)
class Plan:
    host: str
    release: str
    previous: str | None
    steps: tuple[str, ...]
    notes: tuple[str, ...]
    refusal: str | None = None
    up_to_date: bool = False
    link_dest: str | None = None
    probe: tuple[str, ...] = ()  # the gate's probe plan in words (empty: no restart, so no gate)
    comparison: tuple[str, ...] = ()  # the comparison's plan in words (pipeline/compareplan.py)

    def describe(self) -> list[str]:
        head = f"deploy {self.release} to {self.host} (current: {self.previous or 'none'})"
        return [
            head,
            *(f"  {i}. {s}" for i, s in enumerate(self.steps, 1)),
            *(f"  {p}" for p in self.probe),
            *(f"  {c}" for c in self.comparison),
            *(f"  note: {n}" for n in self.notes),
        ]


def refusal(host: HostConfig, manifest: Manifest, snap: HostSnapshot, opts: DeployOptions) -> str | None:
    """Why a deploy of ``manifest`` must not start on this host, in the order an operator would fix it; None when
    it may. Pure."""
    if not snap.is_managed and not snap.is_virgin:
        found = []
        if snap.unit.exists:
            found.append(f"unit {host.unit} ({snap.unit.fragment_path or snap.unit.load_state})")
        if snap.root_exists:
            found.append(f"directory {host.root}")
        return (
            f"{host.name} has an install opsctl does not manage ({', '.join(found)}). Record it first with "
            f"`opsctl adopt {host.name}` (it becomes release zero, the rollback target)."
        )
    if snap.lock_present and not snap.lock_stale:
        return f"{host.name}: the deploy lock is held by {hostlock.describe_owner(snap.lock_owner)}"
    if snap.free_mb is not None and snap.free_mb < host.min_free_disk_mb:
        return f"{host.name}: only {snap.free_mb} MB free under {host.root} (need {host.min_free_disk_mb} MB)"
    if host.gpu_arch is not None and host.gpu_arch not in snap.gpu_compute_caps:
        seen = ", ".join(snap.gpu_compute_caps) or "no GPU visible to nvidia-smi"
        return f"{host.name}: inventory says gpu_arch {host.gpu_arch} but the host reports {seen}"
    if manifest.id in snap.bad and not opts.force:
        why = snap.bad_reasons.get(manifest.id) or "a failed gate"
        return f"{host.name}: release {manifest.id} is marked bad there ({why}); use --force to deploy it anyway"
    return None


# The commands whose records carry a gate's verdict on the release they leave current.
_GATED_EVENTS = frozenset({HistoryEvent.DEPLOY, HistoryEvent.RESTART, HistoryEvent.ROLLBACK})


def last_gated(history: Sequence[HistoryRecord], release: str) -> HistoryRecord | None:
    """The latest deploy, restart or rollback of ``release`` with a verdict (None: none recorded). Pure."""
    for rec in reversed(history):
        if rec.release == release and rec.verdict is not None and rec.event in _GATED_EVENTS:
            return rec
    return None


def last_verdict(history: Sequence[HistoryRecord], release: str) -> DeployVerdict | None:
    """The verdict of the latest deploy, restart or rollback of ``release`` (None: none recorded). Pure."""
    rec = last_gated(history, release)
    return rec.verdict if rec is not None else None


def redeploy_reason(release: str, snap: HostSnapshot, history: Sequence[HistoryRecord]) -> str | None:
    """Why a deploy of ``release`` has something to do; None when the host is up to date with it. Up to date
    needs all four: ``current`` is the release, its last gate passed, the unit is active, and the unit's running
    invocation is the one that gate judged. A release left current by an UNPROVEN or failed gate, a --no-restart
    STAGED or an ungated rollback, or whose unit is stopped or failed, is deployed again (issue 36: UP-TO-DATE on a
    dead host); so is one whose process systemd restarted by itself since its gate (a crash, `systemctl kill`:
    that invocation was never gated, issue 47), or whose passing record names no invocation (an older opsctl's).
    Pure."""
    if snap.current != release:
        return f"current is {snap.current or 'none'}"
    rec = last_gated(history, release)
    verdict = rec.verdict if rec is not None else None
    if rec is None or verdict is not DeployVerdict.PASS:
        return f"{release} is current but its last gate did not pass ({verdict or 'no gated verdict recorded'})"
    if snap.unit.active_state != "active":
        return f"{release} is current but the unit is {snap.unit.active_state or 'unknown'}"
    running = snap.unit.invocation_id
    if not running or rec.invocation != running:
        return (
            f"{release} is current but the unit's running invocation {running[:12] or '(unknown)'} was never gated "
            f"(its last gate judged {(rec.invocation or 'an unrecorded invocation')[:12]}: restarted since)"
        )
    return None


def _notes(host: HostConfig, manifest: Manifest, snap: HostSnapshot, history: Sequence[HistoryRecord]) -> list[str]:
    notes = []
    if snap.current == manifest.id:
        why = redeploy_reason(manifest.id, snap, history)
        if why is not None:
            notes.append(f"{why}: deploying it again")
    if snap.unit.drop_in_paths:
        notes.append(f"drop-ins override parts of the unit: {snap.unit.drop_in_paths}")
    if snap.is_virgin:
        notes.append(f"virgin host (no unit, no {host.root}): first deploy creates both")
    if manifest.dirty:
        notes.append("the working tree has uncommitted changes (recorded in the manifest)")
    return notes


def _steps(
    host: HostConfig, manifest: Manifest, snap: HostSnapshot, opts: DeployOptions, link_dest: str | None
) -> list[str]:
    """The deploy's steps as the plan prints them (the step list of pipeline/deploy.py, in words)."""
    layout = Layout(host.root)
    steps = [
        "preflight: ssh, GPU compute capability, disk, unit, lock",
        f"lock {layout.lock}",
        f"upload into {layout.release(manifest.id)}"
        + (f" (hard-linking unchanged files from {snap.current})" if link_dest else ""),
        "verify manifest sha256 on the host",
        f"build the extension (arch {host.gpu_arch or 'none: reference path'}, timeout {host.build_timeout_s:g}s)",
    ]
    if not opts.skip_prerestart_parity:
        steps.append(f"pre-restart parity ({PRE_RESTART_PARITY_STEPS} replay steps, rel < {host.gate.fail_rel:g})")
        speed = host.gate.speed
        if speed.enabled:
            against = snap.current if snap.current and snap.current != manifest.id else None
            steps.append(
                f"pre-restart speed: the verify path timed against {against}'s, alternating (up to {speed.rounds} "
                f"rounds, {speed.budget_s:g}s); refused, before any restart, when slower than "
                f"{1 + speed.max_slowdown:g}x with p < {speed.alpha:g}"
                if against
                else "pre-restart speed: skipped (no other running release to time against)"
            )
    comparing = not opts.no_restart and host.gate.compare.enabled and host.service.mode != "replay"
    if comparing:
        against = snap.current or "nothing"
        steps.append(f"baseline: the comparison workload against {against} (skipped unless it is ready)")
    steps += [
        f"switch {layout.current} -> releases/{manifest.id}",
        f"install {unitfile.unit_path(host)} (daemon-reload if changed)",
    ]
    if not opts.no_restart:
        deadline = opts.gate_timeout_s or host.gate.deadline_s
        steps += [
            f"restart {host.unit}",
            f"gate: {host.gate.consecutive_passes} consecutive parity passes within {deadline:g}s, else roll back to {snap.current or 'nothing'}",
        ]
    if comparing:
        steps.append("comparison: the same workload against the new release, judged against the baseline")
    steps.append(
        f"unlock, record; cleanup, after a failure too: keep the {host.keep_releases} newest releases (keep_releases), "
        "current, last good and this one"
    )
    return steps


def make_plan(
    host: HostConfig,
    manifest: Manifest,
    snap: HostSnapshot,
    opts: DeployOptions,
    history: Sequence[HistoryRecord] = (),
) -> Plan:
    """What a deploy would do on this host, or why it refuses. ``history``: the host's history records (needed
    only when ``manifest`` is current, to tell whether it is up to date). No I/O."""
    refused = refusal(host, manifest, snap, opts)
    link_dest = Layout(host.root).release(snap.current) if snap.current and snap.current in snap.releases else None
    return Plan(
        host=host.name,
        release=manifest.id,
        previous=snap.current,
        steps=tuple(_steps(host, manifest, snap, opts, link_dest)),
        notes=tuple(_notes(host, manifest, snap, history)),
        refusal=refused,
        up_to_date=refused is None and not opts.force and redeploy_reason(manifest.id, snap, history) is None,
        link_dest=link_dest,
        probe=() if opts.no_restart else tuple(plan_lines(host)),
        comparison=tuple(comparison_plan(host, snap, no_restart=opts.no_restart)),
    )
