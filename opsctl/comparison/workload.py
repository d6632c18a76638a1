"""The comparison workload from the operator's side (docs/gate.md "The comparison workload"): the same greedy
requests (``gate.compare``) sent on the host's loopback by the probe's host program (opsctl/probe/traffic.py:
``TRAFFIC_PROGRAM``, mode ``compare``), before and after the restart; its answer read into a ``ComparisonSample`` for the judge.

``compare_config`` and ``parse_compare`` are pure; ``run_compare_workload`` is the I/O edge (one remote command).
The workload travels on stdin with the program, never in argv.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..inventory import CompareSettings, HostConfig
from ..probe.answers import document
from ..probe.traffic import COMMAND_SLACK_S, TRAFFIC_PROGRAM, service_config
from ..ssh.remote import Remote
from .sample import ComparisonSample

RID_PREFIX = "opsctl-compare"
ENDPOINT = "/generate"  # the native API: it answers with token ids (output_ids) and meta_info


def new_rid_prefix() -> str:
    """``opsctl-compare-<random>``: one per run, so a side's requests are told apart in the server's logs."""
    return f"{RID_PREFIX}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class WorkloadRun:
    """What one run of the workload saw: the sample (warmup excluded), the warmup's failures, the requests the
    budget left unsent, and whether an API key was sent (or why not; its value never leaves the host)."""

    sample: ComparisonSample
    warmup_sent: int = 0
    warmup_failed: int = 0
    unsent: int = 0
    auth: bool = False
    auth_error: str | None = None
    elapsed_s: float = 0.0

    def notes(self) -> list[str]:
        """Lines for the deploy's report about what did not go as planned (empty when all did)."""
        out = []
        if self.auth_error:
            out.append(f"comparison: no API key sent: {self.auth_error}")
        if self.warmup_failed:
            out.append(f"comparison: {self.warmup_failed} of {self.warmup_sent} warmup request(s) failed")
        if self.unsent:
            out.append(f"comparison: {self.unsent} request(s) not sent: the time budget was spent")
        return out


def compare_config(
    host: HostConfig,
    settings: CompareSettings | None = None,
    rid_prefix: str | None = None,
    finish_within_s: float | None = None,
) -> dict[str, Any]:
    """The host program's configuration for one run of the workload (``settings``: the host's
    ``gate.compare`` unless given, e.g. a shorter one for ``health --probe``)."""
    c = settings or host.gate.compare
    return {
        **service_config(host),
        "mode": "compare",
        "endpoint": ENDPOINT,
        "prompts": list(c.prompts),
        "input_ids": [list(ids) for ids in c.input_ids] if c.input_ids else None,
        "warmup": c.warmup,
        "concurrency": list(c.concurrency),
        "max_new_tokens": c.max_new_tokens,
        "timeout_s": c.timeout_s,
        "model": host.gate.probe.model,
        "rid_prefix": rid_prefix or new_rid_prefix(),
        "finish_within_s": finish_within_s,
    }


def workload_timeout_s(settings: CompareSettings, finish_within_s: float | None = None) -> float:
    """How long one run may take: the warmup (at the first level) and the measured requests at each level in
    rounds of that level's concurrency, each within ``timeout_s`` (plus the load readings, 5 s each at most), at
    most ``finish_within_s`` when given."""
    levels = settings.concurrency
    n = settings.workload_size
    rounds = -(-settings.warmup // levels[0]) + sum(-(-n // level) for level in levels)
    limit = rounds * (settings.timeout_s + 10.0)
    if finish_within_s is not None:
        limit = min(limit, finish_within_s + 10.0)
    return limit + COMMAND_SLACK_S


def _count(doc: Any, key: str) -> int:
    value = doc.get(key) if isinstance(doc, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def parse_compare(stdout: str) -> WorkloadRun:
    """The program's ``compare`` answer; ValueError (a SampleError names the field) when it is not one."""
    doc = document(stdout)
    sample = ComparisonSample.from_json(doc.get("sample"))
    warmup = doc.get("warmup")
    elapsed = doc.get("elapsed_s")
    return WorkloadRun(
        sample=sample,
        warmup_sent=_count(warmup, "sent"),
        warmup_failed=_count(warmup, "failed"),
        unsent=_count(doc, "unsent"),
        auth=doc.get("auth") is True,
        auth_error=str(doc["auth_error"])[:300] if doc.get("auth_error") else None,
        elapsed_s=float(elapsed) if isinstance(elapsed, int | float) and not isinstance(elapsed, bool) else 0.0,
    )


def run_workload(
    remote: Remote,
    host: HostConfig,
    *,
    settings: CompareSettings | None = None,
    rid_prefix: str | None = None,
    finish_within_s: float | None = None,
) -> WorkloadRun:
    """Run the workload once on ``host`` through ``remote`` -> what it saw. DeployFailed when the program could
    not run or its answer is unreadable (the requests' own failures are data, in the sample)."""
    c = settings or host.gate.compare
    return TRAFFIC_PROGRAM.run(
        remote,
        compare_config(host, c, rid_prefix, finish_within_s),
        timeout=workload_timeout_s(c, finish_within_s),
        where=host.name,
        what="the comparison workload",
        read=parse_compare,
    )


def run_compare_workload(
    remote: Remote,
    host: HostConfig,
    *,
    settings: CompareSettings | None = None,
    rid_prefix: str | None = None,
    finish_within_s: float | None = None,
    note: Callable[[str], None] | None = None,
) -> ComparisonSample:
    """Run the workload once -> its sample; what did not go as planned (no API key, warmup failures, requests
    left unsent) goes to ``note`` one line each."""
    run = run_workload(remote, host, settings=settings, rid_prefix=rid_prefix, finish_within_s=finish_within_s)
    for line in run.notes() if note is not None else ():
        note(line)
    return run.sample


def plan_lines(host: HostConfig) -> list[str]:
    """The comparison workload in words, for ``deploy --dry-run``."""
    c = host.gate.compare
    if not c.enabled:
        return ["comparison: disabled (gate.compare.enabled: false)"]
    what = f"{len(c.input_ids)} token-id prompt(s)" if c.input_ids else f"{len(c.prompts)} prompt(s)"
    return [
        f"comparison workload: {c.warmup} warmup + {c.workload_size} greedy request(s) ({what}) to POST {ENDPOINT} "
        f"on the host's loopback, max_new_tokens {c.max_new_tokens}, at concurrency {', then '.join(map(str, c.concurrency))} (each judged), timeout "
        f"{c.timeout_s:g}s, rid {RID_PREFIX}-<random>-<n>; before the restart (the running release) and after it"
    ]
