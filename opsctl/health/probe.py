"""The health probe: one SSH round trip runs one command printing the host facts (opsctl.hostdata.facts),
:data:`SEPARATOR`, then one JSON document from a small read-only program (opsctl/health/probe_on_host.py, its text
and configuration on the stdin of the host's own python3: ``PROBE_PROGRAM``, opsctl/ssh/hostprogram.py) with what
the facts do not cover: the health endpoint, the current release's files against its manifest, the current
invocation's parity lines, the parity token file, the lock, and the host's clock.

The command and the reader of its output (``facts_from_probe`` -> opsctl.health.findings.HostFacts) sit together;
``ssh_probe`` is the I/O edge (with ``--probe`` also ``verify_probe``: one request through the service's API).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import socket
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kdtree_backend.wire import MARKER

from ..comparison.compare import compare
from ..comparison.sample import ComparisonSample
from ..comparison.workload import run_compare_workload
from ..errors import DeployFailed, OpsError
from ..gate.decision import GateState, judge
from ..gate.lines import ParityLine
from ..host import history as host_history
from ..host.comparisons import deploy_sample, mean_accept_length, median_ms_per_token
from ..host.releaseroot import parse_parity_env
from ..hostdata.facts import SystemFacts, facts_command, parse_facts
from ..hostdata.layout import Layout
from ..inventory import CompareSettings, GateSettings, HostConfig
from ..journal.query import mark_command, parse_mark, parse_poll, poll_command
from ..lock.hostlock import describe_owner, json_object_or_none
from ..probe.traffic import ProbeClient, serves_http
from ..release import Manifest
from ..ssh.hostprogram import HostProgram
from ..ssh.remote import Remote
from .findings import (
    DriftFacts,
    GpuFacts,
    HostFacts,
    HttpFacts,
    LockFacts,
    ParitySample,
    ProbeFacts,
    SpeedFacts,
    UnitFacts,
)

SEPARATOR = "--- opsctl health probe ---"
# The host-side program's limits (passed in its configuration): the newest lines kept, and the largest file hashed.
MAX_PARITY_LINES = 2000
MAX_HASH_BYTES = 512 << 20
SPEED_PROMPTS = 8  # `--probe`'s short comparison workload: the first prompts of gate.compare
SPEED_WARMUP = 1


# The host-side program, shipped as the installed module's own file with its configuration (probe_config) on stdin.
PROBE_PROGRAM = HostProgram("opsctl.health", ("probe_on_host.py",), "the health probe")


@dataclass(frozen=True)
class ProbeParams:
    unit: str  # without .service
    root: str
    http_url: str | None  # None: no HTTP endpoint (replay mode)
    http_timeout_s: float
    parity_window_s: float


def health_url(port: int, path: str) -> str:
    """The service's health endpoint on the host itself: ``path`` is the URL's path, never part of its authority
    (a validated path starts with one '/', so it cannot name another host)."""
    return urllib.parse.urlunsplit(("http", f"127.0.0.1:{port}", path, "", ""))


def probe_params(host: HostConfig) -> ProbeParams:
    """What the probe asks about on ``host``, from the inventory (no HTTP endpoint in replay mode)."""
    return ProbeParams(
        unit=host.unit,
        root=host.root,
        http_url=None if host.service.mode == "replay" else health_url(host.service.port, host.health.http_path),
        http_timeout_s=host.health.http_timeout_s,
        parity_window_s=host.health.parity_window_s,
    )


def probe_config(params: ProbeParams) -> dict[str, Any]:
    """The host-side program's configuration (on its stdin, ``probe_payload``): what to look at, and the limits."""
    return {
        "unit": params.unit,
        "root": params.root,
        "http_url": params.http_url,
        "http_timeout": params.http_timeout_s,
        "window": params.parity_window_s,
        "max_lines": MAX_PARITY_LINES,
        "max_hash_bytes": MAX_HASH_BYTES,
        "marker": MARKER,
    }


def probe_command(params: ProbeParams, python: str = "python3") -> str:
    """The probe; run it with :func:`probe_payload` on its stdin. The host's own python3 runs the program: sglang's
    venv is not needed for a read-only probe. The facts read nothing from stdin (``exec </dev/null``), so the
    program's text reaches python3 whole; the invocation the facts found is its one argument."""
    invocation = "$(printf '%s\\n' \"$F\" | sed -n 's/^unit\\.InvocationID=//p')"
    return (
        f"F=$(exec </dev/null\n{facts_command(params.root, params.unit)}\n); printf '%s\\n' \"$F\"; "
        f"echo {shlex.quote(SEPARATOR)}; "
        f'{PROBE_PROGRAM.command(python)} "{invocation}"'
    )


