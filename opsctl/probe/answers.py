"""The probe program's answers as data: one request's outcome (``RequestOutcome``), a wave, a readiness poll, their
readers (``parse_ready``, ``parse_wave``, over ``document``: the last line the program printed), what a gate's
waves add up to (``ProbeTally``), and whose fault a failure is (``failure_cause``, over the 4xx rule
``is_client_error``). All pure.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class FailureCause(StrEnum):
    """Whose fault a failed request is: the release's (it could not serve: FAIL, marked bad) or the gate's own
    configuration's (a wrong endpoint, prompt or API key: ERROR, rolled back, not marked bad)."""

    RELEASE = "release"
    CONFIGURATION = "configuration"


def is_client_error(status: int | None) -> bool:
    """A 4xx other than 408 (request timeout) and 429 (too many requests): those two are the server being slow
    or full, which says something about the release."""
    return status is not None and 400 <= status < 500 and status not in (408, 429)


def failure_cause(status: int | None, baseline_status: int | None = None) -> FailureCause:
    """Why a request failed with HTTP ``status`` (None: no answer, a timeout, a malformed stream). A client
    error is the configuration's, unless the same request was answered 200 by the release before (``baseline_
    status``, the comparison's baseline): then the new release broke the API. Anything else is the release's."""
    if not is_client_error(status):
        return FailureCause.RELEASE
    return FailureCause.RELEASE if baseline_status == 200 else FailureCause.CONFIGURATION


@dataclass(frozen=True)
class RequestOutcome:
    """One probe request as the host saw it."""

    rid: str
    ok: bool
    kind: str  # ok | http | timeout | connection | malformed | error | cut
    status: int | None = None
    error: str | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    tokens: int | None = None

    @property
    def cut(self) -> bool:
        """Cut short by the gate's own deadline before ``timeout_s`` (budget.cut_by_deadline): neither an
        answer nor a failure; it says nothing about the release and is counted unsent."""
        return self.kind == "cut"

    @property
    def refused(self) -> bool:
        """A client error (bad request, no or wrong API key, no such endpoint): the probe cannot talk to this
        server, which says nothing about the release's verify path. 408 and 429 are the server being slow or
        full, which does."""
        return self.kind == "http" and is_client_error(self.status)


@dataclass(frozen=True)
class Wave:
    requests: tuple[RequestOutcome, ...]
    auth: bool = False  # an API key was sent (its value never leaves the host)
    auth_error: str | None = None
    elapsed_s: float = 0.0
    unsent: int = 0  # requests the program did not start: the wave's budget (the gate's deadline) was spent

    @property
    def cause(self) -> FailureCause | None:
        """Whose fault the wave's failures are (None: none failed): the configuration's only when every failed
        request was refused (``failure_cause``); one that the server could not serve makes it the release's."""
        failed = self.failed
        if not failed:
            return None
        if all(r.refused for r in failed):
            return FailureCause.CONFIGURATION
        return FailureCause.RELEASE

    @property
    def answered(self) -> int:
        return sum(1 for r in self.requests if r.ok)

    @property
    def failed(self) -> tuple[RequestOutcome, ...]:
        """The requests the release failed: not answered, and not cut short by the gate's deadline."""
        return tuple(r for r in self.requests if not r.ok and not r.cut)

    @property
    def cut(self) -> int:
        return sum(1 for r in self.requests if r.cut)

    @property
    def not_asked(self) -> int:
        """Requests that asked the release nothing: not sent (the budget was spent) or cut short by the deadline."""
        return self.unsent + self.cut


@dataclass(frozen=True)
class Readiness:
    ready: bool
    status: int | None = None
    error: str | None = None
    polls: int = 0
    elapsed_s: float = 0.0

    def describe(self, path: str) -> str:
        if self.ready:
            return f"GET {path}: 200"
        return f"GET {path}: " + (f"HTTP {self.status}" if self.status is not None else self.error or "no answer")


