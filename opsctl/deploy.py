"""The deploy pipeline of docs/pipeline.md for one host: plan (pure) -> execute (SSH), plus rollback, restart,
adopt and the gate loop.

Every remote command is a list (shlex.join'ed by the SSH layer) or a string built with shlex.quote. Progress goes
to a ``Reporter`` (the CLI's rich one, or a recording one in tests); the result is a ``DeployResult``.
"""

from __future__ import annotations

import contextlib
import functools
import shlex
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Protocol, TypeVar

from . import captures
from . import hoststate as hs
from . import unit as unitmod
from .errors import CommandFailed, CommandTimeout, DeployFailed, GateFailed, LockHeld, OpsError, SshError
from .gate import GateState, LineVerdict, Verdict, judge
from .hoststate import HostSnapshot, Layout, LockOwner
from .inventory import HostConfig
from .journal import Follower, Mark, mark_command, parse_mark
from .parity import ParityLine
from .release import Manifest, make_manifest, stage

T = TypeVar("T")

PRE_RESTART_PARITY_STEPS = 3
PARITY_TIMEOUT_S = 600.0
BUILD_EXIT_NO_CUDA = 3
PARITY_EXIT_FAIL = 3
EXT_SUBDIR = "kernel/build"


# ------------------------------------------------------------------------------------------------ reporting


class Reporter(Protocol):
    def step(self, name: str, detail: str = "") -> None: ...
    def done(self, name: str, detail: str = "") -> None: ...
    def failed(self, name: str, detail: str = "") -> None: ...
    def info(self, message: str) -> None: ...
    def parity(self, line: ParityLine, verdict: str) -> None: ...


class NullReporter:
    def step(self, name: str, detail: str = "") -> None: ...
    def done(self, name: str, detail: str = "") -> None: ...
    def failed(self, name: str, detail: str = "") -> None: ...
    def info(self, message: str) -> None: ...
    def parity(self, line: ParityLine, verdict: str) -> None: ...


@dataclass
class StepTimer:
    """Wall time per step (for the progress display and the measurements in the issue note)."""

    times: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def timed(self, reporter: Reporter, name: str, detail: str = "") -> Iterator[dict[str, str]]:
        note: dict[str, str] = {}
        reporter.step(name, detail)
        t = time.monotonic()
        try:
            yield note
        except BaseException as e:
            self.times[name] = self.times.get(name, 0.0) + time.monotonic() - t
            reporter.failed(name, note.get("detail") or _short(e))
            raise
        self.times[name] = self.times.get(name, 0.0) + time.monotonic() - t
        reporter.done(name, note.get("detail", ""))


def _short(e: BaseException) -> str:
    if isinstance(e, OpsError):
        return e.message
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    return f"{type(e).__name__}: {e}"


# ------------------------------------------------------------------------------------------------ results


@dataclass
class DeployResult:
    host: str
    action: str
    release: str | None  # the release that was deployed / restarted / rolled back to
    verdict: str  # PASS, FAIL, NODATA, INCONCLUSIVE, ERROR, UP-TO-DATE, STAGED, PLANNED, ROLLED-BACK, ...
    reason: str = ""
    current_after: str | None = None
    rolled_back_to: str | None = None
    rollback_verdict: str | None = None
    gate: dict[str, Any] | None = None
    step_times: dict[str, float] = field(default_factory=dict)
    bytes_sent: int | None = None
    elapsed_s: float = 0.0
    plan: Plan | None = None

    @property
    def ok(self) -> bool:
        return self.verdict in ("PASS", "UP-TO-DATE", "STAGED", "PLANNED", "ADOPTED", "DONE")

    def line(self) -> str:
        """The one-line verdict."""
        s = f"{self.host}: {self.action} {self.release or '-'} -> {self.verdict}"
        if self.reason:
            s += f" ({self.reason})"
        if self.rolled_back_to:
            s += f"; rolled back to {self.rolled_back_to}: {self.rollback_verdict}"
        return s + f" [{self.elapsed_s:.1f}s]"


# ------------------------------------------------------------------------------------------------ plan (pure)


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

    def describe(self) -> list[str]:
        head = f"deploy {self.release} to {self.host} (current: {self.previous or 'none'})"
        return [head, *(f"  {i}. {s}" for i, s in enumerate(self.steps, 1)), *(f"  note: {n}" for n in self.notes)]


def make_plan(host: HostConfig, manifest: Manifest, snap: HostSnapshot, opts: DeployOptions) -> Plan:
    """What a deploy would do on this host, or why it refuses. No I/O."""
    notes: list[str] = []
    layout = Layout(host.root)
    refusal = None
    if not snap.is_managed and not snap.is_virgin:
        found = []
        if snap.unit.exists:
            found.append(f"unit {host.unit} ({snap.unit.fragment_path or snap.unit.load_state})")
        if snap.root_exists:
            found.append(f"directory {host.root}")
        refusal = (
            f"{host.name} has an install opsctl does not manage ({', '.join(found)}). Record it first with "
            f"`opsctl adopt {host.name}` (it becomes release zero, the rollback target)."
        )
    elif snap.lock_present and not snap.lock_stale:
        refusal = f"{host.name}: the deploy lock is held by {hs.describe_owner(snap.lock_owner)}"
    elif snap.free_mb is not None and snap.free_mb < host.min_free_disk_mb:
        refusal = f"{host.name}: only {snap.free_mb} MB free under {host.root} (need {host.min_free_disk_mb} MB)"
    elif host.gpu_arch is not None and host.gpu_arch not in snap.gpu_compute_caps:
        seen = ", ".join(snap.gpu_compute_caps) or "no GPU visible to nvidia-smi"
        refusal = f"{host.name}: inventory says gpu_arch {host.gpu_arch} but the host reports {seen}"
    elif manifest.id in snap.bad and not opts.force:
        why = snap.bad_reasons.get(manifest.id) or "a failed gate"
        refusal = f"{host.name}: release {manifest.id} is marked bad there ({why}); use --force to deploy it anyway"
    up_to_date = refusal is None and manifest.id == snap.current and not opts.force
    if snap.unit.drop_in_paths:
        notes.append(f"drop-ins override parts of the unit: {snap.unit.drop_in_paths}")
    if snap.is_virgin:
        notes.append(f"virgin host (no unit, no {host.root}): first deploy creates both")
    if manifest.dirty:
        notes.append("the working tree has uncommitted changes (recorded in the manifest)")
    link_dest = layout.release(snap.current) if snap.current and snap.current in snap.releases else None
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
    steps += [
        f"switch {layout.current} -> releases/{manifest.id}",
        f"install {unitmod.unit_path(host)} (daemon-reload if changed)",
    ]
    if not opts.no_restart:
        deadline = opts.gate_timeout_s or host.gate.deadline_s
        steps += [
            f"restart {host.unit}",
            f"gate: {host.gate.consecutive_passes} consecutive parity passes within {deadline:g}s, else roll back to {snap.current or 'nothing'}",
        ]
    steps.append(f"unlock, record, keep {host.keep_releases} releases")
    return Plan(
        host=host.name,
        release=manifest.id,
        previous=snap.current,
        steps=tuple(steps),
        notes=tuple(notes),
        refusal=refusal,
        up_to_date=up_to_date,
        link_dest=link_dest,
    )