def probe_payload(params: ProbeParams) -> str:
    """What goes on the probe's stdin: the program with its configuration (``probe_config``)."""
    return PROBE_PROGRAM.payload(probe_config(params))


def split_probe_output(stdout: str) -> tuple[str, dict[str, Any]]:
    """The probe's output -> (the facts' text, for parse_facts; the script's JSON). ValueError when the JSON part
    is missing or not an object."""
    facts, sep, rest = stdout.partition(SEPARATOR)
    if not sep:
        raise ValueError("the probe printed no separator (did it run?)")
    doc = json.loads(rest)
    if not isinstance(doc, dict):
        raise ValueError("probe answered something other than a JSON object")
    return facts, doc


def read_probe(stdout: str) -> tuple[SystemFacts, dict[str, Any]]:
    """The probe's output -> (the host facts, the script's JSON). ValueError when it is not the probe's."""
    facts_text, raw = split_probe_output(stdout)
    return parse_facts(facts_text), raw


def facts_from_probe(
    host: HostConfig,
    system: SystemFacts,
    raw: Mapping[str, Any],
    *,
    local_time: float,
    elapsed_s: float,
    lock_owner: Callable[[str], tuple[str | None, int | None]],
    pid_alive: Callable[[int], bool],
    local_hostname: str,
) -> HostFacts:
    """The probe's findings -> HostFacts. The format knowledge of other modules comes in as functions."""
    return HostFacts(
        host=host.name,
        unit=unit_from_probe(system),
        http=http_from_probe(raw),
        gpu=gpu_from_probe(host, system),
        drift=drift_from_probe(host, raw),
        parity=parity_from_probe(raw, host.gate, parse_parity_env(raw.get("parity_env") or "")),
        parity_error=raw.get("journal_error"),
        parity_token=parse_parity_env(raw.get("parity_env") or ""),
        disk_free_mb=None if system.disk_avail_kb is None else system.disk_avail_kb / 1024,
        lock=lock_from_probe(raw, lock_owner, pid_alive, local_hostname),
        host_time=raw.get("host_time"),
        local_time=local_time,
        elapsed_s=elapsed_s,
    )


def unit_from_probe(system: SystemFacts) -> UnitFacts:
    """The unit's state from the facts' ``systemctl show`` (an NRestarts that is not a number is unknown)."""
    u = system.unit
    n_restarts = u.get("NRestarts")
    return UnitFacts(
        load_state=u.get("LoadState", ""),
        active_state=u.get("ActiveState", ""),
        sub_state=u.get("SubState", ""),
        n_restarts=int(n_restarts) if isinstance(n_restarts, str) and n_restarts.isdigit() else None,
        invocation_id=u.get("InvocationID", ""),
    )


def http_from_probe(raw: Mapping[str, Any]) -> HttpFacts | None:
    """The health endpoint's answer; None when the program asked none (replay mode)."""
    if "http" not in raw:
        return None
    h = raw["http"]
    return HttpFacts(status=h.get("status"), elapsed_s=h.get("elapsed_s"), error=h.get("error"))


def gpu_from_probe(host: HostConfig, system: SystemFacts) -> GpuFacts | None:
    """The GPUs nvidia-smi listed; None when the host expects none (a GPU nobody expects is not looked at)."""
    if host.gpu_arch is None:
        return None
    if system.gpu_error:
        return GpuFacts(error=system.gpu_error)
    return GpuFacts(gpus=tuple((g.name, g.compute_cap) for g in system.gpus if g.compute_cap is not None))


def drift_from_probe(host: HostConfig, raw: Mapping[str, Any]) -> DriftFacts:
    """The current release's files as found against its manifest, or why they cannot be compared."""
    if "release_error" in raw:
        return DriftFacts(error=f"no current release ({host.root}/current: {_strip_errno(raw['release_error'])})")
    if "manifest" not in raw:
        return DriftFacts(release=raw.get("release"), error=f"manifest.json missing: {raw.get('manifest_error')}")
    try:
        manifest: Mapping[str, str] | None = {f.path: f.sha256 for f in Manifest.from_json(raw["manifest"]).files}
    except (ValueError, KeyError, TypeError) as e:
        return DriftFacts(release=raw.get("release"), error=f"manifest.json unreadable: {e}")
    return DriftFacts(release=raw.get("release"), manifest=manifest, actual=raw.get("hashes") or {})


