"""`opsctl schedule install|remove|status`: the opsctl-health timer on the machine that runs opsctl.

The unit files are rendered from the templates in ``systemd/`` (pure: ``render``), written atomically into the
systemd unit directory (``/etc/systemd/system`` as root, ``~/.config/systemd/user`` otherwise), then enabled
with ``systemctl [--user] enable --now opsctl-health.timer``. OnCalendar and RandomizedDelaySec come from the
inventory's ``health`` settings of the target hosts, which must agree (one timer checks them all).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import OpsError, UsageError
from ..hostdata.facts import parse_systemctl_show
from ..inventory import HostConfig
from ..inventory.loader import MAX_CALENDAR_CHARS
from ..terminal import escaped
from ..unit.systemctl import systemctl_argv
from .levels import FINDING_EXIT_CODES
from .localstate import state_dir, write_atomic

SERVICE = "opsctl-health.service"
TIMER = "opsctl-health.timer"
TEMPLATE_DIR = Path(__file__).resolve().parents[2] / "systemd"
UNIT_DIR_ENV = "OPSCTL_SYSTEMD_DIR"
# Characters that mean something to systemd's unit-file parser (quotes, escapes, specifiers, variables).
_UNIT_UNSAFE = set("\"\\%$\n\r'")


@dataclass(frozen=True)
class ScheduleSpec:
    opsctl: str  # absolute path of the opsctl executable
    inventory: Path
    target: str
    on_calendar: str
    randomized_delay_s: int
    state_dir: Path
    workdir: Path
    timeout_s: int
    prometheus: Path | None = None
    rollback_on_fail: bool = False

    @property
    def exec_start(self) -> str:
        argv = [self.opsctl, "health", self.target]
        if self.prometheus is not None:
            argv += ["--prometheus", str(self.prometheus)]
        if self.rollback_on_fail:
            argv.append("--rollback-on-fail")
        return " ".join(_quote(a) for a in argv)


def _quote(value: str) -> str:
    bad = sorted(set(value) & _UNIT_UNSAFE)
    if bad:
        raise UsageError(f"{value!r} contains characters systemd would interpret: {''.join(bad)!r}")
    return f'"{value}"' if any(c.isspace() for c in value) else value


def _no_space(value: str) -> str:
    if any(c.isspace() for c in value):
        raise UsageError(f"{value!r}: WorkingDirectory cannot contain whitespace")
    return _checked(value)


def _checked(value: str) -> str:
    _quote(value)
    return value


def find_opsctl() -> str:
    """The opsctl script of the running interpreter's environment, else the one on PATH."""
    beside = Path(sys.executable).parent / "opsctl"
    if beside.exists():
        return str(beside)
    found = shutil.which("opsctl")
    if found:
        return str(Path(found).resolve())
    raise OpsError("cannot find the `opsctl` executable to schedule; install the package (pip install -e .)")


ROLLBACK_SLACK_S = 300.0  # switch, unit install, history, cleanup over SSH


def rollback_budget_s(host: HostConfig) -> float:
    """The longest an honest `opsctl rollback` of this host can take."""
    return host.service.start_timeout_s + 60 + host.gate.deadline_s + ROLLBACK_SLACK_S


