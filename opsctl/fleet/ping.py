"""`opsctl ping`: is a host reachable, does ssh auth work, and what does it look like (systemd, the unit, GPUs,
free disk on the release root's filesystem). One SSH session and one remote command per host: the host-facts
probe of opsctl.hostdata.facts."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import AuthFailed, HostKeyMismatch, HostKeyUnknown, OpsError
from ..hostdata.facts import Gpu, facts_command, parse_facts
from ..inventory import HostConfig
from ..ssh import connect
from .fanout import DEFAULT_WORKERS, run_on_hosts

FACTS_TIMEOUT_S = 30.0
# What ping shows of the unit (the probe reads more for the snapshot and health).
PING_UNIT_PROPERTIES = ("LoadState", "ActiveState", "SubState", "NRestarts", "MainPID")

__all__ = ["FACTS_TIMEOUT_S", "Gpu", "PingReport", "facts_script", "ping", "ping_many"]


@dataclass(frozen=True)
class PingReport:
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
    """The one command that gathers a host's facts (opsctl.hostdata.facts)."""
    return facts_command(host.root, host.unit)


def ping(host: HostConfig, *, accept_new_host_key: bool = False) -> PingReport:
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
        return PingReport(
            **base,
            reachable=reached,
            auth=False,
            error=e.message,
            error_kind=type(e).__name__,
            exit_code=e.exit_code,
        )
    facts = parse_facts(res.stdout)
    return PingReport(
        **base,
        reachable=True,
        auth=True,
        latency_ms=round(latency, 1),
        sshd_version=sshd_version,
        hostname=facts.hostname,
        kernel=facts.kernel,
        systemd_version=facts.systemd_version,
        system_state=facts.system_state,
        sshd_active=facts.sshd_active,
        unit={k: facts.unit[k] for k in PING_UNIT_PROPERTIES if k in facts.unit},
        gpus=list(facts.gpus),
        disk_path=facts.disk_path,
        disk_free_mb=facts.disk_free_mb,
        disk_total_mb=facts.disk_total_mb,
        min_free_disk_mb=host.min_free_disk_mb,
    )


def ping_many(
    hosts: Sequence[HostConfig], *, accept_new_host_key: bool = False, workers: int = DEFAULT_WORKERS
) -> list[PingReport]:
    """Ping hosts in parallel; results in the order given."""
    return run_on_hosts(
        hosts, lambda h: ping(h, accept_new_host_key=accept_new_host_key), workers=workers, thread_name_prefix="ping"
    ).values()
