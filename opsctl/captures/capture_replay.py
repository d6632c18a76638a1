"""The capture replay: every capture stored on a host replayed with a chosen release
(``python -m kdtree_backend.replay --captures``, built by :func:`opsctl.host.replay.capture_replay_command`), and
its output judged by the gate's own parser and rules.

The deploy's pre-restart check (``opsctl.pipeline.prerestart``) runs the command in its session and judges with
:func:`judge_replay`; ``opsctl parity replay`` runs it in its own session (:func:`replay_release`).
:func:`judge_replay` is pure and takes the gate's settings and the rank count, not a host.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from kdtree_backend.wire import REPLAY_EXIT_OK, REPLAY_EXIT_PARITY_FAILED

from ..errors import UsageError
from ..gate.decision import GateState, Judgement, LineVerdict, Verdict, json_float, judge
from ..host import releaseroot
from ..host.replay import capture_replay_command
from ..inventory import GateSettings, HostConfig
from ..release import ADOPTED_ID_RE
from ..release import ID_RE as RELEASE_ID_RE
from ..ssh.remote import Remote
from .listing import capture_dir

SUMMARY_RE = re.compile(r"^kdtree-replay: captures=(\d+) damaged=(\d+)\b")
REPLAY_TIMEOUT_S = 900.0


# The NODATA reason when the host holds no capture (the replay found none, or the pre-restart check saw none).
NOTHING_STORED = "no captures stored on the host"


@dataclass
class ReplayJudgement:
    verdict: Verdict  # PASS, FAIL, INCONCLUSIVE, NODATA (nothing stored), ERROR (the replay could not run)
    reason: str
    judgements: list[Judgement]
    calls: int
    damaged: int
    state: GateState

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": str(self.verdict),
            "reason": self.reason,
            "calls": self.calls,
            "damaged": self.damaged,
            "lines": [
                {
                    "verdict": str(j.verdict),
                    "reason": j.reason,
                    "layer": j.line.layer if j.line else None,
                    "tp": j.line.rank if j.line else None,
                    "rel": json_float(j.line.rel) if j.line else None,
                    "capture": j.line.extra.get("capture") if j.line else None,
                    "text": j.raw.strip(),
                }
                for j in self.judgements
            ],
        }


def judge_replay(
    stdout: str, rc: int, settings: GateSettings, ranks: int, token: str, stderr: str = ""
) -> ReplayJudgement:
    """The capture replay's verdict, by the gate's own parser and rules: every line is judged (no K-pass stop),
    ``ranks`` are the capturing ranks (the host's ``service.tp``), only lines with ``token`` count. Pure."""
    state = GateState.every_line(settings, expected_ranks=ranks, token=token)
    judgements = []
    calls = damaged = 0
    summary_seen = False
    # A line is what ends at \n, as for the gate's journal: str.splitlines() would also cut at \r, U+2028 and
    # the like, and make two lines of one.
    for message in stdout.split("\n"):
        m = SUMMARY_RE.match(message)
        if m:
            calls, damaged, summary_seen = int(m[1]), int(m[2]), True
        j = judge(state, message, 0.0)
        if j is not None:
            judgements.append(j)
    counted = state.lines
    skipped = [line for line in stderr.split("\n") if "skipped:" in line]
    if state.verdict is Verdict.FAIL:
        return ReplayJudgement(Verdict.FAIL, state.reason, judgements, calls, damaged, state)
    if rc == REPLAY_EXIT_PARITY_FAILED and damaged:
        why = skipped[0].removeprefix("kdtree-replay: ") if skipped else f"{damaged} damaged capture(s)"
        return ReplayJudgement(Verdict.FAIL, f"capture replay: {why}", judgements, calls, damaged, state)
    if rc not in (REPLAY_EXIT_OK, REPLAY_EXIT_PARITY_FAILED) or not summary_seen:
        # The replay's lines carry the token: an error message quotes its output without it.
        tail = " | ".join((stderr or stdout).strip().split("\n")[-3:]).replace(token, "<token>")
        return ReplayJudgement(
            Verdict.ERROR, f"capture replay could not run (exit {rc}): {tail}", judgements, calls, damaged, state
        )
    if counted == 0:
        ignored = state.counts[LineVerdict.IGNORED]
        why = f"{ignored} line(s) ignored (wrong or missing token)" if ignored else NOTHING_STORED
        return ReplayJudgement(Verdict.NODATA, why, judgements, calls, damaged, state)
    if rc == REPLAY_EXIT_PARITY_FAILED:
        return ReplayJudgement(
            Verdict.FAIL,
            f"capture replay exited {REPLAY_EXIT_PARITY_FAILED} (a line over the threshold)",
            judgements,
            calls,
            damaged,
            state,
        )
    if state.counts[LineVerdict.INCONCLUSIVE]:
        n = state.counts[LineVerdict.INCONCLUSIVE]
        return ReplayJudgement(
            Verdict.INCONCLUSIVE, f"{n} of {counted} line(s) between pass and fail", judgements, calls, damaged, state
        )
    worst = state.worst.rel if state.worst is not None else 0.0
    return ReplayJudgement(
        Verdict.PASS, f"{counted} captured call(s) replayed, worst rel {worst:.3g}", judgements, calls, damaged, state
    )


@dataclass(frozen=True)
class ReplayRun:
    release: str
    judgement: ReplayJudgement
    stderr: str
    elapsed_s: float


def _release_dir(r: Remote, host: HostConfig, release: str) -> tuple[str, str]:
    """(release id, its directory on the host); 'current' is what the unit runs now."""
    releases = releaseroot.Layout(host.root).releases
    if release == "current":
        res = r.run(releaseroot.resolve_current_command(host.root), check=False, timeout=60)
        target = res.stdout.strip()
        if res.rc != 0 or not target.startswith(releases + "/"):
            raise UsageError(f"{host.name}: no current release under {releases} (deploy one first)")
        return target.rsplit("/", 1)[1], target
    if not (RELEASE_ID_RE.fullmatch(release) or ADOPTED_ID_RE.fullmatch(release)):
        raise UsageError(f"{release!r} is not a release id (like r0123456789ab) or 'current'")
    path = f"{releases}/{release}"
    if r.run(releaseroot.is_dir_command(path), check=False, timeout=60).rc != 0:
        raise UsageError(f"{host.name}: release {release} is not on the host (opsctl releases {host.name} lists them)")
    return release, path


def replay_release(host: HostConfig, release: str, token: str) -> ReplayRun:
    """Replay every stored capture with ``release`` (an id, or 'current') on the host, nothing switched."""
    from ..ssh import connect

    with connect(host) as r:
        release_id, path = _release_dir(r, host, release)
        started = time.monotonic()
        command = capture_replay_command(
            host.service.python, path, capture_dir(host), token, threshold=host.gate.fail_rel
        )
        res = r.run(command.command, stdin=command.stdin, check=False, timeout=REPLAY_TIMEOUT_S)
    elapsed = time.monotonic() - started
    return ReplayRun(
        release_id, judge_replay(res.stdout, res.rc, host.gate, host.service.tp, token, res.stderr), res.stderr, elapsed
    )
