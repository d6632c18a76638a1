"""The restart and the gate loop: restart the unit with a fresh parity token, then follow its new invocation's
journal into the gate until it decides."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from .. import hoststate as hs
from ..errors import DeployFailed, SshError
from ..gate import GateState, LineVerdict, judge
from ..host import unit as unit_commands
from ..host.journal import mark_command
from ..host.remote import Remote
from ..hoststate import Layout
from ..inventory import HostConfig
from ..journal import Follower, Mark, parse_mark
from .report import Reporter
from .session import Session


def _mark(r: Remote, host: HostConfig) -> Mark:
    return parse_mark(r.run(mark_command(host.unit), timeout=60).stdout)


def restart_unit(r: Remote, host: HostConfig) -> Mark:
    """Record the journal position + old invocation, hand the next invocation a fresh parity token, restart, and
    read the restart counter baseline.

    A unit that hit its start limit (a crash loop) is reset first, else systemd refuses the restart. A start job
    that fails is not an exception here: the gate sees the failed unit and decides. A unit that does not read the
    token file (an adopted, hand-made unit) cannot carry the token: its lines are then judged without it (the
    Mark's token is None), everything else as strictly."""
    m = _mark(r, host)
    layout = Layout(host.root)
    token = hs.new_parity_token()
    hs.write_parity_token(r, layout, token)
    out = r.run(unit_commands.restart_command(host.unit), timeout=host.service.start_timeout_s + 60).stdout
    facts = dict(line.partition("=")[::2] for line in out.splitlines() if "=" in line)
    restarts = facts.get("restarts", "").strip()
    carries_token = layout.parity_env in facts.get("envfiles", "")
    return Mark(
        old_invocation=m.old_invocation,
        cursor=m.cursor,
        n_restarts=int(restarts) if restarts.isdigit() else 0,
        token=token if carries_token else None,
    )


def feed_line(state: GateState, message: str, now: float, reporter: Reporter) -> LineVerdict | None:
    """One journal message into the gate, reported: parity lines with their verdict; a line that is not evidence
    (wrong or missing token, or the marker inside another message) once, with the reason, never counted."""
    j = judge(state, message, now)
    if j is None:
        return None
    if j.line is None or j.verdict is LineVerdict.IGNORED:
        where = f"parity line {j.line.where}" if j.line is not None else "line"
        reporter.info(f"ignored {where}: {j.reason}: {j.raw.strip()[:160]}")
    else:
        reporter.parity(j.line, str(j.verdict))
    return j.verdict


def run_gate(
    session: Session,
    host: HostConfig,
    mark: Mark,
    reporter: Reporter,
    *,
    deadline_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> GateState:
    """Poll the unit and its new invocation's journal until the gate decides."""
    settings = host.gate
    state = GateState(
        settings=settings,
        started_at=clock(),
        deadline_s=deadline_s or settings.deadline_s,
        baseline_restarts=mark.n_restarts,
        expected_ranks=host.service.tp,
        token=mark.token,
    )
    follower = Follower(unit=host.unit, mark=mark)
    if mark.token is None:
        reporter.info(
            f"the unit does not read {Layout(host.root).parity_env} (a unit opsctl did not render): its parity lines "
            "are judged without a token"
        )
    while True:
        now = clock()
        try:
            res = session.r.run(follower.poll_command(), timeout=max(30.0, settings.poll_interval_s * 4), check=False)
            if res.rc != 0 and "--- opsctl journal ---" not in res.stdout:
                raise DeployFailed(f"journal poll exited {res.rc}: {res.stderr.strip()[-300:]}")
            obs, entries = follower.ingest(res.stdout)
            for entry in entries:
                feed_line(state, entry.message, clock(), reporter)
            state.observe_unit(obs, clock())
        except SshError as e:
            session.drop()
            state.ssh_failed(e.message, now)
            reporter.info(f"SSH trouble during the gate ({e.message}); retrying from the journal cursor")
        state.tick(clock())
        if state.decided:
            break
        # After SSH errors back off (1, 2, 4 .. x the poll interval, at most 15 s) so a short outage is ridden out.
        backoff = 2 ** (state.ssh_failures_in_a_row - 1) if state.ssh_failures_in_a_row else 1
        sleep(min(settings.poll_interval_s * backoff, max(15.0, settings.poll_interval_s)))
    with contextlib.suppress(Exception):
        cursor_doc = (
            f'{{"unit": "{host.unit}", "cursor": "{follower.cursor or ""}", "invocations": {follower.invocations!r}}}\n'
        )
        session.r.write_file(f"{Layout(host.root).cursors}/gate.json", cursor_doc.replace("'", '"').encode())
    return state