def rollback_target(snap: HostSnapshot, to: str | None, force: bool, history: list[dict[str, Any]]) -> str:
    """Where `opsctl rollback` goes: --to ID, else the newest good release other than current. Pure."""
    if to is not None:
        hs.check_id(to)
        if to not in snap.releases:
            raise DeployFailed(f"release {to} is not on the host (have: {', '.join(sorted(snap.releases)) or 'none'})")
        if to in snap.bad and not force:
            raise DeployFailed(f"release {to} is marked bad; use --force to roll back to it anyway")
        if to == snap.current:
            raise DeployFailed(f"release {to} is already current")
        return to
    passed = [r["release"] for r in history if r.get("verdict") == "PASS" or r.get("event") == "adopt"]
    candidates = [r for r in reversed(passed) if r != snap.current and r in snap.releases and r not in snap.bad]
    if (
        snap.last_good
        and snap.last_good != snap.current
        and snap.last_good in snap.releases
        and snap.last_good not in snap.bad
    ):
        candidates.insert(0, snap.last_good)
    if not candidates:
        raise DeployFailed(
            "nothing to roll back to: no other release on the host has passed a gate"
            + (f" (current is {snap.current})" if snap.current else " (no release deployed yet)")
        )
    return candidates[0]


# ------------------------------------------------------------------------------------------------ sessions


Connect = Callable[[HostConfig], contextlib.AbstractContextManager[Any]]


def default_connect(host: HostConfig) -> contextlib.AbstractContextManager[Any]:
    from .ssh import connect

    return connect(host)


class Session:
    """One SSH connection that is re-opened after a drop (the gate keeps going across reconnects)."""

    def __init__(self, host: HostConfig, connect: Connect = default_connect) -> None:
        self.host = host
        self._connect = connect
        self._stack: contextlib.ExitStack | None = None
        self._remote: Any = None

    @property
    def r(self) -> Any:
        if self._remote is not None and not getattr(self._remote, "is_active", True):
            self.drop()  # the connection died since the last command: open a new one instead of failing on it
        if self._remote is None:
            stack = contextlib.ExitStack()
            self._remote = stack.enter_context(self._connect(self.host))
            self._stack = stack
        return self._remote

    def call(self, fn: Callable[[Any], T]) -> T:
        """``fn(remote)``, reconnecting and retrying after an SSH drop (up to the host's gate.ssh_retries, with
        backoff). For short idempotent bookkeeping after a decision, so a drop cannot leave the host half-recorded
        and locked; a command that ran and failed (CommandFailed, CommandTimeout) is not retried."""
        delay = 0.5
        for attempt in range(self.host.gate.ssh_retries + 1):
            try:
                return fn(self.r)
            except (CommandFailed, CommandTimeout):
                raise
            except SshError:
                if attempt >= self.host.gate.ssh_retries:
                    raise
                self.drop()
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
        raise AssertionError("unreachable")

    def drop(self) -> None:
        stack, self._stack, self._remote = self._stack, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                stack.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.drop()


# ------------------------------------------------------------------------------------------------ signals, lock lease


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, handled like Ctrl-C: the deploy restores a consistent host before it ends."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
_ALL_STOP_SIGNALS = (signal.SIGINT, *_STOP_SIGNALS)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


F = TypeVar("F", bound=Callable[..., Any])


def interruptible(fn: F) -> F:
    """Run ``fn`` with SIGTERM and SIGHUP raising ``Interrupted`` (as SIGINT raises KeyboardInterrupt), so a
    service manager's stop or a closed terminal restores the host like Ctrl-C does. Only the main thread can
    install handlers; elsewhere (a fleet's worker threads) the process's own handling applies."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _in_main_thread():
            return fn(*args, **kwargs)

        def handler(signum: int, _frame: FrameType | None) -> None:
            raise Interrupted(signal.Signals(signum).name)

        old = {sig: signal.signal(sig, handler) for sig in _STOP_SIGNALS}
        try:
            return fn(*args, **kwargs)
        finally:
            for sig, previous in old.items():
                signal.signal(sig, previous)

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def signals_held(rep: Reporter) -> Iterator[None]:
    """While restoring a host, a second Ctrl-C/SIGTERM/SIGHUP must not abandon it half-way: they are noted, not
    acted on. (Handlers rather than a signal mask: Python runs handlers in the main thread whichever thread the
    kernel delivers to, so a mask on one thread would not hold them.)"""
    if not _in_main_thread():
        yield
        return

    def note(signum: int, _frame: FrameType | None) -> None:
        rep.info(f"{signal.Signals(signum).name} received: still restoring the host, it ends when that is done")

    old = {sig: signal.signal(sig, note) for sig in _ALL_STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, previous in old.items():
            signal.signal(sig, previous)


class LeaseKeeper:
    """Renews the deploy lock's lease every third of it, from a thread with its own SSH connection, while this
    process holds the lock: a long build or gate keeps it, and a killed or cut-off run loses it after the lease
    (another run may then take it over, with a warning naming this one)."""

    def __init__(self, host: HostConfig, owner: LockOwner, connect: Connect, lease_s: float = hs.LOCK_LEASE_S) -> None:
        self.layout = Layout(host.root)
        self.owner = owner
        self.lease_s = lease_s
        self._session = Session(host, connect)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{host.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                hs.renew_lock(self._session.r, self.layout, self.owner, self.lease_s)
            except Exception:  # an SSH drop: the next round reconnects; the lease covers two missed rounds
                self._session.drop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._session.drop()


def _take_lock(session: Session, host: HostConfig, owner: LockOwner, rep: Reporter) -> str:
    """Acquire (retried across SSH drops: a retry after a lost reply finds its own token). Returns the step's
    detail; taking over an expired or pre-reboot lock is announced with the old owner's name."""
    taken = session.call(lambda r: hs.acquire_lock(r, Layout(host.root), owner, host.name))
    lease = f"lease {hs.LOCK_LEASE_S:g}s, renewed while this run lives"
    if taken:
        rep.info(f"warning: {host.name}: took over the deploy lock of {taken}")
        return f"took over the lock of {taken}; {lease}"
    return lease


