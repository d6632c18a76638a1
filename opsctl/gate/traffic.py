"""The gate's verify traffic from the operator's side: what to ask the host-side program
(opsctl/gate/traffic_on_host.py) to do, the one command that runs it through an SSH session, and its answers as
data.

The program's text and its configuration go to the host together on stdin (``python3 -``; ``payload``), never in
argv: `ps` would show it, and the kernel caps one argument at 128 KiB. The configuration is built here from the
inventory and holds no secret (the API key is read on the host from ``service.environment_file``). The parsing,
the classification of failures (``failure_cause``) and the plan's wording are pure; ``ProbeClient`` is the I/O
edge (one remote command per readiness wait or wave).
"""

from __future__ import annotations

import json
import secrets
import shlex
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from ..errors import DeployFailed
from ..ssh.remote import CommandResultLike, Remote
from .traffic_on_host import request_time_s

if TYPE_CHECKING:  # annotations only: the inventory's models (pydantic) are the CLI's slowest import
    from ..inventory import HostConfig, ProbeSettings

LOOPBACK = "127.0.0.1"
RID_PREFIX = "opsctl-probe"
# Seconds a remote command may run past the program's own limits (SSH, python3's start) before it is killed.
COMMAND_SLACK_S = 30.0


# The line of the host program that ``payload`` replaces with the configuration.
CONFIG_LINE = "CONFIG_TEXT: str | None = None\n"


@cache
def program_text() -> str:
    """The host-side program, as shipped (the installed module's own file)."""
    return resources.files("opsctl.gate").joinpath("traffic_on_host.py").read_text(encoding="utf-8")


def payload(config: dict[str, Any]) -> str:
    """What goes on the remote command's stdin: the program with its ``CONFIG_TEXT`` line set to the configuration
    (JSON text as a Python string literal: ``json.dumps`` of a string is one, ASCII only)."""
    text = program_text()
    if text.count(CONFIG_LINE) != 1:
        raise AssertionError("traffic_on_host.py must have exactly one CONFIG_TEXT line")
    literal = json.dumps(json.dumps(config, separators=(",", ":")))
    return text.replace(CONFIG_LINE, f"CONFIG_TEXT: str | None = {literal}\n")


def serves_http(host: HostConfig) -> bool:
    """Whether the unit is an HTTP server the probe can talk to (the replay service has no port)."""
    return host.service.mode != "replay"


def probing(host: HostConfig) -> bool:
    """Whether the gate drives its own verify traffic on this host."""
    return host.gate.probe.enabled and serves_http(host)


def new_rid_prefix() -> str:
    """``opsctl-probe-<random>``: one per gate, so the requests of two deploys are told apart in the server's logs."""
    return f"{RID_PREFIX}-{secrets.token_hex(3)}"


# ------------------------------------------------------------------------------------------------ answers


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
        """Cut short by the gate's own deadline before ``timeout_s`` (traffic_on_host.cut_by_deadline): neither an
        answer nor a failure; it says nothing about the release and is counted unsent."""
        return self.kind == "cut"

    @property
    def refused(self) -> bool:
        """A client error (bad request, no or wrong API key, no such endpoint): the probe cannot talk to this
        server, which says nothing about the release's verify path. 408 and 429 are the server being slow or
        full, which does."""
        return (
            self.kind == "http"
            and self.status is not None
            and 400 <= self.status < 500
            and self.status not in (408, 429)
        )


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


def worth_a_wave(host: HostConfig, left_s: float) -> bool:
    """Whether a wave can start one request with ``left_s`` left to the gate's deadline (traffic_on_host.
    request_time_s): with less, the gate does not ask the host at all. Pure."""
    return request_time_s(host.gate.probe.timeout_s, left_s) is not None


# ------------------------------------------------------------------------------------------------ commands


def base_config(host: HostConfig) -> dict[str, Any]:
    """What every mode needs: where the service listens, and where its API key is (the file and variable names,
    never the key)."""
    p = host.gate.probe
    return {
        "host": LOOPBACK,
        "port": host.service.port,
        "env_file": host.service.environment_file,
        "api_key_env": p.api_key_env,
    }


def ready_config(host: HostConfig, wait_s: float) -> dict[str, Any]:
    return {**base_config(host), "mode": "ready", "ready_path": host.gate.probe.ready_path, "wait_s": wait_s}


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
        **base_config(host),
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


def command(python: str = "python3") -> str:
    """The remote command: the program and its configuration go on its stdin (``payload``), nothing in argv."""
    return f"{shlex.quote(python)} -"


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

    def _run(self, config: dict[str, Any], timeout: float) -> CommandResultLike:
        res = self.remote().run(command(), stdin=payload(config), timeout=timeout, check=False)
        if res.rc not in (0, 2):
            raise DeployFailed(
                f"{self.host.name}: the probe program failed on the host (exit {res.rc}): "
                f"{(res.stderr.strip() or res.stdout.strip())[-300:] or 'no output'}"
            )
        return res

    def _parsed(self, res: CommandResultLike, parse: Callable[[str], Any]) -> Any:
        try:
            return parse(res.stdout)
        except ValueError as e:
            raise DeployFailed(f"{self.host.name}: the probe program's answer is unreadable: {e}") from e

    def ready(self, wait_s: float) -> Readiness:
        res = self._run(ready_config(self.host, wait_s), timeout=wait_s + COMMAND_SLACK_S)
        readiness: Readiness = self._parsed(res, parse_ready)
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
        res = self._run(config, timeout=wave_timeout_s(self.host, requests, finish_within_s))
        wave: Wave = self._parsed(res, parse_wave)
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