def document(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.split("\n") if line.strip()]
    if not lines:
        raise ValueError("the probe program printed nothing")
    doc = json.loads(lines[-1])
    if not isinstance(doc, dict):
        raise ValueError("the probe program printed something other than a JSON object")
    if "config_error" in doc:
        raise ValueError(f"the probe program refused its configuration: {doc['config_error']}")
    return doc


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def parse_ready(stdout: str) -> Readiness:
    """The program's ``ready`` answer; ValueError when it is not one."""
    doc = document(stdout)
    status = doc.get("status")
    return Readiness(
        ready=doc.get("ready") is True,
        status=status if isinstance(status, int) else None,
        error=str(doc["error"]) if doc.get("error") else None,
        polls=int(doc.get("polls") or 0),
        elapsed_s=_float(doc.get("elapsed_s")) or 0.0,
    )


def parse_wave(stdout: str) -> Wave:
    """The program's ``wave`` answer; ValueError when it is not one."""
    doc = document(stdout)
    raw = doc.get("requests")
    if not isinstance(raw, list):
        raise ValueError("the probe program's answer has no requests[]")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            raise ValueError("a request in the probe program's answer is not an object")
        status, tokens = item.get("status"), item.get("tokens")
        out.append(
            RequestOutcome(
                rid=str(item.get("rid", "")),
                ok=item.get("ok") is True,
                kind=str(item.get("kind", "malformed")),
                status=status if isinstance(status, int) else None,
                error=str(item["error"]) if item.get("error") else None,
                ttft_s=_float(item.get("ttft_s")),
                latency_s=_float(item.get("latency_s")),
                tokens=tokens if isinstance(tokens, int) else None,
            )
        )
    return Wave(
        requests=tuple(out),
        auth=doc.get("auth") is True,
        auth_error=str(doc["auth_error"]) if doc.get("auth_error") else None,
        elapsed_s=_float(doc.get("elapsed_s")) or 0.0,
        unsent=unsent if isinstance(unsent := doc.get("unsent"), int) and not isinstance(unsent, bool) else 0,
    )


# ------------------------------------------------------------------------------------------------ tallies


@dataclass
class ProbeTally:
    """What the probe saw over a gate (or a health check): requests sent, answered, failed (with the first few
    reasons), unsent (not started, or cut short, because the gate's deadline came: neither answered nor failed),
    the times to first token, and when the server became ready."""

    sent: int = 0
    answered: int = 0
    failed: int = 0
    refused: int = 0
    unsent: int = 0
    waves: int = 0
    failures: list[str] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    auth: bool = False

    MAX_REASONS = 3

    def add(self, wave: Wave) -> None:
        self.waves += 1
        self.auth = self.auth or wave.auth
        self.unsent += wave.not_asked
        for r in wave.requests:
            if r.cut:
                continue
            self.sent += 1
            if r.ok:
                self.answered += 1
                if r.ttft_s is not None:
                    self.ttft_s.append(r.ttft_s)
                continue
            self.failed += 1
            self.refused += r.refused
            reason = r.error or r.kind
            if reason not in self.failures and len(self.failures) < self.MAX_REASONS:
                self.failures.append(reason)

    def ttft_ms(self) -> dict[str, float] | None:
        if not self.ttft_s:
            return None
        ms = [t * 1000 for t in self.ttft_s]
        return {"min": round(min(ms), 1), "median": round(statistics.median(ms), 1), "max": round(max(ms), 1)}

    def summary(self) -> dict[str, Any]:
        return {
            "sent": self.sent,
            "answered": self.answered,
            "failed": self.failed,
            "failures": list(self.failures),
            "unsent": self.unsent,
            "waves": self.waves,
            "ttft_ms": self.ttft_ms(),
            "api_key": self.auth,
        }


def describe_tally(doc: dict[str, Any]) -> str:
    """``8 sent, 8 answered, TTFT 12/15/31 ms`` (+ failures) from a tally's summary."""
    text = f"{doc.get('sent', 0)} sent, {doc.get('answered', 0)} answered"
    if doc.get("failed"):
        text += f", {doc['failed']} failed ({'; '.join(doc.get('failures') or [])})"
    if doc.get("unsent"):
        text += f", {doc['unsent']} not sent or cut short (the gate's deadline)"
    ttft = doc.get("ttft_ms")
    if ttft:
        text += f", TTFT {ttft['min']:g}/{ttft['median']:g}/{ttft['max']:g} ms (min/median/max)"
    return text