# ------------------------------------------------------------------------------------------------ gate loop


def _mark(r: Any, host: HostConfig) -> Mark:
    return parse_mark(r.run(mark_command(host.unit), timeout=60).stdout)


def restart_unit(r: Any, host: HostConfig) -> Mark:
    """Record the journal position + old invocation, hand the next invocation a fresh parity token, restart, and
    read the restart counter baseline.

    A unit that hit its start limit (a crash loop) is reset first, else systemd refuses the restart. A start job
    that fails is not an exception here: the gate sees the failed unit and decides. A unit that does not read the
    token file (an adopted, hand-made unit) cannot carry the token: its lines are then judged without it (the
    Mark's token is None), everything else as strictly."""
    m = _mark(r, host)
    layout = Layout(host.root)
    token = hs.new_parity_token()
    hs.write_parity_token(r, layout, token)
    u = shlex.quote(host.unit + ".service")
    out = r.run(
        f"systemctl reset-failed {u} 2>/dev/null; systemctl restart {u}; echo \"rc=$?\"; "
        f"echo \"restarts=$(systemctl show -p NRestarts --value {u})\"; "
        f"echo \"envfiles=$(systemctl show -p EnvironmentFiles --value {u})\"",
        timeout=host.service.start_timeout_s + 60,
    ).stdout
    facts = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
    restarts = facts.get("restarts", "").strip()
    carries_token = layout.parity_env in facts.get("envfiles", "")
    return Mark(
        old_invocation=m.old_invocation,
        cursor=m.cursor,
        n_restarts=int(restarts) if restarts.isdigit() else 0,
        token=token if carries_token else None,
    )


def feed_line(state: GateState, message: str, now: float, reporter: Reporter) -> LineVerdict | None:
    """One journal message into the gate, reported: parity lines with their verdict; a line that is not evidence
    (wrong or missing token, or the marker inside another message) once, with the reason, never counted."""
    j = judge(state, message, now)
    if j is None:
        return None
    if j.line is None or j.verdict is LineVerdict.IGNORED:
        where = f"parity line {j.line.where}" if j.line is not None else "line"
        reporter.info(f"ignored {where}: {j.reason}: {j.raw.strip()[:160]}")
    else:
        reporter.parity(j.line, str(j.verdict))
    return j.verdict


