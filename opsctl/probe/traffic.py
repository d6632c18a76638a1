"""The probe traffic from the operator's side: the host program (``TRAFFIC_PROGRAM``: opsctl/probe/traffic_on_host.py
and the modules it imports, shipped as one text), what to ask it (``ready_config``, ``wave_config``; the
comparison workload's, opsctl/comparison/workload.py, starts from ``service_config``), the client that runs it through a
session (``ProbeClient``), and the plan in words. Its answers as data are in opsctl/probe/answers.py.

The program's text and its configuration go to the host together on stdin (opsctl/ssh/hostprogram.py), never in
argv: `ps` would show it, and the kernel caps one argument at 128 KiB. The configuration is built here from the
inventory and holds no secret (the API key is read on the host from ``service.environment_file``). The configs
and the plan's wording are pure; ``ProbeClient`` is the I/O edge (one remote command per readiness wait or wave).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..ssh.hostprogram import HostProgram
from ..ssh.remote import Remote
from .answers import Readiness, Wave, parse_ready, parse_wave
from .budget import request_time_s

if TYPE_CHECKING:  # annotations only: the inventory's models (pydantic) are the CLI's slowest import
    from ..inventory import HostConfig, ProbeSettings

LOOPBACK = "127.0.0.1"
RID_PREFIX = "opsctl-probe"
# Seconds a remote command may run past the program's own limits (SSH, python3's start) before it is killed.
COMMAND_SLACK_S = 30.0
# The probe's host program: its modules in the order they are shipped, the entry (``main``) last.
TRAFFIC_PROGRAM = HostProgram(
    "opsctl.probe",
    ("envfile.py", "budget.py", "stream.py", "readings.py", "modes.py", "traffic_on_host.py"),
    "the probe program",
)


def serves_http(host: HostConfig) -> bool:
    """Whether the unit is an HTTP server the probe can talk to (the replay service has no port)."""
    return host.service.mode != "replay"


def probing(host: HostConfig) -> bool:
    """Whether the gate drives its own verify traffic on this host."""
    return host.gate.probe.enabled and serves_http(host)


def new_rid_prefix() -> str:
    """``opsctl-probe-<random>``: one per gate, so the requests of two deploys are told apart in the server's logs."""
    return f"{RID_PREFIX}-{secrets.token_hex(3)}"


def worth_a_wave(host: HostConfig, left_s: float) -> bool:
    """Whether a wave can start one request with ``left_s`` left to the gate's deadline (budget.
    request_time_s): with less, the gate does not ask the host at all. Pure."""
    return request_time_s(host.gate.probe.timeout_s, left_s) is not None


# ------------------------------------------------------------------------------------------------ commands


def service_config(host: HostConfig) -> dict[str, Any]:
    """What every mode of the program needs (the comparison workload's too): where the service listens, and
    where its API key is (the file and variable names, never the key)."""
    p = host.gate.probe
    return {
        "host": LOOPBACK,
        "port": host.service.port,
        "env_file": host.service.environment_file,
        "api_key_env": p.api_key_env,
    }


def ready_config(host: HostConfig, wait_s: float) -> dict[str, Any]:
    return {**service_config(host), "mode": "ready", "ready_path": host.gate.probe.ready_path, "wait_s": wait_s}


def wave_config(
    host: HostConfig,
    rid_prefix: str,
    first: int,
    *,
    requests: int | None = None,
    max_new_tokens: int | None = None,
    start_within_s: float | None = None,
    finish_within_s: float | None = None,
) -> dict[str, Any]:
    """One wave. ``start_within_s``: no request starts later (the gate polls the journal between requests);
    ``finish_within_s``: none runs longer (the time left to the gate's deadline)."""
    p: ProbeSettings = host.gate.probe
    n = requests or p.requests
    return {
        "start_within_s": start_within_s,
        "finish_within_s": finish_within_s,
        **service_config(host),
        "mode": "wave",
        "endpoint": p.endpoint,
        "prompts": list(p.prompts),
        "input_ids": [list(ids) for ids in p.input_ids] if p.input_ids else None,
        "requests": n,
        "concurrency": min(p.concurrency, n),
        "max_new_tokens": max_new_tokens or p.max_new_tokens,
        "timeout_s": p.timeout_s,
        "model": p.model,
        "rid_prefix": rid_prefix,
        "first": first,
    }


