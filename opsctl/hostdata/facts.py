"""The one probe of what a host is: its systemd, the service unit, its GPUs and the free disk under the release
root. ``ping``, the host snapshot (preflight, status) and the health probe all run :func:`facts_command` and read
its output with :func:`parse_facts`, so ``systemctl show``, ``nvidia-smi`` and ``df`` are parsed in one place.

The command prints ``key=value`` lines (values never contain a newline): ``unit.<Property>=`` from ``systemctl
show``, one ``gpu=<name>, <compute cap>`` per GPU after ``gpu_rc=<nvidia-smi's exit status>`` (127: not
installed), ``disk_path=``, ``disk_total_kb=``, ``disk_avail_kb=``, and a few words about the system.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

# Everything any caller reads about the unit; one `systemctl show` answers them all.
UNIT_PROPERTIES = (
    "LoadState",
    "ActiveState",
    "SubState",
    "FragmentPath",
    "NRestarts",
    "InvocationID",
    "Result",
    "DropInPaths",
    "MainPID",
)
NVIDIA_SMI_TIMEOUT_S = 20
_TIMED_OUT_RC = 124  # coreutils timeout(1)
_NOT_FOUND_RC = 127


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_cap: str | None


@dataclass(frozen=True)
class SystemFacts:
    """What :func:`facts_command` found. ``None``: not reported (the command did not get that far)."""

    unit: Mapping[str, str] = field(default_factory=dict)  # systemctl show's properties, by name
    gpus: tuple[Gpu, ...] = ()
    gpu_error: str | None = None  # nvidia-smi absent or failing: why, in its own words
    disk_path: str | None = None  # the nearest existing directory at or above the release root
    disk_total_kb: int | None = None
    disk_avail_kb: int | None = None
    hostname: str | None = None
    kernel: str | None = None
    systemd_version: str | None = None
    system_state: str | None = None  # systemctl is-system-running: running, degraded, starting, ...
    sshd_active: str | None = None

    @property
    def disk_free_mb(self) -> int | None:
        """Whole MiB free (rounded down: a preflight never counts on space that is not there)."""
        return None if self.disk_avail_kb is None else self.disk_avail_kb // 1024

    @property
    def disk_total_mb(self) -> int | None:
        return None if self.disk_total_kb is None else self.disk_total_kb // 1024

    @property
    def compute_caps(self) -> tuple[str, ...]:
        """The GPUs' compute capabilities, each once, sorted."""
        return tuple(sorted({g.compute_cap for g in self.gpus if g.compute_cap}))


@dataclass(frozen=True)
class UnitObservation:
    """What ``systemctl show`` said about the unit at one poll (read with the journal's entries, judged by the
    gate)."""

    active_state: str
    sub_state: str
    n_restarts: int
    invocation_id: str
    result: str = "success"


def unit_show_command(unit: str, properties: tuple[str, ...] = UNIT_PROPERTIES) -> str:
    """``systemctl show`` of ``unit`` (a name without ``.service``) for ``properties``, as ``Key=value`` lines."""
    return f"systemctl show -p {','.join(properties)} {shlex.quote(unit + '.service')}"


def facts_command(root: str, unit: str) -> str:
    """The probe, for the release root ``root`` and the unit ``unit`` (without ``.service``). Read-only."""
    smi = f"timeout {NVIDIA_SMI_TIMEOUT_S} nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader"
    return "\n".join(
        [
            'echo "hostname=$(hostname)"',
            'echo "kernel=$(uname -r)"',
            "echo \"systemd_version=$(systemctl --version 2>/dev/null | head -n1 | awk '{print $2}')\"",
            'echo "system_state=$(systemctl is-system-running 2>/dev/null)"',
            'echo "sshd_active=$(systemctl is-active ssh.service 2>/dev/null'
            ' || systemctl is-active sshd.service 2>/dev/null)"',
            f"{unit_show_command(unit)} 2>/dev/null | sed 's/^/unit./'",
            f'if command -v nvidia-smi >/dev/null 2>&1; then G=$({smi} 2>&1); echo "gpu_rc=$?"; '
            "printf '%s\\n' \"$G\" | sed 's/^/gpu=/'; "
            f'else echo "gpu_rc={_NOT_FOUND_RC}"; echo "gpu=nvidia-smi: not found"; fi',
            f'P={shlex.quote(root)}; while [ ! -d "$P" ]; do P=$(dirname "$P"); done; echo "disk_path=$P"',
            'df -Pk "$P" | awk \'NR==2 {print "disk_total_kb="$2; print "disk_avail_kb="$4}\'',
        ]
    )