def make_spec(
    hosts: Sequence[HostConfig],
    *,
    target: str,
    inventory: Path,
    opsctl: str | None = None,
    prometheus: Path | None = None,
    rollback_on_fail: bool = False,
    workdir: Path | None = None,
    state: Path | None = None,
) -> ScheduleSpec:
    """One timer for the target: its hosts must agree on OnCalendar and RandomizedDelaySec."""
    if not hosts:
        raise UsageError(f"{target!r} has no hosts to check")
    calendars = {h.health.on_calendar for h in hosts}
    delays = {h.health.randomized_delay_s for h in hosts}
    if len(calendars) > 1 or len(delays) > 1:
        spread = ", ".join(f"{h.name}={h.health.on_calendar}/{h.health.randomized_delay_s}s" for h in hosts)
        raise UsageError(
            f"hosts of {target!r} disagree on health.on_calendar/randomized_delay_s ({spread}); "
            "set them in the inventory's defaults, or schedule a group whose hosts agree"
        )
    # The slowest host's probe and HTTP timeouts bound a check. With --rollback-on-fail the service must also be
    # able to finish every rollback it may start (one host after another): systemd killing it mid-way would
    # leave a host half-switched. A rollback is a restart (start timeout), a gate (its deadline) and bookkeeping.
    timeout = int(max(h.connect_timeout_s + h.health.http_timeout_s + 60 for h in hosts))
    if rollback_on_fail:
        timeout += int(sum(rollback_budget_s(h) for h in hosts))
    return ScheduleSpec(
        opsctl=opsctl or find_opsctl(),
        inventory=inventory.resolve(),
        target=target,
        on_calendar=calendars.pop(),
        randomized_delay_s=delays.pop(),
        state_dir=(state or state_dir()).resolve(),
        workdir=(workdir or inventory.resolve().parent),
        timeout_s=timeout,
        prometheus=prometheus.resolve() if prometheus else None,
        rollback_on_fail=rollback_on_fail,
    )


def _fill(template: str, values: dict[str, str]) -> str:
    out = template
    for key, value in values.items():
        out = out.replace(f"@{key}@", value)
    if "@" in "".join(line for line in out.splitlines() if not line.startswith("#")):
        leftover = [line for line in out.splitlines() if "@" in line and not line.startswith("#")]
        raise OpsError(f"unit template has unfilled placeholders: {leftover}")
    return out


def render(spec: ScheduleSpec, template_dir: Path = TEMPLATE_DIR) -> dict[str, str]:
    """Pure: file name -> rendered unit text."""
    values = {
        "TARGET": _checked(spec.target),
        "INVENTORY": _checked(str(spec.inventory)),
        "STATE_DIR": _checked(str(spec.state_dir)),
        "WORKDIR": _no_space(str(spec.workdir)),
        "EXEC_START": spec.exec_start,
        "TIMEOUT_S": str(spec.timeout_s),
        "ON_CALENDAR": _checked(spec.on_calendar),
        "RANDOMIZED_DELAY_S": str(spec.randomized_delay_s),
        # WARN and CRIT only: EXIT_HEALTH_ERROR (the check itself failed) must fail the unit.
        "SUCCESS_EXIT_STATUS": " ".join(str(c) for c in FINDING_EXIT_CODES),
    }
    try:
        return {name: _fill((template_dir / name).read_text(), values) for name in (SERVICE, TIMER)}
    except OSError as e:
        raise OpsError(f"unit template missing: {e}") from e


def unit_dir(user: bool) -> Path:
    explicit = os.environ.get(UNIT_DIR_ENV)
    if explicit:
        return Path(explicit)
    if user:
        xdg = os.environ.get("XDG_CONFIG_HOME")
        return (Path(xdg) if xdg else Path.home() / ".config") / "systemd" / "user"
    return Path("/etc/systemd/system")


def default_user_mode() -> bool:
    return os.geteuid() != 0


def systemd_running() -> bool:
    return Path("/run/systemd/system").is_dir()


Runner = Callable[[list[str]], subprocess.CompletedProcess[str]]


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@dataclass(frozen=True)
class ScheduleResult:
    unit_dir: Path
    files: tuple[Path, ...]
    changed: bool
    activated: bool
    message: str


