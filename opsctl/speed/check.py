"""The pre-restart speed check's I/O: the host program's command (``python3 -m kdtree_backend.speed_ab``, run from
the new release's directory against the running release's), the reader of what it prints, and the check itself."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from ..hostdata.layout import Layout
from ..inventory import HostConfig
from ..ssh.remote import Remote
from .judge import SpeedJudgement, SpeedVerdict, judge_speed, timed_calls

SPEED_MODULE = "kdtree_backend.speed_ab"
EXIT_CANNOT = 4  # kdtree_backend.speed_ab: the check cannot run here (not a verdict on the release)
STARTUP_S = 120.0  # on top of budget_s: two workers importing torch, the calls built and loaded, CUDA graphs


@dataclass(frozen=True)
class SpeedCommand:
    command: str
    stdin: str
    timeout_s: float


def speed_config(host: HostConfig) -> dict[str, Any]:
    """The host program's config (stdin): the inventory's ``gate.speed`` and the host's draft tree size."""
    s = host.gate.speed
    return {
        "rounds": s.rounds,
        "budget_s": s.budget_s,
        "q_len": host.service.speculative_num_draft_tokens,
        "heads": s.heads,
        "batch_sizes": s.batch_sizes,
        "prefixes": s.prefixes,
        "graphs": s.graphs,
    }


def speed_command(python: str, new_dir: str, old_dir: str, config: dict[str, Any]) -> SpeedCommand:
    """Run the new release's host program in its directory against ``old_dir``; the config goes on stdin."""
    new = new_dir.rstrip("/")
    env = f"PYTHONPATH={shlex.quote(f'{new}/kernel:{new}/backend')} PYTHONDONTWRITEBYTECODE=1"
    argv = shlex.join([python, "-m", SPEED_MODULE, "--against", old_dir.rstrip("/")])
    budget = float(config.get("budget_s") or 30.0)
    return SpeedCommand(f"cd {shlex.quote(new)} && exec env {env} {argv}", json.dumps(config), budget + STARTUP_S)


def read_speed(stdout: str, rc: int, stderr: str, *, host: HostConfig, against: str) -> SpeedJudgement:
    """What the host program printed -> the judgement: SKIPPED when it could not run (its reason), else judged."""
    last = next((line for line in reversed(stdout.strip().splitlines()) if line.startswith("{")), "")
    try:
        doc = json.loads(last) if last else {}
    except ValueError:
        doc = {}
    if not isinstance(doc, dict):
        doc = {}
    if rc == EXIT_CANNOT or "cannot" in doc:
        return SpeedJudgement(SpeedVerdict.SKIPPED, f"cannot time the releases here: {doc.get('cannot') or rc}")
    if rc != 0 or "calls" not in doc:
        tail = " | ".join((stderr or stdout).strip().splitlines()[-3:])[-400:]
        return SpeedJudgement(SpeedVerdict.SKIPPED, f"the speed check exited {rc}: {tail or 'no output'}")
    try:
        calls = timed_calls(doc)
    except ValueError as e:
        return SpeedJudgement(SpeedVerdict.SKIPPED, str(e))
    s = host.gate.speed
    return judge_speed(
        calls, max_slowdown=s.max_slowdown, alpha=s.alpha, against=against, device=str(doc.get("device", "")),
        elapsed_s=doc.get("elapsed_s"),
    )  # fmt: skip


def run_speed_check(r: Remote, host: HostConfig, layout: Layout, release: str, previous: str | None) -> SpeedJudgement:
    """Time ``release`` against ``previous`` (the running release) on the host. SKIPPED without one to time
    against (the first deploy, a redeploy of the same release) or when the host program cannot run."""
    if previous is None:
        return SpeedJudgement(SpeedVerdict.SKIPPED, "no running release to time against (first deploy)")
    if previous == release:
        return SpeedJudgement(SpeedVerdict.SKIPPED, "the running release is this one")
    cmd = speed_command(host.service.python, layout.release(release), layout.release(previous), speed_config(host))
    res = r.run(cmd.command, stdin=cmd.stdin, timeout=cmd.timeout_s, check=False)
    return read_speed(res.stdout, res.rc, res.stderr, host=host, against=previous)