def key_values(text: str) -> Iterator[tuple[str, str]]:
    """(key, value) of each ``key=value`` line, in order; lines without ``=`` are skipped. The one reader of the
    ``key=value`` output of opsctl's host commands. A line is what ends at ``\n`` (as the parity parser reads
    them): a value holding another line break stays one value."""
    for line in text.split("\n"):
        key, sep, value = line.partition("=")
        if sep:
            yield key, value


def parse_systemctl_show(text: str) -> dict[str, str]:
    """``Key=value`` lines (``systemctl show``) -> {Key: value}; other lines are ignored."""
    return dict(key_values(text))


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None


def parse_facts(stdout: str) -> SystemFacts:
    """:func:`facts_command`'s output -> SystemFacts. Lines of other commands in the same output are ignored."""
    words: dict[str, str] = {}
    unit: dict[str, str] = {}
    gpu_lines: list[str] = []
    for key, value in key_values(stdout):
        if key.startswith("unit."):
            unit[key.removeprefix("unit.")] = value.strip()
        elif key == "gpu":
            if value.strip():
                gpu_lines.append(value.strip())
        else:
            words[key] = value.strip()
    gpu_rc = _int_or_none(words.get("gpu_rc"))
    gpus: tuple[Gpu, ...] = ()
    gpu_error = None
    if gpu_rc == 0:
        gpus = tuple(_gpu(line) for line in gpu_lines)
    elif gpu_rc is not None:
        said = " | ".join(gpu_lines) or ("nvidia-smi: timed out" if gpu_rc == _TIMED_OUT_RC else "")
        gpu_error = f"nvidia-smi failed (rc {gpu_rc}): {said[-200:]}"
    return SystemFacts(
        unit=unit,
        gpus=gpus,
        gpu_error=gpu_error,
        disk_path=words.get("disk_path") or None,
        disk_total_kb=_int_or_none(words.get("disk_total_kb")),
        disk_avail_kb=_int_or_none(words.get("disk_avail_kb")),
        hostname=words.get("hostname") or None,
        kernel=words.get("kernel") or None,
        systemd_version=words.get("systemd_version") or None,
        system_state=words.get("system_state") or None,
        sshd_active=words.get("sshd_active") or None,
    )


def _gpu(line: str) -> Gpu:
    """``NVIDIA H200, 9.0`` -> Gpu; the capability is after the last comma (a name may hold commas)."""
    name, _, cap = line.rpartition(",")
    return Gpu(name=name.strip() or cap.strip(), compute_cap=cap.strip() if name else None)


# What ``environment_file_command`` says of a file, and the words a refusal uses for each.
_FILE_STATES = {
    "ok": "",
    "missing": "does not exist",
    "not-file": "is not a regular file",
    "unreadable": "is not readable",
}


def environment_file_command(path: str) -> str:
    """Whether the file a unit's ``EnvironmentFile=`` names is there for systemd to read: one line,
    ``env_file=ok|missing|not-file|unreadable``. Symlinks are followed as systemd follows them (a dangling one is
    missing). Read-only; run as the deploy's user (root, or through sudo), close to systemd's own view."""
    p = shlex.quote(path)
    return (
        f"if [ ! -e {p} ]; then echo env_file=missing; elif [ ! -f {p} ]; then echo env_file=not-file; "
        f"elif [ ! -r {p} ]; then echo env_file=unreadable; else echo env_file=ok; fi"
    )


def environment_file_problem(stdout: str) -> str | None:
    """:func:`environment_file_command`'s output -> None when the file is there and readable, else what is wrong in
    words (``does not exist``, ...). No answer at all is a problem too: this check guards the API key."""
    state = dict(key_values(stdout)).get("env_file", "").strip()
    if state not in _FILE_STATES:
        return f"could not be checked (the host answered {stdout.strip()[:80]!r})"
    return _FILE_STATES[state] or None
