"""What a new release must get through on the host before it is switched in: the extension build and the
pre-restart parity (the host's captured traffic, then synthetic batches), judged by the gate's own rules."""

from __future__ import annotations

import time

from kdtree_backend.wire import REPLAY_EXIT_PARITY_FAILED

from ..captures import capture_replay as captures
from ..captures.capturedir import capture_dir
from ..errors import DeployFailed, GateFailed
from ..gate.decision import GateState, LineVerdict, Verdict
from ..gate.lines import ParityLine
from ..host import releaseroot
from ..host import replay as replay_commands
from ..host.releaseroot import Layout
from ..inventory import HostConfig
from ..ssh.remote import Remote
from .plan import PRE_RESTART_PARITY_STEPS
from .report import Reporter
from .watch import feed_line

PARITY_TIMEOUT_S = 600.0
BUILD_EXIT_NO_CUDA = 3
EXT_SUBDIR = "kernel/build"


def build(r: Remote, host: HostConfig, layout: Layout, release: str) -> str:
    """Build the extension on the host for its GPU; returns the step's detail. A host without CUDA (and no
    gpu_arch in the inventory) runs the reference path."""
    rel = layout.release(release)
    cmd = replay_commands.build_argv(
        host.service.python, rel, arch=host.gpu_arch or "0.0", out_subdir=EXT_SUBDIR, timeout_s=host.build_timeout_s
    )
    res = r.run(cmd, timeout=host.build_timeout_s + 120, check=False)
    if res.rc == 0:
        return f"built for sm_{(host.gpu_arch or '').replace('.', '')}, log {rel}/build.log"
    tail = (res.stderr or res.stdout).strip().split("\n")[-3:]
    if res.rc == BUILD_EXIT_NO_CUDA and host.gpu_arch is None:
        return "no CUDA on this host: the release runs the reference path"
    raise DeployFailed(f"extension build failed (exit {res.rc}; log {rel}/build.log): {' | '.join(tail)}")


def prerestart_parity(r: Remote, host: HostConfig, layout: Layout, release: str, reporter: Reporter) -> str:
    """Replay a few verify steps with the new release on the host (its GPU, when it has one) and judge the lines
    with the gate's own rules and a token of this run: a failing or malformed line fails it, passing lines
    (or inconclusive ones: the restart's gate is the stricter check) let the deploy go on."""
    rel = layout.release(release)
    # The host's own captured traffic first (when any is stored): real trees, prefixes and magnitudes.
    captured = replay_captures(r, host, rel, reporter)
    token = releaseroot.new_parity_token()
    command = replay_commands.synthetic_replay_command(
        host.service.python, rel, token, steps=PRE_RESTART_PARITY_STEPS, threshold=host.gate.fail_rel
    )
    res = r.run(command.command, stdin=command.stdin, timeout=PARITY_TIMEOUT_S, check=False)
    state = GateState.every_line(host.gate, expected_ranks=1, token=token, deadline_s=PARITY_TIMEOUT_S)
    for message in res.stdout.split("\n"):
        feed_line(state, message, 0.0, reporter)
    state.conclude(0.0)
    worst = state.worst.rel if state.worst is not None else None
    if state.verdict is Verdict.FAIL or (res.rc == REPLAY_EXIT_PARITY_FAILED and state.lines):
        raise GateFailed(f"pre-restart parity {state.reason or f'worst rel {worst:.4g}'}")
    if res.rc == 0 and state.lines:
        return f"{state.lines} parity lines, worst rel {worst:.3g}; {captured}"
    tail = command.redact(" | ".join((res.stderr or res.stdout).strip().split("\n")[-3:]))
    raise DeployFailed(f"pre-restart parity could not run (exit {res.rc}, {state.lines} parity lines): {tail}")


def prerestart_fail_reason(lines: list[tuple[ParityLine, LineVerdict]], fail_rel: float, most: int = 4) -> str:
    """``pre-restart parity L0 rel=1.12 L30 rel=1.08 ... >= 0.05 ...``: the failing layers (worst line of each, in
    layer order), like the gate's reason. Empty when no line failed. Pure."""

    def badness(line: ParityLine) -> float:
        return line.rel if line.rel == line.rel else float("inf")  # NaN is the worst

    worst: dict[tuple[int, int | None], ParityLine] = {}
    for line, verdict in lines:
        key = (line.layer, line.rank)
        if verdict is LineVerdict.FAIL and (key not in worst or badness(line) > badness(worst[key])):
            worst[key] = line
    if not worst:
        return ""
    ranks = {rank for _, rank in worst}
    parts = [
        f"L{layer}" + (f" TP{rank}" if len(ranks) > 1 else "") + f" rel={worst[(layer, rank)].rel:.3g}"
        for layer, rank in sorted(worst, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
    ]
    more = f" and {len(parts) - most} more" if len(parts) > most else ""
    # Lines of the capture replay carry capture=<id>/<call>: say the failure was on the host's own traffic.
    what = "capture replay" if all("capture" in w.extra for w in worst.values()) else "parity"
    return (
        f"pre-restart {what} {' '.join(parts[:most])}{more} >= fail threshold {fail_rel:g}; "
        "nothing switched or restarted"
    )


def replay_captures(r: Remote, host: HostConfig, release_dir: str, reporter: Reporter) -> str:
    """Replay the verify calls captured on this host from its real traffic (``opsctl capture``; docs/capture.md)
    with the new release, judged by the gate's parser and rules (every line, every capturing rank). A failing or
    damaged one stops the deploy before the switch, as the synthetic check does. Returns the step's detail."""
    directory = capture_dir(host.root)
    present = r.run(replay_commands.captures_present_command(directory), timeout=60, check=False)
    if present.rc == 0 and present.stdout.strip() == replay_commands.NO_CAPTURES:
        return f"captures: {captures.NOTHING_STORED}"
    token = releaseroot.new_parity_token()
    t = time.monotonic()
    command = replay_commands.capture_replay_command(
        host.service.python, release_dir, directory, token, threshold=host.gate.fail_rel
    )
    res = r.run(command.command, stdin=command.stdin, timeout=captures.REPLAY_TIMEOUT_S, check=False)
    j = captures.judge_replay(res.stdout, res.rc, host.gate, host.service.tp, token, res.stderr)
    for judgement in j.judgements:
        if judgement.line is not None and judgement.verdict is not LineVerdict.IGNORED:
            reporter.parity(judgement.line, judgement.verdict)
        else:
            reporter.info(f"ignored capture replay line: {judgement.reason}: {judgement.raw.strip()[:160]}")
    took = time.monotonic() - t
    if j.verdict is Verdict.FAIL:
        raise GateFailed(f"pre-restart capture replay {j.reason}")
    if j.verdict is Verdict.ERROR:
        raise DeployFailed(f"pre-restart {j.reason}")
    if j.verdict is Verdict.NODATA:
        return f"captures: {j.reason}"
    worst = j.state.worst.rel if j.state.worst is not None else float("nan")
    return f"captures: {j.calls} stored calls replayed in {took:.1f}s, worst rel {worst:.3g}"