def wave_timeout_s(host: HostConfig, requests: int | None = None, finish_within_s: float | None = None) -> float:
    """How long a wave may take: its requests in rounds of ``concurrency``, each within ``timeout_s``; at most
    ``finish_within_s`` when given."""
    p = host.gate.probe
    n = requests or p.requests
    rounds = -(-n // max(1, min(p.concurrency, n)))
    limit = rounds * p.timeout_s if finish_within_s is None else min(rounds * p.timeout_s, finish_within_s)
    return limit + COMMAND_SLACK_S


class ProbeClient:
    """Runs the host-side program through a session: ``ready`` (wait for readiness, at most ``wait_s``) and
    ``wave`` (one wave of probe requests, numbered on from the last). ``run`` is the session's runner: the gate
    passes its session's current remote, so a reconnect after a drop is used by the next call."""

    def __init__(self, host: HostConfig, remote: Callable[[], Remote], rid_prefix: str | None = None) -> None:
        self.host = host
        self.remote = remote
        self.rid_prefix = rid_prefix or new_rid_prefix()
        self.next_n = 0

    def _run(self, config: dict[str, Any], timeout: float, read: Callable[[str], Any]) -> Any:
        return TRAFFIC_PROGRAM.run(self.remote(), config, timeout=timeout, where=self.host.name, read=read)

    def ready(self, wait_s: float) -> Readiness:
        readiness: Readiness = self._run(ready_config(self.host, wait_s), wait_s + COMMAND_SLACK_S, parse_ready)
        return readiness

    def wave(
        self,
        *,
        requests: int | None = None,
        max_new_tokens: int | None = None,
        start_within_s: float | None = None,
        finish_within_s: float | None = None,
    ) -> Wave:
        """One wave (``wave_config``): with budgets, requests the budget left unsent are counted in ``unsent``."""
        config = wave_config(
            self.host,
            self.rid_prefix,
            self.next_n,
            requests=requests,
            max_new_tokens=max_new_tokens,
            start_within_s=start_within_s,
            finish_within_s=finish_within_s,
        )
        wave: Wave = self._run(config, wave_timeout_s(self.host, requests, finish_within_s), parse_wave)
        self.next_n += len(wave.requests) + wave.unsent
        return wave


# ------------------------------------------------------------------------------------------------ the plan


def plan_lines(host: HostConfig) -> list[str]:
    """The probe plan in words, for `opsctl deploy --dry-run` (names the API key's variable, never its value)."""
    p = host.gate.probe
    if not serves_http(host):
        return ["probe: none (the replay service prints parity lines by itself; it has no HTTP port)"]
    if not p.enabled:
        return [
            "probe: disabled (gate.probe.enabled: false): the gate waits for the host's own traffic; with none by "
            "the deadline the verdict is UNPROVEN (rolled back, not marked bad)"
        ]
    what = f"{len(p.input_ids)} token-id prompt(s)" if p.input_ids else f"{len(p.prompts)} prompt(s)"
    key = (
        f"API key from ${p.api_key_env} in {host.service.environment_file}, read on the host"
        if host.service.environment_file
        else "no API key (no service.environment_file)"
    )
    return [
        f"probe: wait for GET http://{LOOPBACK}:{host.service.port}{p.ready_path} = 200 on the host, then waves of "
        f"{p.requests} POST {p.endpoint} ({what}, concurrency {p.concurrency}, max_new_tokens {p.max_new_tokens}, "
        f"temperature 0, stream, timeout {p.timeout_s:g}s, rid {RID_PREFIX}-<random>-<n>) until the gate decides",
        f"probe: {key}; a failed request fails the gate (every request refused, HTTP 4xx: an ERROR of this "
        f"configuration, not marked bad); every rank must print parity within {p.parity_grace_s:g}s of the first "
        f"answer; no request starts later than {host.gate.poll_interval_s:g}s into its wave or runs past the "
        "gate's deadline",
    ]