def judged_line(message: str, settings: GateSettings, token: str | None, split: str = "") -> ParityLine | None:
    """One journal message read as the gate reads it (``gate.decision.judge``): its parity line; a message holding
    the invocation's ``token`` anywhere that is not a well-formed line (a parity line glued to another message, a
    marked line over the limit, a message journalctl left out) as a malformed line, which the checks fail; None
    for what the gate does not count (no parity at all, a shapes or fallback line, the marker inside another
    message without the token; a piece of a message journald cut, ``split``, with no part of the token or the
    marker). Pure: the gate judging it is a throwaway one."""
    j = judge(GateState.every_line(settings, expected_ranks=None, token=token), message, 0.0, split=split)
    return None if j is None else j.line


def parity_from_probe(raw: Mapping[str, Any], settings: GateSettings, token: str | None) -> tuple[ParitySample, ...]:
    """The invocation's marked journal messages that the gate counts (``judged_line``), with their journal time."""
    samples = []
    for at, message, *cut in raw.get("parity_lines") or ():
        line = judged_line(message, settings, token, str(cut[0]) if cut else "")
        if line is not None:
            samples.append(ParitySample(at=float(at), line=line))
    return tuple(samples)


def lock_from_probe(
    raw: Mapping[str, Any],
    lock_owner: Callable[[str], tuple[str | None, int | None]],
    pid_alive: Callable[[int], bool],
    local_hostname: str,
) -> LockFacts:
    """The deploy lock and its owner; whether the owner lives is known only when it runs on this machine."""
    if "lock" not in raw:
        return LockFacts()
    text = raw["lock"].get("text", "")
    owner_host, owner_pid = lock_owner(text)
    alive = pid_alive(owner_pid) if owner_pid is not None and owner_host == local_hostname else None
    return LockFacts(
        present=True,
        age_s=raw["lock"].get("age_s"),
        owner_host=owner_host,
        owner_pid=owner_pid,
        owner_alive=alive,
        # Never the file itself: owner.json holds the owner's token.
        owner_text=describe_owner(json_object_or_none(text)),
    )


def _strip_errno(message: str) -> str:
    """ "[Errno 2] No such file or directory: '/x'" -> "No such file or directory"."""
    text = message.split("] ", 1)[-1]
    return text.split(":", 1)[0]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def local_hostname() -> str:
    return socket.gethostname()