def verify_calendar(expression: str, runner: Runner = _run) -> None:
    """Ask systemd whether OnCalendar parses, so a typo fails here and not silently in the timer."""
    if len(expression) > MAX_CALENDAR_CHARS:  # before asking systemd-analyze (docs/gate.md "Health checks")
        raise UsageError(
            f"health.on_calendar: {len(expression):,} characters; a calendar expression may have at most "
            f"{MAX_CALENDAR_CHARS:,}"
        )
    if shutil.which("systemd-analyze") is None:
        return
    r = runner(["systemd-analyze", "calendar", "--", expression])
    if r.returncode != 0:
        said = escaped(r.stderr.strip()[:1000])  # it quotes the expression
        raise UsageError(f"health.on_calendar {expression!r} is not a systemd calendar expression: {said}")


def install(spec: ScheduleSpec, *, user: bool, runner: Runner = _run, activate: bool | None = None) -> ScheduleResult:
    verify_calendar(spec.on_calendar, runner)
    units = render(spec)
    directory = unit_dir(user)
    changed = False
    paths = []
    for name, text in units.items():
        path = directory / name
        paths.append(path)
        try:
            current = path.read_text()
        except OSError:
            current = None
        if current != text:
            write_atomic(path, text)
            changed = True
    activate = systemd_running() if activate is None else activate
    if not activate:
        return ScheduleResult(
            directory,
            tuple(paths),
            changed,
            False,
            f"wrote {', '.join(units)} to {directory}; systemd is not running here, so the timer is not started",
        )
    for argv in (systemctl_argv("daemon-reload", user=user), systemctl_argv("enable", "--now", TIMER, user=user)):
        r = runner(argv)
        if r.returncode != 0:
            raise OpsError(f"`{' '.join(argv)}` failed: {r.stderr.strip()[-300:]}")
    return ScheduleResult(directory, tuple(paths), changed, True, f"{TIMER} enabled ({spec.on_calendar})")


def remove(*, user: bool, runner: Runner = _run, activate: bool | None = None) -> ScheduleResult:
    directory = unit_dir(user)
    paths = tuple(directory / n for n in (SERVICE, TIMER))
    activate = systemd_running() if activate is None else activate
    if activate:
        runner(systemctl_argv("disable", "--now", TIMER, user=user))  # fine if it was never enabled
    existed = [p for p in paths if p.exists()]
    for p in existed:
        p.unlink()
    if activate and existed:
        runner(systemctl_argv("daemon-reload", user=user))
    msg = f"removed {', '.join(p.name for p in existed)} from {directory}" if existed else "nothing installed"
    return ScheduleResult(directory, paths, bool(existed), activate, msg)


@dataclass(frozen=True)
class ScheduleStatus:
    unit_dir: Path
    installed: bool
    timer: dict[str, str]
    service: dict[str, str]
    exec_start: str | None

    def to_dict(self) -> dict[str, object]:
        return {
            "unit_dir": str(self.unit_dir),
            "installed": self.installed,
            "timer": self.timer,
            "service": self.service,
            "exec_start": self.exec_start,
        }


def _show(user: bool, unit: str, props: str, runner: Runner) -> dict[str, str]:
    r = runner(systemctl_argv("show", unit, f"--property={props}", user=user))
    if r.returncode != 0:
        return {}
    return parse_systemctl_show(r.stdout)


def status(*, user: bool, runner: Runner = _run, activate: bool | None = None) -> ScheduleStatus:
    directory = unit_dir(user)
    service_file = directory / SERVICE
    installed = service_file.exists() and (directory / TIMER).exists()
    exec_start = None
    if service_file.exists():
        exec_start = next(
            (line.split("=", 1)[1] for line in service_file.read_text().splitlines() if line.startswith("ExecStart=")),
            None,
        )
    live = systemd_running() if activate is None else activate
    timer = (
        _show(user, TIMER, "ActiveState,UnitFileState,NextElapseUSecRealtime,LastTriggerUSec", runner) if live else {}
    )
    service = _show(user, SERVICE, "ActiveState,Result,ExecMainStatus,ExecMainExitTimestamp", runner) if live else {}
    return ScheduleStatus(directory, installed, timer, service, exec_start)
