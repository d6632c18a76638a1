"""The restart and the gate loop: restart the unit with a fresh parity token, then follow its new invocation's
journal into the gate until it decides. With the probe (gate.probe, docs/gate.md "The probe") the loop also waits
for the server's readiness and then sends probe waves from the host itself (opsctl/probe/traffic.py), each followed at
once by a journal poll."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable

from ..errors import DeployFailed, SshError
from ..gate.decision import GateState, LineVerdict, Traffic, judge
from ..host import releaseroot
from ..host.releaseroot import Layout
from ..inventory import HostConfig
from ..journal.follower import Follower
from ..journal.query import Mark, mark_command, parse_mark
from ..probe.answers import Wave, describe_tally
from ..probe.traffic import ProbeClient, probing, serves_http, worth_a_wave
from ..ssh.remote import Remote
from ..ssh.session import Session
from ..unit import systemctl
from .report import INFO_IGNORED, INFO_PROBE_WAVE, INFO_READY, GateProgress, Reporter, show_gate


def _mark(r: Remote, host: HostConfig) -> Mark:
    return parse_mark(r.run(mark_command(host.unit), timeout=60).stdout)


def restart_unit(r: Remote, host: HostConfig, reporter: Reporter | None = None) -> Mark:
    """Record the journal position + old invocation, hand the next invocation a fresh parity token, restart, and
    read the restart counter baseline.

    A unit that hit its start limit (a crash loop) is reset first, else systemd refuses the restart. A start job
    that fails is not an exception here: the gate sees the failed unit and decides. A unit that does not read the
    token file (an adopted, hand-made unit) cannot carry the token: its lines are then judged without it (the
    Mark's token is None), everything else as strictly. That is never silent: a WARNING line goes to
    ``reporter`` here, and the gate's summary in the history says ``token_checked: false``."""
    m = _mark(r, host)
    layout = Layout(host.root)
    token = releaseroot.new_parity_token()
    releaseroot.write_parity_token(r, layout, token)
    out = r.run(systemctl.restart_command(host.unit), timeout=host.service.start_timeout_s + 60).stdout
    facts = systemctl.parse_restart_output(out)
    carries_token = reads_token_file(facts.envfiles, layout.parity_env)
    if not carries_token and reporter is not None:
        reporter.info(token_warning(facts.envfiles, layout.parity_env))
    return Mark(
        old_invocation=m.old_invocation,
        cursor=m.cursor,
        n_restarts=facts.restarts or 0,
        token=token if carries_token else None,
    )


def reads_token_file(envfiles: tuple[str, ...], parity_env: str) -> bool:
    """Whether the unit's EnvironmentFiles (as systemd expanded them) include the token file itself: the exact
    path, never a substring (``/srv/kd/state/parity.env.old`` or a longer root does not count). Pure."""
    return parity_env in envfiles


def token_warning(envfiles: tuple[str, ...], parity_env: str) -> str:
    read = ", ".join(envfiles) or "none"
    return (
        f"WARNING: parity token NOT checked: the unit does not read {parity_env} (its EnvironmentFiles: {read}), so "
        "its parity lines are judged without a token and any process on the host could print a passing one; "
        "let opsctl render the unit (opsctl deploy) to check it"
    )


def _probe_times(doc: dict[str, object]) -> str:
    ready, verdict = doc.get("ready_after_s"), doc.get("verdict_after_ready_s")
    if not isinstance(ready, float | int):
        return "; the server never became ready"
    text = f"; ready {ready:.1f}s after the restart"
    return text + (f", verdict {verdict:.1f}s after ready" if isinstance(verdict, float | int) else "")


def feed_line(state: GateState, message: str, now: float, reporter: Reporter, *, split: str = "") -> LineVerdict | None:
    """One journal message into the gate, reported: parity lines with their verdict; a line that is not evidence
    (wrong or missing token, or the marker inside another message) once, with the reason, never counted. Lines
    after the decision (the rest of the poll's batch) are not reported: they count for nothing."""
    j = judge(state, message, now, split=split)
    if j is None:
        return None
    if j.after_decision:
        return j.verdict
    if j.line is None or j.verdict is LineVerdict.IGNORED:
        where = f"parity line {j.line.where}" if j.line is not None else "line"
        reporter.info(f"{INFO_IGNORED}{where}: {j.reason}: {j.raw.strip()[:160]}")
    else:
        reporter.parity(j.line, j.verdict)
    return j.verdict


def gate_traffic(host: HostConfig) -> Traffic:
    """Where the gate's parity lines come from on this host: the replay service's timer, the probe, or only the
    host's own traffic (the probe disabled)."""
    if not serves_http(host):
        return Traffic.SELF
    return Traffic.PROBE if probing(host) else Traffic.NONE


class ProbeDriver:
    """The gate's probe: before readiness each step waits (on the host, at most one poll interval) for the ready
    path's 200; after it each step sends one wave. Its findings go into the gate state by the loop."""

    def __init__(self, session: Session, host: HostConfig, state: GateState, reporter: Reporter) -> None:
        self.host, self.state, self.reporter = host, state, reporter
        self.client = ProbeClient(host, lambda: session.r)
        self.reported_not_ready = ""
        self.last_ttft_ms: tuple[float, float] | None = None

    def step(self, clock: Callable[[], float]) -> Wave | None:
        """One readiness wait or one wave; the wave is returned for the loop to feed after the unit's state."""
        state, probe = self.state, self.host.gate.probe
        # Never past the gate's deadline, and back to the loop (a journal poll) within a poll interval: no request
        # of a wave starts later, and none runs past the deadline (issue 36, item 8). A request with too little time
        # left is not started (cut short by the deadline it would say nothing about the release).
        left = state.deadline_s - (clock() - state.started_at)
        if left <= 0:
            return None
        if state.ready_at is None:
            readiness = self.client.ready(wait_s=min(self.host.gate.poll_interval_s, left))
            if readiness.ready:
                state.server_ready(clock())
                self.reporter.info(
                    f"{INFO_READY} ({readiness.describe(probe.ready_path)}) "
                    f"{clock() - state.started_at:.1f}s after the restart; sending probe waves"
                )
            else:
                state.server_not_ready(readiness.describe(probe.ready_path))
                return None
        left = state.deadline_s - (clock() - state.started_at)
        if not worth_a_wave(self.host, left):
            return None
        wave = self.client.wave(start_within_s=self.host.gate.poll_interval_s, finish_within_s=left)
        if state.probe.waves == 0 and wave.auth_error:
            self.reporter.info(f"probe: no API key sent: {wave.auth_error}")
        return wave

    def report(self, wave: Wave) -> None:
        """One progress line per wave: sent, answered, failed (first reasons), the wave's TTFT range."""
        text = f"{len(wave.requests) - wave.cut} sent, {wave.answered} answered"
        if wave.failed:
            reasons = list(dict.fromkeys(r.error or r.kind for r in wave.failed))[:3]
            text += f", {len(wave.failed)} failed ({'; '.join(reasons)})"
        if wave.cut:
            text += f", {wave.cut} cut short by the gate's deadline (not counted)"
        ttft = [r.ttft_s * 1000 for r in wave.requests if r.ok and r.ttft_s is not None]
        if ttft:
            text += f", TTFT {min(ttft):.0f}-{max(ttft):.0f} ms"
        self.reporter.info(f"{INFO_PROBE_WAVE}{self.state.probe.waves}: {text} ({wave.elapsed_s:.1f}s)")
        self.last_ttft_ms = (min(ttft), max(ttft)) if ttft else None


def gate_progress(state: GateState, now: float, last_ttft_ms: tuple[float, float] | None) -> GateProgress:
    """The gate between two polls, for a live view (pure)."""
    tally = state.probe
    return GateProgress(
        deadline_left_s=max(0.0, state.started_at + state.deadline_s - now),
        expected_ranks=state.expected_ranks,
        consecutive_passes=state.settings.consecutive_passes,
        probing=state.traffic is Traffic.PROBE,
        ready=state.traffic is not Traffic.PROBE or state.ready_at is not None,
        sent=tally.sent,
        answered=tally.answered,
        failed=tally.failed,
        waves=tally.waves,
        ttft_ms=last_ttft_ms,
        verdict=state.verdict,
    )


def run_gate(
    session: Session,
    host: HostConfig,
    mark: Mark,
    reporter: Reporter,
    *,
    deadline_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    seen_invocations: list[str] | None = None,
) -> GateState:
    """Poll the unit and its new invocation's journal until the gate decides; with the probe, wait for the
    server's readiness and send probe waves in between (docs/gate.md). ``seen_invocations``, when given, receives
    the unit's new InvocationIDs the gate saw, oldest first (the last one is what a PASS vouches for)."""
    settings = host.gate
    state = GateState(
        settings=settings,
        started_at=clock(),
        deadline_s=deadline_s or settings.deadline_s,
        baseline_restarts=mark.n_restarts,
        expected_ranks=host.service.tp,
        token=mark.token,
        traffic=gate_traffic(host),
        parity_grace_s=settings.probe.parity_grace_s,
    )
    follower = Follower(unit=host.unit, mark=mark)
    driver = ProbeDriver(session, host, state, reporter) if state.traffic is Traffic.PROBE else None
    if mark.token is None:
        reporter.info(
            f"the unit does not read {Layout(host.root).parity_env} (a unit opsctl did not render): its parity lines "
            "are judged without a token"
        )
    if state.traffic is Traffic.NONE:
        reporter.info(
            "gate.probe is disabled: the gate waits for the host's own traffic; with no parity line by the deadline "
            "the verdict is UNPROVEN"
        )
    while True:
        now = clock()
        probed = False
        try:
            wave = driver.step(clock) if driver is not None else None
            probed = driver is not None
            res = session.r.run(follower.poll_command(), timeout=max(30.0, settings.poll_interval_s * 4), check=False)
            if res.rc != 0 and "--- opsctl journal ---" not in res.stdout:
                raise DeployFailed(f"journal poll exited {res.rc}: {res.stderr.strip()[-300:]}")
            obs, entries = follower.ingest(res.stdout)
            # The unit's state first: a probe request refused because the unit died is the unit's failure.
            state.observe_unit(obs, clock())
            if wave is not None and driver is not None:
                state.probe_wave(wave, clock())
                driver.report(wave)
            for entry in entries:
                feed_line(state, entry.message, clock(), reporter, split=entry.line_break)
        except SshError as e:
            session.drop()
            state.ssh_failed(e.message, now)
            reporter.info(f"SSH trouble during the gate ({e.message}); retrying from the journal cursor")
            probed = False
        state.tick(clock())
        show_gate(reporter, gate_progress(state, clock(), driver.last_ttft_ms if driver is not None else None))
        if state.decided:
            break
        if probed:
            continue  # the readiness wait or the wave took its own time: poll again at once
        # After SSH errors back off (1, 2, 4 .. x the poll interval, at most 15 s) so a short outage is ridden out.
        backoff = 2 ** (state.ssh_failures_in_a_row - 1) if state.ssh_failures_in_a_row else 1
        sleep(min(settings.poll_interval_s * backoff, max(15.0, settings.poll_interval_s)))
    if seen_invocations is not None:
        seen_invocations.extend(follower.invocations)
    probe_doc = state.probe_summary()
    if probe_doc is not None:
        reporter.info(f"probe: {describe_tally(probe_doc)}{_probe_times(probe_doc)}")
    with contextlib.suppress(Exception):
        cursor_doc = {"unit": host.unit, "cursor": follower.cursor or "", "invocations": list(follower.invocations)}
        session.r.write_file(f"{Layout(host.root).cursors}/gate.json", (json.dumps(cursor_doc) + "\n").encode())
    return state


def gate_detail(gate: GateState) -> str:
    return f"{gate.verdict}: {gate.reason}"