def lock_owner(text: str) -> tuple[str | None, int | None]:
    """the deploy lock's owner.json -> (client hostname, pid); anything unreadable -> unknown owner."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None, None
    if not isinstance(doc, dict):
        return None, None
    pid = doc.get("pid")
    client = doc.get("client")
    return (client if isinstance(client, str) else None), (pid if isinstance(pid, int) else None)


def verify_probe(r: Remote, host: HostConfig, token: str | None) -> ProbeFacts:
    """``--probe``'s I/O: mark the journal, send a probe request from the host (``health.probe_max_new_tokens`` new
    tokens), then read the running invocation's entries after the mark until every TP rank has printed a parity line
    or ``health.probe_wait_s`` has passed, sending one more request after each poll that still misses a rank.
    Why more than one: under speculative decoding a request's tokens take fewer verify steps than tokens (each step
    accepts several drafts), so one request can end before the next sampled step (``parity.every_n_steps``) comes.
    Each entry is read as the gate reads it (``judged_line``, with the invocation's ``token``)."""
    mark = parse_mark(r.run(mark_command(host.unit), timeout=60).stdout)
    client = ProbeClient(host, lambda: r)
    try:
        wave = client.wave(requests=1, max_new_tokens=host.health.probe_max_new_tokens)
    except OpsError as e:
        return ProbeFacts(error=e.message)
    if wave.failed:
        first = wave.failed[0]
        return ProbeFacts(sent=1, error=first.error or first.kind, refused=first.refused)
    ttft = wave.requests[0].ttft_s if wave.requests else None
    sent = answered = 1
    lines: list[ParityLine] = []
    cursor, t0 = mark.cursor, time.monotonic()
    while True:
        res = r.run(poll_command(host.unit, cursor), timeout=60, check=False)
        for entry in parse_poll(res.stdout)[1]:
            cursor = entry.cursor
            line = (
                judged_line(entry.message, host.gate, token, entry.line_break)
                if entry.invocation == mark.old_invocation
                else None
            )
            if line is not None:
                lines.append(line)
        ranks = {line.rank for line in lines}
        waited = time.monotonic() - t0
        if all(rank in ranks for rank in range(host.service.tp)) or waited >= host.health.probe_wait_s:
            return ProbeFacts(sent=sent, answered=answered, ttft_s=ttft, lines=tuple(lines), waited_s=waited)
        try:
            more = client.wave(requests=1, max_new_tokens=host.health.probe_max_new_tokens)
        except OpsError as e:
            return ProbeFacts(sent=sent, answered=answered, error=e.message, ttft_s=ttft, lines=tuple(lines))
        sent += 1
        if more.failed:
            first = more.failed[0]
            return ProbeFacts(sent=sent, answered=answered, error=first.error or first.kind, refused=first.refused)
        answered += 1
        time.sleep(0.2)


def speed_settings(settings: CompareSettings) -> CompareSettings:
    """``--probe``'s short comparison workload: the first :data:`SPEED_PROMPTS` prompts of ``gate.compare`` (same
    tokens, same judge), one warmup request."""
    # At the first concurrency level only: the deploy's sample holds that level's requests first (issue 48).
    update: dict[str, Any] = {"warmup": min(settings.warmup, SPEED_WARMUP), "concurrency": settings.concurrency[:1]}
    if settings.input_ids:
        update["input_ids"] = settings.input_ids[:SPEED_PROMPTS]
    else:
        update["prompts"] = settings.prompts[:SPEED_PROMPTS]
    return settings.model_copy(update=update)


def speed_probe(r: Remote, host: HostConfig, release: str | None) -> SpeedFacts:
    """``--probe``'s drift check: the short comparison workload on the running release, judged against the
    sample recorded when it was deployed (opsctl/host/comparisons.py: ``deploy_sample``)."""
    settings = host.gate.compare
    if not settings.enabled:
        return SpeedFacts(skipped="the comparison is disabled (gate.compare.enabled: false)")
    if not release:
        return SpeedFacts(skipped="no current release")
    recorded = deploy_sample(host_history.read_history(r, Layout(host.root)), release)
    if recorded is None:
        return SpeedFacts(skipped=f"no comparison sample recorded when {release} was deployed")
    if len(recorded.sample.requests) not in (settings.workload_size, settings.requests_per_side):
        return SpeedFacts(
            skipped=f"the sample recorded at the deploy has {len(recorded.sample.requests)} requests and "
            f"gate.compare now {settings.workload_size}: the workload changed since"
        )
    short = speed_settings(settings)
    reference = f"its deploy ({recorded.at})" if recorded.at else "its deploy"
    try:
        sample = run_compare_workload(r, host, settings=short)
    except DeployFailed as e:
        return SpeedFacts(reference=reference, error=e.message)
    n = short.workload_size
    then = ComparisonSample(recorded.sample.requests[:n], recorded.sample.load_source)
    ms = median_ms_per_token(sample)
    return SpeedFacts(
        reference=reference,
        comparison=compare(then, sample, short, baseline="its deploy"),
        s_per_token=ms / 1000 if ms is not None else None,
        accept_length=mean_accept_length(sample),
    )


def _probed_token(stdout: str) -> str | None:
    """The running invocation's parity token from the probe's output (None: none handed out, or unreadable)."""
    try:
        return parse_parity_env(split_probe_output(stdout)[1].get("parity_env") or "")
    except ValueError:
        return None


def _probed_release(stdout: str) -> str | None:
    """The current release the probe's program found (None when its output is not readable: reported later)."""
    try:
        release = split_probe_output(stdout)[1].get("release")
    except ValueError:
        return None
    return release if isinstance(release, str) else None


def ssh_probe(host: HostConfig, *, accept_new_host_key: bool = False, probe: bool = False) -> HostFacts:
    """Probe one host in one SSH round trip (with ``probe``, and an HTTP API, a few more: :func:`verify_probe`).
    Any SSH failure is an unreachable host, never an exception."""
    from ..ssh import connect

    t0 = time.monotonic()
    verify = speed = None
    try:
        with connect(host, accept_new_host_key=accept_new_host_key) as r:
            params = probe_params(host)
            res = r.run(
                probe_command(params),
                stdin=probe_payload(params),
                timeout=host.health.http_timeout_s + 60,
                check=True,
            )
            if probe and serves_http(host):
                verify = verify_probe(r, host, _probed_token(res.stdout))
                speed = speed_probe(r, host, _probed_release(res.stdout))
        system, raw = read_probe(res.stdout)
    except OpsError as e:
        return unreachable_facts(host, e, time.monotonic() - t0)
    except ValueError as e:
        return unreachable_facts(
            host, OpsError(f"{host.name}: health probe output unreadable: {e}"), time.monotonic() - t0
        )
    facts = facts_from_probe(
        host,
        system,
        raw,
        local_time=time.time(),
        elapsed_s=time.monotonic() - t0,
        lock_owner=lock_owner,
        pid_alive=pid_alive,
        local_hostname=local_hostname(),
    )
    return dataclasses.replace(facts, probe=verify, speed=speed)


def unreachable_facts(host: HostConfig, error: OpsError | Exception, elapsed_s: float) -> HostFacts:
    msg = error.message if isinstance(error, OpsError) else str(error)
    return HostFacts(host=host.name, reachable=False, error=msg, local_time=time.time(), elapsed_s=elapsed_s)
