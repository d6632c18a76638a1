"""What a probe found on one host (``HostFacts`` and its parts): plain data, so tests can build them by hand.

opsctl.health.probe fills them in from the host; opsctl.health.checks judges them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ..comparison.results import Comparison
from ..gate.lines import ParityLine


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
    """``--probe``: one probe request through the service's own API (opsctl/probe/traffic.py) and the parity lines the
    running invocation printed after it was sent."""

    sent: int = 0
    answered: int = 0
    error: str | None = None  # why the request failed, or why the probe could not run
    refused: bool = False  # the server refused the request (HTTP 4xx): the probe could not ask
    ttft_s: float | None = None
    lines: tuple[ParityLine, ...] = ()
    waited_s: float = 0.0  # how long the lines were waited for after the answer


@dataclass(frozen=True)
class SpeedFacts:
    """``--probe``: a short run of the comparison workload (``gate.compare``, its first prompts) judged against the
    sample recorded when the running release was deployed (opsctl/host/comparisons.py), by the comparison's judge.
    ``skipped``: why it did not run (no recorded sample, the comparison disabled, ...)."""

    reference: str = ""  # what it was compared with, e.g. "its deploy (2026-12-03T17:21:39Z)"
    comparison: Comparison | None = None
    s_per_token: float | None = None  # the median decode seconds per token measured now
    accept_length: float | None = None  # the mean accepted drafts measured now
    error: str | None = None  # the workload could not run
    skipped: str | None = None


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
    speed: SpeedFacts | None = None  # None: no speed check (``--probe`` not asked for, or no HTTP API)
