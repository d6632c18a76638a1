"""`opsctl ping`: is a host reachable, does ssh auth work, and what does it look like (systemd, the unit, GPUs,
free disk on the release root's filesystem). One SSH session and one remote command per host."""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from .errors import AuthFailed, HostKeyMismatch, HostKeyUnknown, OpsError
from .inventory import HostConfig
from .ssh import connect

FACTS_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_cap: str | None


@dataclass(frozen=True)
class HostFacts:
    host: str
    target: str
    reachable: bool
    auth: bool
    error: str | None = None
    error_kind: str | None = None
    exit_code: int = 0
    latency_ms: float | None = None
    sshd_version: str | None = None
    hostname: str | None = None
    kernel: str | None = None
    systemd_version: str | None = None
    system_state: str | None = None  # systemctl is-system-running: running, degraded, starting, ...
    sshd_active: str | None = None
    unit: dict[str, str] = field(default_factory=dict)  # LoadState, ActiveState, SubState, NRestarts, MainPID
    gpus: list[Gpu] = field(default_factory=list)
    gpu_arch_expected: str | None = None
    disk_path: str | None = None
    disk_free_mb: int | None = None
    disk_total_mb: int | None = None
    min_free_disk_mb: int | None = None

    @property
    def ok(self) -> bool:
        return self.reachable and self.auth and self.error is None

    @property
    def disk_ok(self) -> bool | None:
        if self.disk_free_mb is None or self.min_free_disk_mb is None:
            return None
        return self.disk_free_mb >= self.min_free_disk_mb


def facts_script(host: HostConfig) -> str:
    """The one command that gathers a host's facts as ``key=value`` lines (parsed by ``parse_facts``)."""
    unit = shlex.quote(f"{host.unit}.service")
    root = shlex.quote(host.root)
    return "; ".join(
        [
            'echo "hostname=$(hostname)"',
            'echo "kernel=$(uname -r)"',
            "echo \"systemd_version=$(systemctl --version 2>/dev/null | head -n1 | awk '{print $2}')\"",
            'echo "system_state=$(systemctl is-system-running 2>/dev/null)"',
            'echo "sshd_active=$(systemctl is-active ssh.service 2>/dev/null || systemctl is-active sshd.service 2>/dev/null)"',
            f"systemctl show {unit} -p LoadState -p ActiveState -p SubState -p NRestarts -p MainPID 2>/dev/null"
            " | sed 's/^/unit./'",
            "if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=name,compute_cap"
            " --format=csv,noheader 2>/dev/null | sed 's/^/gpu=/'; fi",
            f'p={root}; while [ ! -e "$p" ]; do p=$(dirname "$p"); done; echo "disk_path=$p"',
            'df -Pk "$p" | awk \'NR==2 {print "disk_total_kb="$2; print "disk_avail_kb="$4}\'',
        ]
    )


def parse_facts(stdout: str) -> dict[str, object]:
    """``key=value`` lines -> facts. Pure."""
    facts: dict[str, object] = {"unit": {}, "gpus": []}
    unit: dict[str, str] = facts["unit"]  # type: ignore[assignment]
    gpus: list[Gpu] = facts["gpus"]  # type: ignore[assignment]
    for line in stdout.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if key.startswith("unit."):
            unit[key.removeprefix("unit.")] = value
        elif key == "gpu":
            name, _, cap = value.rpartition(",")
            gpus.append(Gpu(name=name.strip() or cap.strip(), compute_cap=cap.strip() if name else None))
        elif key in ("disk_total_kb", "disk_avail_kb"):
            if value.isdigit():
                facts[key.replace("_kb", "_mb")] = int(value) // 1024
        else:
            facts[key] = value or None
    return facts


def ping(host: HostConfig, *, accept_new_host_key: bool = False) -> HostFacts:
    """Facts about one host; never raises for an unreachable host (the failure is in the result)."""
    base = {"host": host.name, "target": f"{host.target}:{host.port}", "gpu_arch_expected": host.gpu_arch}
    start = time.monotonic()
    try:
        with connect(host, accept_new_host_key=accept_new_host_key) as r:
            latency = (time.monotonic() - start) * 1000
            transport = r.client.get_transport()
            sshd_version = transport.remote_version if transport else None
            res = r.run(facts_script(host), timeout=FACTS_TIMEOUT_S, check=False, sudo=False)
    except OpsError as e:
        # Reached the host but could not get in (auth/host key) vs did not reach it at all.
        reached = isinstance(e, AuthFailed | HostKeyUnknown | HostKeyMismatch)
        return HostFacts(
            **base,
            reachable=reached,
            auth=False,
            error=e.message,
            error_kind=type(e).__name__,
            exit_code=e.exit_code,
        )
    facts = parse_facts(res.stdout)
    return HostFacts(
        **base,
        reachable=True,
        auth=True,
        latency_ms=round(latency, 1),
        sshd_version=sshd_version,
        hostname=facts.get("hostname"),  # type: ignore[arg-type]
        kernel=facts.get("kernel"),  # type: ignore[arg-type]
        systemd_version=facts.get("systemd_version"),  # type: ignore[arg-type]
        system_state=facts.get("system_state"),  # type: ignore[arg-type]
        sshd_active=facts.get("sshd_active"),  # type: ignore[arg-type]
        unit=facts["unit"],  # type: ignore[arg-type]
        gpus=facts["gpus"],  # type: ignore[arg-type]
        disk_path=facts.get("disk_path"),  # type: ignore[arg-type]
        disk_free_mb=facts.get("disk_avail_mb"),  # type: ignore[arg-type]
        disk_total_mb=facts.get("disk_total_mb"),  # type: ignore[arg-type]
        min_free_disk_mb=host.min_free_disk_mb,
    )


def ping_many(hosts: Sequence[HostConfig], *, accept_new_host_key: bool = False, workers: int = 16) -> list[HostFacts]:
    """Ping hosts in parallel; results in the order given."""
    if len(hosts) <= 1:
        return [ping(h, accept_new_host_key=accept_new_host_key) for h in hosts]
    with ThreadPoolExecutor(max_workers=min(workers, len(hosts))) as pool:
        return list(pool.map(lambda h: ping(h, accept_new_host_key=accept_new_host_key), hosts))