def run_gate(
    session: Session,
    host: HostConfig,
    mark: Mark,
    reporter: Reporter,
    *,
    deadline_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> GateState:
    """Poll the unit and its new invocation's journal until the gate decides."""
    settings = host.gate
    state = GateState(
        settings=settings,
        started_at=clock(),
        deadline_s=deadline_s or settings.deadline_s,
        baseline_restarts=mark.n_restarts,
        expected_ranks=host.service.tp,
        token=mark.token,
    )
    follower = Follower(unit=host.unit, mark=mark)
    if mark.token is None:
        reporter.info(
            f"the unit does not read {Layout(host.root).parity_env} (a unit opsctl did not render): its parity lines "
            "are judged without a token"
        )
    while True:
        now = clock()
        try:
            res = session.r.run(follower.poll_command(), timeout=max(30.0, settings.poll_interval_s * 4), check=False)
            if res.rc != 0 and "--- opsctl journal ---" not in res.stdout:
                raise DeployFailed(f"journal poll exited {res.rc}: {res.stderr.strip()[-300:]}")
            obs, entries = follower.ingest(res.stdout)
            for entry in entries:
                feed_line(state, entry.message, clock(), reporter)
            state.observe_unit(obs, clock())
        except SshError as e:
            session.drop()
            state.ssh_failed(e.message, now)
            reporter.info(f"SSH trouble during the gate ({e.message}); retrying from the journal cursor")
        state.tick(clock())
        if state.decided:
            break
        # After SSH errors back off (1, 2, 4 .. x the poll interval, at most 15 s) so a short outage is ridden out.
        backoff = 2 ** (state.ssh_failures_in_a_row - 1) if state.ssh_failures_in_a_row else 1
        sleep(min(settings.poll_interval_s * backoff, max(15.0, settings.poll_interval_s)))
    with contextlib.suppress(Exception):
        cursor_doc = (
            f'{{"unit": "{host.unit}", "cursor": "{follower.cursor or ""}", "invocations": {follower.invocations!r}}}\n'
        )
        session.r.write_file(f"{Layout(host.root).cursors}/gate.json", cursor_doc.replace("'", '"').encode())
    return state


# ------------------------------------------------------------------------------------------------ executor


def _read_unit_text(r: Any, host: HostConfig) -> str | None:
    res = r.run(f"cat {shlex.quote(unitmod.unit_path(host))} 2>/dev/null", timeout=60, check=False)
    return res.stdout if res.rc == 0 else None


def _install_unit_for(r: Any, host: HostConfig, layout: Layout, release: str) -> bool:
    """Install the unit stored with a release (rendered at its deploy, or the hand-made one for release zero)."""
    text = r.read_file(f"{layout.release(release)}/unit.service").decode()
    changed = unitmod.install(r, host, text, _read_unit_text(r, host))
    u = shlex.quote(host.unit + ".service")
    # `systemctl enable` reloads the manager even when nothing changes: only when not enabled yet.
    r.run(f"systemctl is-enabled --quiet {u} || systemctl enable --quiet {u}", timeout=60, check=False)
    return changed


def _build(r: Any, host: HostConfig, layout: Layout, release: str, note: dict[str, str]) -> None:
    rel = layout.release(release)
    cmd = [
        host.service.python,
        f"{rel}/deploy/build_extension.py",
        "--out",
        f"{rel}/{EXT_SUBDIR}",
        "--log",
        f"{rel}/build.log",
        "--timeout",
        f"{host.build_timeout_s:g}",
    ]
    cmd[2:2] = ["--arch", host.gpu_arch or "0.0"]
    res = r.run(cmd, timeout=host.build_timeout_s + 120, check=False)
    if res.rc == 0:
        note["detail"] = f"built for sm_{(host.gpu_arch or '').replace('.', '')}, log {rel}/build.log"
        return
    tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
    if res.rc == BUILD_EXIT_NO_CUDA and host.gpu_arch is None:
        note["detail"] = "no CUDA on this host: the release runs the reference path"
        return
    raise DeployFailed(f"extension build failed (exit {res.rc}; log {rel}/build.log): {' | '.join(tail)}")


def _prerestart_parity(
    r: Any, host: HostConfig, layout: Layout, release: str, note: dict[str, str], reporter: Reporter
) -> GateState:
    """Replay a few verify steps with the new release on the host (its GPU, when it has one) and judge the lines
    with the gate's own rules and a token of this run: a failing or malformed line fails it, passing lines
    (or inconclusive ones: the restart's gate is the stricter check) let the deploy go on."""
    rel = layout.release(release)
    # The host's own captured traffic first (when any is stored): real trees, prefixes and magnitudes.
    captured = _replay_captures(r, host, rel, reporter)
    token = hs.new_parity_token()
    env = (
        f"PYTHONPATH={shlex.quote(f'{rel}/kernel:{rel}/backend')} KDTREE_CONFIG={shlex.quote(f'{rel}/deploy/kdtree.json')} "
        f"PYTHONUNBUFFERED=1 {hs.PARITY_TOKEN_VAR}={token}"
    )
    argv = [
        host.service.python,
        "-m",
        "kdtree_backend.replay",
        "--steps",
        str(PRE_RESTART_PARITY_STEPS),
        "--interval",
        "0",
        "--threshold",
        f"{host.gate.fail_rel:g}",
    ]
    res = r.run(f"cd {shlex.quote(rel)} && env {env} {shlex.join(argv)}", timeout=PARITY_TIMEOUT_S, check=False)
    state = GateState.every_line(host.gate, expected_ranks=1, token=token, deadline_s=PARITY_TIMEOUT_S)
    for message in res.stdout.splitlines():
        feed_line(state, message, 0.0, reporter)
    state.conclude(0.0)
    worst = state.worst.rel if state.worst is not None else None
    if state.verdict is Verdict.FAIL or (res.rc == PARITY_EXIT_FAIL and state.lines):
        raise GateFailed(f"pre-restart parity {state.reason or f'worst rel {worst:.4g}'}")
    if res.rc == 0 and state.lines:
        note["detail"] = f"{state.lines} parity lines, worst rel {worst:.3g}; {captured}"
        return state
    tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
    raise DeployFailed(f"pre-restart parity could not run (exit {res.rc}, {state.lines} parity lines): {tail}")


class _ParityRecorder:
    """Passes everything on to the reporter and keeps the parity lines with their verdicts."""

    def __init__(self, inner: Reporter) -> None:
        self.inner = inner
        self.lines: list[tuple[ParityLine, str]] = []

    def step(self, name: str, detail: str = "") -> None:
        self.inner.step(name, detail)

    def done(self, name: str, detail: str = "") -> None:
        self.inner.done(name, detail)

    def failed(self, name: str, detail: str = "") -> None:
        self.inner.failed(name, detail)

    def info(self, message: str) -> None:
        self.inner.info(message)

    def parity(self, line: ParityLine, verdict: str) -> None:
        self.lines.append((line, verdict))
        self.inner.parity(line, verdict)


def prerestart_fail_reason(lines: list[tuple[ParityLine, str]], fail_rel: float, most: int = 4) -> str:
    """``pre-restart parity L0 rel=1.12 L30 rel=1.08 ... >= 0.05 ...``: the failing layers (worst line of each, in
    layer order), like the gate's reason. Empty when no line failed. Pure."""

    def badness(line: ParityLine) -> float:
        return line.rel if line.rel == line.rel else float("inf")  # NaN is the worst

    worst: dict[tuple[int, int | None], ParityLine] = {}
    for line, verdict in lines:
        key = (line.layer, line.rank)
        if verdict == "FAIL" and (key not in worst or badness(line) > badness(worst[key])):
            worst[key] = line
    if not worst:
        return ""
    ranks = {rank for _, rank in worst}
    parts = [
        f"L{layer}" + (f" TP{rank}" if len(ranks) > 1 else "") + f" rel={worst[(layer, rank)].rel:.3g}"
        for layer, rank in sorted(worst, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
    ]
    more = f" and {len(parts) - most} more" if len(parts) > most else ""
    # Lines of the capture replay carry capture=<id>/<call>: say the failure was on the host's own traffic.
    what = "capture replay" if all("capture" in w.extra for w in worst.values()) else "parity"
    return (
        f"pre-restart {what} {' '.join(parts[:most])}{more} >= fail threshold {fail_rel:g}; "
        "nothing switched or restarted"
    )


def _replay_captures(r: Any, host: HostConfig, release_dir: str, reporter: Reporter) -> str:
    """Replay the verify calls captured on this host from its real traffic (``opsctl capture``; docs/capture.md)
    with the new release, judged by the gate's parser and rules (every line, every capturing rank). A failing or
    damaged one stops the deploy before the switch, as the synthetic check does. Returns the step's detail."""
    token = hs.new_parity_token()
    t = time.monotonic()
    res = r.run(captures.replay_command(host, release_dir, token), timeout=captures.REPLAY_TIMEOUT_S, check=False)
    j = captures.judge_replay(res.stdout, res.rc, host, token, res.stderr)
    for judgement in j.judgements:
        if judgement.line is not None and judgement.verdict is not LineVerdict.IGNORED:
            reporter.parity(judgement.line, str(judgement.verdict))
        else:
            reporter.info(f"ignored capture replay line: {judgement.reason}: {judgement.raw.strip()[:160]}")
    took = time.monotonic() - t
    if j.verdict is Verdict.FAIL:
        raise GateFailed(f"pre-restart capture replay {j.reason}")
    if j.verdict is Verdict.ERROR:
        raise DeployFailed(f"pre-restart {j.reason}")
    if j.verdict is Verdict.NODATA:
        return f"captures: {j.reason}"
    worst = j.state.worst.rel if j.state.worst is not None else float("nan")
    return f"captures: {j.calls} stored calls replayed in {took:.1f}s, worst rel {worst:.3g}"


def _cleanup(r: Any, host: HostConfig, layout: Layout, keep_also: list[str | None]) -> list[str]:
    snap = hs.read_snapshot(r, host.root, host.unit)
    doomed = hs.select_for_removal(snap.releases, host.keep_releases, [snap.current, snap.last_good, *keep_also])
    hs.remove_releases(r, layout, doomed)
    return doomed


def _manifest_for(src: Path) -> Manifest:
    return make_manifest(src)


@interruptible
def deploy(
    host: HostConfig,
    src: Path,
    opts: DeployOptions,
    reporter: Reporter | None = None,
    *,
    connect: Connect = default_connect,
    command: str = "deploy",
) -> DeployResult:
    rep = reporter or NullReporter()
    t0 = time.monotonic()
    timer = StepTimer()
    layout = Layout(host.root)
    manifest = _manifest_for(src)
    result = DeployResult(host=host.name, action="deploy", release=manifest.id, verdict="ERROR", step_times=timer.times)

    def finish(verdict: str, reason: str = "") -> DeployResult:
        result.verdict, result.reason = verdict, reason
        result.elapsed_s = time.monotonic() - t0
        return result

    with Session(host, connect) as session:
        with timer.timed(rep, "preflight", f"{host.name} ({host.target})") as note:
            snap = hs.read_snapshot(session.r, host.root, host.unit)
            plan = make_plan(host, manifest, snap, opts)
            result.plan = plan
            note["detail"] = f"current {snap.current or 'none'}, unit {snap.unit.active_state}, {snap.free_mb} MB free"
        result.current_after = snap.current
        if snap.lock_present and not snap.lock_stale and not opts.dry_run:
            raise LockHeld(
                f"{host.name}: the deploy lock is held by {hs.describe_owner(snap.lock_owner)}. Wait for it, or if "
                f"that run is gone: opsctl lock {host.name} release --force"
            )
        if plan.refusal:
            if opts.dry_run:
                return finish("REFUSED", plan.refusal)
            raise DeployFailed(plan.refusal)
        if plan.up_to_date:
            return finish(
                "UP-TO-DATE",
                f"{manifest.id} is already current; `opsctl restart {host.name}` restarts and gates it, --force redeploys",
            )

        if opts.dry_run:
            return finish("PLANNED", "dry run: nothing changed")

        owner = LockOwner.mine(f"{command} {manifest.id}")
        switched = restarted = locked = gated = False
        lease: LeaseKeeper | None = None
        try:
            with timer.timed(rep, "lock") as note:
                # Inside the try: a reply lost after the remote mkdir still ends in the release below.
                note["detail"] = _take_lock(session, host, owner, rep)
                locked = True
                lease = LeaseKeeper(host, owner, connect)
            hs.ensure_layout(session.r, layout, adopted=False)
            hs.append_history(
                session.r,
                layout,
                {
                    "event": "deploy-start",
                    "release": manifest.id,
                    "previous": snap.current,
                    "by": f"{owner.user}@{owner.client}",
                    "commit": manifest.commit,
                    "dirty": manifest.dirty,
                },
            )
            with tempfile.TemporaryDirectory(prefix="opsctl-bundle-") as tmp:
                staged = stage(src, manifest, Path(tmp) / manifest.id)
                with timer.timed(rep, "upload", layout.release(manifest.id)) as note:
                    stats = session.r.rsync(staged, layout.release(manifest.id), link_dest=plan.link_dest, timeout=1800)
                    result.bytes_sent = stats.bytes_sent
                    note["detail"] = f"{stats.files_transferred} files, {stats.bytes_sent} bytes sent"
            with timer.timed(rep, "verify") as note:
                rel = shlex.quote(layout.release(manifest.id))
                session.r.run(f"cd {rel} && sha256sum --quiet --strict -c -", stdin=manifest.checklist(), timeout=300)
                remote = Manifest.from_json(session.r.read_file(f"{layout.release(manifest.id)}/manifest.json"))
                if remote.id != manifest.id:
                    raise DeployFailed(f"manifest on the host names {remote.id}, expected {manifest.id}")
                note["detail"] = f"{len(manifest.files)} files match"
            with timer.timed(rep, "build") as note:
                _build(session.r, host, layout, manifest.id, note)
            if not opts.skip_prerestart_parity:
                seen = _ParityRecorder(rep)
                try:
                    with timer.timed(rep, "parity") as note:
                        try:
                            _prerestart_parity(session.r, host, layout, manifest.id, note, seen)
                        except GateFailed as e:
                            note["detail"] = "FAIL: " + (
                                prerestart_fail_reason(seen.lines, host.gate.fail_rel) or e.message
                            )
                            raise
                except GateFailed as e:
                    # Reported like the gate: the lines (above), verdict FAIL, the failing layers in the reason.
                    reason = prerestart_fail_reason(seen.lines, host.gate.fail_rel) or e.message
                    hs.mark_bad(session.r, layout, manifest.id, reason)
                    hs.append_history(
                        session.r,
                        layout,
                        {
                            "event": "deploy",
                            "release": manifest.id,
                            "verdict": "FAIL",
                            "reason": reason,
                            "stage": "pre-restart parity",
                        },
                    )
                    return finish("FAIL", reason)
            session.r.write_file(
                f"{layout.release(manifest.id)}/unit.service", unitmod.render_from_tree(src, host).encode()
            )
            with timer.timed(rep, "switch", f"current -> {manifest.id}"):
                hs.switch_current(session.r, layout, manifest.id)
                switched = True
                result.current_after = manifest.id
            with timer.timed(rep, "unit") as note:
                changed = _install_unit_for(session.r, host, layout, manifest.id)
                note["detail"] = "changed, daemon-reload" if changed else "unchanged"
            if opts.no_restart:
                hs.append_history(
                    session.r,
                    layout,
                    {"event": "deploy", "release": manifest.id, "verdict": "STAGED", "reason": "--no-restart"},
                )
                return finish(
                    "STAGED",
                    f"current switched; the running service picks it up at the next `opsctl restart {host.name}`",
                )
            with timer.timed(rep, "restart") as note:
                restarted = True  # from here the new release may be running, whatever the reply says
                mark = restart_unit(session.r, host)
            with timer.timed(rep, "gate") as note:
                gate = run_gate(session, host, mark, rep, deadline_s=opts.gate_timeout_s)
                note["detail"] = f"{gate.verdict}: {gate.reason}"
                result.gate = gate.summary()
            # The gate decided: a later failure is the bookkeeping's (after a PASS) or the restore's own (which says
            # where the host stands), not a reason to restore again.
            gated = True
            if gate.verdict is Verdict.PASS:
                session.call(lambda r: hs.set_last_good(r, layout, manifest.id))
                session.call(
                    lambda r: hs.append_history(
                        r,
                        layout,
                        {
                            "event": "deploy",
                            "release": manifest.id,
                            "previous": snap.current,
                            "verdict": "PASS",
                            "gate": gate.summary(),
                        },
                    )
                )
                with timer.timed(rep, "cleanup") as note:
                    removed = session.call(lambda r: _cleanup(r, host, layout, [manifest.id, snap.current]))
                    note["detail"] = f"removed {', '.join(removed)}" if removed else "nothing to remove"
                return finish("PASS", gate.reason)
            if gate.verdict is Verdict.ERROR:
                # Could not look: never a pass. Go back to the old release (and gate it) once the host answers.
                _restore_after_cut(
                    session, host, layout, snap, manifest.id, opts, rep, timer, result,
                    restarted=True, verdict="ERROR", reason=f"gate ERROR: {gate.reason}", gate=gate.summary(),
                )
                return finish("ERROR", gate.reason)
            # Gate said no: the new release is bad; go back.
            _restore_after_cut(
                session, host, layout, snap, manifest.id, opts, rep, timer, result,
                restarted=True, verdict=str(gate.verdict), reason=f"gate {gate.verdict}: {gate.reason}",
                gate=gate.summary(),
            )
            return finish(str(gate.verdict), gate.reason)
        except KeyboardInterrupt as e:
            if not locked:
                raise
            with signals_held(rep):
                rep.info(f"{_interruption(e)}: restoring a consistent state; further signals wait until it is done")
                session.drop()  # the signal may have cut a command mid-reply: talk over a fresh connection
                try:
                    _restore_after_cut(
                        session, host, layout, snap, manifest.id, opts, rep, timer, result,
                        restarted=restarted, switched=switched, verdict="INTERRUPTED", reason=_interruption(e),
                        bad=False,
                    )
                except OpsError as failed:
                    rep.info(f"restoring failed: {failed.message}")
            raise
        except OpsError as e:
            if not locked:
                raise
            if restarted and not gated:
                # The restart or the gate broke off (SSH drop, timeout): the new release may be running unverified
                # while nothing vouches for it. Never leave it so: back to the old release, restarted and gated.
                session.drop()
                _restore_after_cut(
                    session, host, layout, snap, manifest.id, opts, rep, timer, result,
                    restarted=True, verdict="ERROR", reason=f"restart/gate broke off: {e.message}",
                )
                return finish("ERROR", f"{e.message}; the previous release was restored")
            with contextlib.suppress(Exception):
                if switched and snap.current:
                    hs.switch_current(session.r, layout, snap.current)  # unit never restarted: switch back quietly
                    _install_unit_for(session.r, host, layout, snap.current)
                    result.current_after = snap.current
                hs.append_history(
                    session.r,
                    layout,
                    {"event": "deploy", "release": manifest.id, "verdict": "ERROR", "reason": e.message},
                )
            raise
        finally:
            if lease is not None:
                lease.stop()
            with signals_held(rep), contextlib.suppress(Exception):
                session.call(lambda r: hs.release_lock(r, layout, owner))


def _interruption(e: BaseException) -> str:
    return f"interrupted by {e.signal_name}" if isinstance(e, Interrupted) else "interrupted"


def _restore_after_cut(
    session: Session,
    host: HostConfig,
    layout: Layout,
    snap: HostSnapshot,
    failed: str,
    opts: DeployOptions,
    rep: Reporter,
    timer: StepTimer,
    result: DeployResult,
    *,
    restarted: bool,
    verdict: str,
    reason: str,
    switched: bool = True,
    bad: bool = True,
    gate: dict[str, Any] | None = None,
) -> None:
    """Bring the host back to exactly one release that is current and running after the deploy stopped half-way:
    before the restart, ``current`` quietly points back; after it (or when it may have happened), the old
    release is switched back, restarted and gated. The history says what happened; each remote step is retried
    across SSH drops. When the host stays unreachable, DeployFailed says where it stands."""
    try:
        if bad:
            session.call(lambda r: hs.mark_bad(r, layout, failed, reason))
        record: dict[str, Any] = {"event": "deploy", "release": failed, "verdict": verdict, "reason": reason}
        if gate is not None:
            record["gate"] = gate
        # Where `current` points once restored: back on the previous release, or (a first deploy, nothing to go
        # back to) still on the failed one with its unit stopped.
        current_after = snap.current if (snap.current or not switched) else failed
        session.call(
            lambda r: hs.append_history(r, layout, {**record, "previous": snap.current, "current": current_after})
        )
        if restarted:
            _rollback_after_failure(session, host, layout, snap, failed, opts, rep, timer, result)
        elif switched and snap.current:
            session.call(lambda r: hs.switch_current(r, layout, snap.current))  # type: ignore[arg-type]
            session.call(lambda r: _install_unit_for(r, host, layout, snap.current))  # type: ignore[arg-type]
            result.current_after = snap.current
    except SshError as e:
        raise DeployFailed(
            f"{reason}, and restoring the previous release failed ({e.message}): release {failed} may be running NOT "
            f"verified. The deploy lock's lease expires by itself. When the host answers: opsctl status {host.name}, "
            f"then opsctl rollback {host.name} (or opsctl restart {host.name} to gate what runs)"
        ) from e


def _rollback_after_failure(
    session: Session,
    host: HostConfig,
    layout: Layout,
    snap: HostSnapshot,
    failed: str,
    opts: DeployOptions,
    rep: Reporter,
    timer: StepTimer,
    result: DeployResult,
) -> None:
    target = snap.current if snap.current and snap.current != failed and snap.current not in snap.bad else None
    if target is None:
        with timer.timed(rep, "rollback", "nothing to roll back to: stopping the unit"):
            session.r.run(["systemctl", "stop", host.unit + ".service"], timeout=300, check=False)
        result.rolled_back_to, result.rollback_verdict = None, "unit stopped"
        return
    with timer.timed(rep, "rollback", f"current -> {target}") as note:
        session.call(lambda r: hs.switch_current(r, layout, target))
        session.call(lambda r: _install_unit_for(r, host, layout, target))
        result.current_after = target
        mark = session.call(lambda r: restart_unit(r, host))
        note["detail"] = "restarted"
    with timer.timed(rep, "gate (rollback)") as note:
        # The release we go back to gets the host's full deadline, not a --gate-timeout meant for the new one.
        gate = run_gate(session, host, mark, rep, deadline_s=max(opts.gate_timeout_s or 0.0, host.gate.deadline_s))
        note["detail"] = f"{gate.verdict}: {gate.reason}"
    result.rolled_back_to, result.rollback_verdict = target, str(gate.verdict)
    record = {
        "event": "rollback",
        "release": target,
        "from": failed,
        "verdict": str(gate.verdict),
        "gate": gate.summary(),
        "automatic": True,
    }
    session.call(lambda r: hs.append_history(r, layout, record))
    if gate.verdict is Verdict.PASS:
        session.call(lambda r: hs.set_last_good(r, layout, target))


# ------------------------------------------------------------------------------------------------ restart / rollback


@contextlib.contextmanager
def _locked(session: Session, host: HostConfig, command: str, rep: Reporter, connect: Connect) -> Iterator[LockOwner]:
    """The deploy lock for a restart/rollback: taken inside the try (a lost reply cannot leak it), its lease
    renewed while held, released (if still ours) whatever happens, with further signals held meanwhile."""
    layout = Layout(host.root)
    owner = LockOwner.mine(command)
    lease: LeaseKeeper | None = None
    try:
        _take_lock(session, host, owner, rep)
        lease = LeaseKeeper(host, owner, connect)
        yield owner
    finally:
        if lease is not None:
            lease.stop()
        with signals_held(rep), contextlib.suppress(Exception):
            session.call(lambda r: hs.release_lock(r, layout, owner))


def _require_managed(snap: HostSnapshot, host: HostConfig) -> None:
    if not snap.is_managed:
        raise DeployFailed(
            f"{host.name} is not managed by opsctl yet: `opsctl deploy {host.name}` (virgin host) or `opsctl adopt {host.name}` first"
        )


@interruptible
def restart(
    host: HostConfig,
    reporter: Reporter | None = None,
    *,
    rollback_on_fail: bool = False,
    gate_timeout_s: float | None = None,
    connect: Connect = default_connect,
) -> DeployResult:
    """Restart the current release and gate it (e.g. after a driver update)."""
    rep = reporter or NullReporter()
    t0 = time.monotonic()
    timer = StepTimer()
    layout = Layout(host.root)
    with Session(host, connect) as session:
        with timer.timed(rep, "preflight"):
            snap = hs.read_snapshot(session.r, host.root, host.unit)
            _require_managed(snap, host)
            if not snap.current:
                raise DeployFailed(f"{host.name}: no current release to restart")
        result = DeployResult(
            host=host.name,
            action="restart",
            release=snap.current,
            verdict="ERROR",
            step_times=timer.times,
            current_after=snap.current,
        )
        with _locked(session, host, f"restart {snap.current}", rep, connect):
            with timer.timed(rep, "restart"):
                mark = restart_unit(session.r, host)
            with timer.timed(rep, "gate") as note:
                gate = run_gate(session, host, mark, rep, deadline_s=gate_timeout_s)
                note["detail"] = f"{gate.verdict}: {gate.reason}"
            result.gate = gate.summary()
            hs.append_history(
                session.r,
                layout,
                {"event": "restart", "release": snap.current, "verdict": str(gate.verdict), "gate": gate.summary()},
            )
            if gate.verdict is Verdict.PASS:
                hs.set_last_good(session.r, layout, snap.current)
            elif rollback_on_fail:
                hs.mark_bad(session.r, layout, snap.current, f"gate {gate.verdict} after restart: {gate.reason}")
                history = hs.read_history(session.r, layout)
                snap_after = hs.read_snapshot(session.r, host.root, host.unit)
                try:
                    target = rollback_target(snap_after, None, False, history)
                except DeployFailed as e:
                    rep.info(f"cannot roll back: {e.message}")
                else:
                    fake_snap = _with_current(snap_after, target)
                    _rollback_after_failure(
                        session,
                        host,
                        layout,
                        fake_snap,
                        snap.current,
                        DeployOptions(gate_timeout_s=gate_timeout_s),
                        rep,
                        timer,
                        result,
                    )
        result.verdict, result.reason = str(gate.verdict), gate.reason
        result.elapsed_s = time.monotonic() - t0
        return result


def _with_current(snap: HostSnapshot, current: str) -> HostSnapshot:
    from dataclasses import replace

    return replace(snap, current=current)


@interruptible
def rollback(
    host: HostConfig,
    reporter: Reporter | None = None,
    *,
    to: str | None = None,
    force: bool = False,
    gate: bool = True,
    gate_timeout_s: float | None = None,
    connect: Connect = default_connect,
) -> DeployResult:
    """Switch back to an earlier release (never a bad one unless forced), restart, gate."""
    rep = reporter or NullReporter()
    t0 = time.monotonic()
    timer = StepTimer()
    layout = Layout(host.root)
    with Session(host, connect) as session:
        with timer.timed(rep, "preflight") as note:
            snap = hs.read_snapshot(session.r, host.root, host.unit)
            _require_managed(snap, host)
            history = hs.read_history(session.r, layout)
            target = rollback_target(snap, to, force, history)
            note["detail"] = f"{snap.current or 'none'} -> {target}"
        result = DeployResult(
            host=host.name, action="rollback", release=target, verdict="ERROR", step_times=timer.times
        )
        with _locked(session, host, f"rollback {target}", rep, connect):
            with timer.timed(rep, "switch", f"current -> {target}"):
                hs.switch_current(session.r, layout, target)
                result.current_after = target
            with timer.timed(rep, "unit") as note:
                note["detail"] = (
                    "changed, daemon-reload" if _install_unit_for(session.r, host, layout, target) else "unchanged"
                )
            with timer.timed(rep, "restart"):
                mark = restart_unit(session.r, host)
            verdict, reason, summary = "DONE", "not gated (--no-gate)", None
            if gate:
                with timer.timed(rep, "gate") as note:
                    g = run_gate(session, host, mark, rep, deadline_s=gate_timeout_s)
                    note["detail"] = f"{g.verdict}: {g.reason}"
                verdict, reason, summary = str(g.verdict), g.reason, g.summary()
                if g.verdict is Verdict.PASS:
                    hs.set_last_good(session.r, layout, target)
            result.gate = summary
            hs.append_history(
                session.r,
                layout,
                {
                    "event": "rollback",
                    "release": target,
                    "from": snap.current,
                    "verdict": verdict,
                    "gate": summary,
                    "forced": force,
                },
            )
        result.verdict, result.reason = verdict, reason
        result.elapsed_s = time.monotonic() - t0
        return result


# ------------------------------------------------------------------------------------------------ adopt

ADOPT_COPY_LIMIT_MB = 2048


def adopt(host: HostConfig, reporter: Reporter | None = None, *, connect: Connect = default_connect) -> DeployResult:
    """Record a hand-made install (files under the root + the unit as it is) as release zero, touching nothing
    that runs: the unit is not restarted, the original files stay where they are (a copy goes into the release)."""
    import hashlib
    import json

    rep = reporter or NullReporter()
    t0 = time.monotonic()
    timer = StepTimer()
    layout = Layout(host.root)
    with Session(host, connect) as session:
        r = session.r
        with timer.timed(rep, "preflight") as note:
            snap = hs.read_snapshot(r, host.root, host.unit)
            if snap.is_managed:
                raise DeployFailed(f"{host.name} is already managed by opsctl (adopted or deployed); nothing to adopt")
            if snap.is_virgin:
                raise DeployFailed(
                    f"{host.name} has no unit {host.unit} and no {host.root}: nothing to adopt, deploy directly"
                )
            note["detail"] = (
                f"unit {snap.unit.load_state}/{snap.unit.active_state}, root {'exists' if snap.root_exists else 'absent'}"
            )
        with timer.timed(rep, "inventory files") as note:
            root_q = shlex.quote(host.root)
            listing = ""
            size_mb = 0
            if snap.root_exists:
                listing = r.run(
                    f"cd {root_q} && find . \\( -path ./releases -o -path ./state -o -path ./current \\) -prune -o -type f -print0 | sort -z | xargs -0 -r sha256sum",
                    timeout=1800,
                ).stdout
                du = r.run(
                    f"cd {root_q} && du -smc -- {' '.join(shlex.quote(e) for e in snap.other_root_entries) or '/dev/null'} | tail -n 1",
                    timeout=600,
                    check=False,
                ).stdout
                size_mb = int((du.split() or ["0"])[0]) if du.split() and du.split()[0].isdigit() else 0
            unit_text = r.read_file(snap.unit.fragment_path).decode() if snap.unit.fragment_path else ""
            files = {}
            for line in listing.splitlines():
                digest, _, path = line.partition("  ")
                files[path.removeprefix("./")] = {"sha256": digest}
            h = hashlib.sha256(json.dumps({"files": files, "unit": unit_text}, sort_keys=True).encode())
            rid = "r0-" + h.hexdigest()[:12]
            note["detail"] = (
                f"{len(files)} files ({size_mb} MB), unit {snap.unit.fragment_path or 'absent'} -> release {rid}"
            )
        hs.ensure_layout(r, layout, adopted=True)
        with _locked(session, host, f"adopt {rid}", rep, connect):
            with timer.timed(rep, "record", layout.release(rid)) as note:
                rel = layout.release(rid)
                r.run(["mkdir", "-p", f"{rel}/files"], timeout=60)
                if snap.other_root_entries and size_mb <= ADOPT_COPY_LIMIT_MB:
                    srcs = [f"{host.root}/{e}" for e in snap.other_root_entries]
                    r.run(["cp", "-a", "--", *srcs, f"{rel}/files/"], timeout=1800)
                    note["detail"] = f"copied {size_mb} MB"
                else:
                    note["detail"] = "recorded (files too large to copy)" if snap.other_root_entries else "unit only"
                if unit_text:
                    # 0600: a hand-edited unit may carry a token inline (it should move to the EnvironmentFile).
                    r.write_file(f"{rel}/unit.service", unit_text.encode(), mode=0o600)
                manifest = {
                    "format": 1,
                    "id": rid,
                    "adopted": True,
                    "created_at": hs.utc_now(),
                    "created_by": LockOwner.mine("adopt").user,
                    "root": host.root,
                    "files": files,
                    "copied": bool(snap.other_root_entries and size_mb <= ADOPT_COPY_LIMIT_MB),
                    "unit": {
                        "path": snap.unit.fragment_path,
                        "sha256": hashlib.sha256(unit_text.encode()).hexdigest(),
                        "drop_ins": snap.unit.drop_in_paths,
                        "active": snap.unit.active_state,
                    },
                }
                r.write_file(f"{rel}/manifest.json", (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
                hs.switch_current(r, layout, rid)
                hs.set_last_good(r, layout, rid)
                hs.append_history(
                    r,
                    layout,
                    {
                        "event": "adopt",
                        "release": rid,
                        "verdict": "ADOPTED",
                        "unit": snap.unit.fragment_path,
                        "files": len(files),
                    },
                )
    res = DeployResult(
        host=host.name,
        action="adopt",
        release=rid,
        verdict="ADOPTED",
        reason="recorded as release zero; nothing restarted",
        current_after=rid,
        step_times=timer.times,
    )
    res.elapsed_s = time.monotonic() - t0
    return res
