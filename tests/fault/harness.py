"""Fault-matrix harness: read a host's end state, inject faults at pipeline steps, count what was done.

Faults are real: hosts powered off (SIGKILL of the container's PID 1), sshd sessions killed on the host, disks
filled, journald restarted, an opsctl process killed with SIGKILL. A fault is triggered from the deploy's own
progress events (``FaultReporter``): "when tb2 starts its upload", "at tb2's first parity line of the gate".
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsctl import pipeline
from opsctl.fleet.rollout import HostOutcome, LineReporter, outcome_from_result
from opsctl.host import history as host_history
from opsctl.host import releaseroot
from opsctl.host.history import DeployVerdict, HistoryEvent
from opsctl.inventory import HostConfig
from opsctl.probe.answers import Wave
from opsctl.probe.traffic import ProbeClient
from opsctl.release import BUNDLE_DIRS
from opsctl.ssh import connect
from opsctl.testbed import Testbed

REPO = Path(__file__).resolve().parents[2]
SRC_ENV = "OPSCTL_FAULT_SRC"  # run the matrix against another checkout's tree


# ---------------------------------------------------------------------------------------------- counting


@dataclass
class Ledger:
    faults: int = 0
    states: int = 0
    scenarios: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def fault(self, what: str) -> None:
        with self._lock:
            self.faults += 1
            self.log.append(f"fault: {what}")

    def verified(self, what: str) -> None:
        with self._lock:
            self.states += 1
            self.log.append(f"state: {what}")

    def closing_line(self) -> str:
        return (
            f"fault matrix: {self.faults} faults injected, {self.states} host end states verified "
            f"over {len(self.scenarios)} scenarios"
        )


LEDGER = Ledger()


# ---------------------------------------------------------------------------------------------- trees


def source_root() -> Path:
    return Path(os.environ.get(SRC_ENV) or REPO)


def variant(dest: Path, tag: str) -> Path:
    """A copy of the release tree with a marker file, so its release id is new (a 'next version')."""
    src = source_root()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "build", "*.egg-info", ".pytest_cache")
    for d in BUNDLE_DIRS:
        shutil.copytree(src / d, dest / d, ignore=ignore, dirs_exist_ok=True)
    (dest / "deploy" / "VARIANT").write_text(f"{tag}\n")
    return dest


def deploy_trees() -> Any:
    """tests/pipeline/trees.py (the deploy tests' broken-release makers), loaded by path: both test folders are
    top-level packages under pytest's rootdir import mode, so neither can import the other by name."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kdtree_fault_trees", REPO / "tests" / "pipeline" / "trees.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------------------------- end state


@dataclass(frozen=True)
class HostEnd:
    host: str
    current: str | None
    active_state: str
    sub_state: str
    invocation_id: str
    n_restarts: int
    history: tuple[host_history.HistoryRecord, ...]
    lock_present: bool
    lock_owner: dict[str, Any] | None
    bad: frozenset[str]

    @property
    def running(self) -> bool:
        return self.active_state == "active" and self.sub_state == "running"

    def records_since(self, before: HostEnd) -> tuple[host_history.HistoryRecord, ...]:
        return self.history[len(before.history) :]


def read_end(host: HostConfig) -> HostEnd:
    with connect(host) as r:
        snap = releaseroot.read_snapshot(r, host.root, host.unit)
        history = host_history.read_history(r, releaseroot.Layout(host.root))
    return HostEnd(
        host=host.name,
        current=snap.current,
        active_state=snap.unit.active_state,
        sub_state=snap.unit.sub_state,
        invocation_id=snap.unit.invocation_id,
        n_restarts=snap.unit.n_restarts,
        history=tuple(history),
        lock_present=snap.lock_present,
        lock_owner=snap.lock_owner,
        bad=snap.bad,
    )


def wait_running(host: HostConfig, timeout: float = 30.0) -> HostEnd:
    """After a reboot the unit comes up by itself (it is enabled); give it a moment."""
    deadline = time.monotonic() + timeout
    end = read_end(host)
    while not end.running and time.monotonic() < deadline:
        time.sleep(0.5)
        end = read_end(host)
    return end


# ---------------------------------------------------------------------------------------------- assertions


def assert_untouched(before: HostEnd, after: HostEnd, *, rebooted: bool = False) -> None:
    """Nothing of this host changed: same release, same history, no lock, same process (unless rebooted)."""
    assert after.current == before.current, f"{after.host}: current {before.current} -> {after.current}"
    assert after.history == before.history, f"{after.host}: history grew by {after.records_since(before)}"
    assert not after.lock_present, f"{after.host}: lock left behind: {after.lock_owner}"
    assert after.running, f"{after.host}: unit {after.active_state}/{after.sub_state}"
    if not rebooted:
        assert after.invocation_id == before.invocation_id, f"{after.host}: the service was restarted"
    LEDGER.verified(f"{after.host} untouched")


def assert_deployed(after: HostEnd, release: str) -> None:
    assert after.current == release, f"{after.host}: current {after.current}, expected {release}"
    assert after.running, f"{after.host}: unit {after.active_state}/{after.sub_state}"
    assert not after.lock_present, f"{after.host}: lock left behind: {after.lock_owner}"
    last = [r for r in after.history if r.event is HistoryEvent.DEPLOY and r.release == release]
    assert last and last[-1].verdict is DeployVerdict.PASS, f"{after.host}: no PASS record for {release}"
    assert release not in after.bad
    LEDGER.verified(f"{after.host} on {release}")


def assert_not_switched(before: HostEnd, after: HostEnd, release: str) -> None:
    """A failure before the switch: old release still current and running, no lock, the new one never PASSed."""
    assert after.current == before.current, f"{after.host}: current {before.current} -> {after.current}"
    assert after.running, f"{after.host}: unit {after.active_state}/{after.sub_state}"
    assert after.invocation_id == before.invocation_id, f"{after.host}: the service was restarted"
    assert not after.lock_present, f"{after.host}: lock left behind: {after.lock_owner}"
    assert not any(r.verdict is DeployVerdict.PASS and r.release == release for r in after.records_since(before))
    LEDGER.verified(f"{after.host} not switched")


def assert_rolled_back(before: HostEnd, after: HostEnd, release: str) -> None:
    """The new release failed its gate after the switch: back on the old one, running, the new one marked bad."""
    assert after.current == before.current, f"{after.host}: current {after.current}, expected {before.current}"
    assert after.running, f"{after.host}: unit {after.active_state}/{after.sub_state}"
    assert not after.lock_present, f"{after.host}: lock left behind: {after.lock_owner}"
    assert release in after.bad, f"{after.host}: {release} not marked bad"
    new = after.records_since(before)
    assert any(r.release == release and r.verdict not in (None, DeployVerdict.PASS) for r in new), new
    LEDGER.verified(f"{after.host} rolled back from {release}")


# ---------------------------------------------------------------------------------------------- injection


Trigger = Callable[[], None]


class FaultReporter(LineReporter):
    """A deploy reporter that fires a fault once, when the host reaches a step or its first gate parity line."""

    def __init__(self, host: str, emit: Callable[[str], None], triggers: dict[str, Trigger]) -> None:
        super().__init__(host, emit)
        self.triggers = dict(triggers)
        self.lines = 0
        self.in_gate = False  # the pre-restart parity check's lines come through ``parity`` too: not the gate's

    def _fire(self, event: str) -> None:
        trigger = self.triggers.pop(event, None)
        if trigger is not None:
            self.emit(f"{self.host}: injecting fault at {event}")
            trigger()

    def step(self, name: str, detail: str = "") -> None:
        super().step(name, detail)
        self.in_gate = name == "gate"
        self._fire(name)

    def parity(self, line: object, verdict: str) -> None:
        super().parity(line, verdict)
        if not self.in_gate:
            return
        self.lines += 1
        self._fire(f"gate-line-{self.lines}")  # fired after the gate took the line in: line K decides a PASS


def deploy_action(
    src: Path,
    triggers: dict[str, dict[str, Trigger]] | None = None,
    opts: pipeline.DeployOptions | None = None,
    log: list[str] | None = None,
) -> Callable[[HostConfig], HostOutcome]:
    sink = log if log is not None else LEDGER.log
    options = opts or pipeline.DeployOptions()

    def act(host: HostConfig) -> HostOutcome:
        rep = FaultReporter(host.name, sink.append, (triggers or {}).get(host.name, {}))
        return outcome_from_result(pipeline.deploy(host, src, options, rep))

    return act


def host_testbed(host: HostConfig) -> Testbed:
    return Testbed(Path(os.path.expanduser(host.known_hosts)).parent)


KILL_OTHER_SSH_SESSIONS = r"""
import os, signal
me, anc = os.getpid(), set()
p = me
while p > 1:
    anc.add(p)
    with open(f"/proc/{p}/stat") as f:
        p = int(f.read().rsplit(")", 1)[1].split()[1])
killed = []
for d in os.listdir("/proc"):
    if not d.isdigit() or int(d) in anc:
        continue
    try:
        with open(f"/proc/{d}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")[0].decode()
    except OSError:
        continue
    if cmd.startswith("sshd: ") and "[listener]" not in cmd and not cmd.startswith("sshd: /usr/sbin/sshd"):
        try:
            os.kill(int(d), signal.SIGKILL)
            killed.append(d)
        except ProcessLookupError:
            pass
print(" ".join(killed))
"""


def cut_ssh_sessions(host: HostConfig) -> list[str]:
    """Kill, on the host, every sshd session process except the one serving this command: every open
    connection to it drops at once, as on a network cut; sshd itself keeps listening."""
    with connect(host) as r:
        out = r.run(f"python3 -c {shlex.quote(KILL_OTHER_SSH_SESSIONS)}", timeout=30).stdout
    return out.split()


def restart_journald(host: HostConfig) -> None:
    with connect(host) as r:
        r.run("systemctl restart systemd-journald.service", timeout=60)


FAKE_NVIDIA_SMI = "/usr/local/bin/nvidia-smi"


def fake_gpu(host: HostConfig, cap: str) -> None:
    """Make the host report a GPU of compute capability ``cap`` (its CUDA toolchain stays absent)."""
    script = f"#!/bin/sh\ncase \"$*\" in *name*) echo 'NVIDIA H200, {cap}';; *) echo '{cap}';; esac\n"
    with connect(host) as r:
        r.write_file(FAKE_NVIDIA_SMI, script, mode=0o755)


def remove_fake_gpu(host: HostConfig) -> None:
    with connect(host) as r:
        r.run(f"rm -f {FAKE_NVIDIA_SMI}", timeout=30)


# ---------------------------------------------------------------------------------------------- releases that misbehave


def standin_variant(dest: Path, tag: str, snippet: str) -> Path:
    """A variant whose stand-in server (the unit's program on the testbed) runs ``snippet`` first thing in
    ``serve.main()`` (module globals in scope): a release that misbehaves in a chosen way, for real, on the host.
    The pre-restart parity check runs the replay, not the server, so it passes such a release."""
    tree = variant(dest, tag)
    path = tree / "backend" / "kdtree_backend" / "serve.py"
    text = path.read_text()
    head = "def main(argv: Sequence[str] | None = None) -> int:\n"
    assert head in text, "serve.main's signature moved: update standin_variant"
    body = "".join(f"    {line}\n" for line in snippet.strip("\n").splitlines())
    path.write_text(text.replace(head, head + body, 1))
    return tree


def fault_variant(dest: Path, tag: str, fault: str) -> Path:
    """A variant whose stand-in server injects ``fault`` (``standin.fault`` of its deploy/kdtree.json:
    nan, rel-offset:X, silent-rank:R, crash-at-load, http-500; docs/testbed.md)."""
    tree = variant(dest, tag)
    config = tree / "deploy" / "kdtree.json"
    data = json.loads(config.read_text())
    data.setdefault("standin", {})["fault"] = fault
    config.write_text(json.dumps(data, indent=2) + "\n")
    return tree


# Every parity line's rel is off by one (a kernel bug the pre-restart replay does not hit).
FAILS_UNDER_THE_UNIT = "rel-offset:1.0"

# The real lines carry a wrong token, and a logged "request" carries a marked line.
FORGES_UNDER_THE_UNIT = """
import os as _os
import kdtree_backend.replay as _replay
_os.environ["KDTREE_PARITY_TOKEN"] = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0"
_real = _replay.format_parity
def _forging(layer, a, m, rel, ident, **kw):
    print("INFO: request text: please print [kdtree] L%d max_abs_diff=0 mean=0 rel=0 tp=%d" % (layer, ident.tp))
    return _real(layer, a, m, rel, ident, **kw)
_replay.format_parity = _forging
"""

# The first parity line is NaN, every later one passes.
ONE_EARLY_NAN_UNDER_THE_UNIT = """
import sys
_scheduler = sys.modules[Scheduler.__module__]  # the verify steps call its fault_parity
_real = _scheduler.fault_parity
_first = [True]
def _once_nan(fault, rank, stats):
    if _first[0]:
        _first[0] = False
        return stats[0], stats[1], float("nan")
    return _real(fault, rank, stats)
_scheduler.fault_parity = _once_nan
"""

# A long silence before the server listens (a model still loading, the port not yet open).
SLOW_START_UNDER_THE_UNIT = """
import time as _time
_time.sleep(600)
"""


def drive_traffic(host: HostConfig, requests: int = 1, max_new_tokens: int = 8, ready_s: float = 60.0) -> Wave:
    """Serve ``requests`` greedy requests of ``max_new_tokens`` new tokens on the host, once its server is ready:
    the gate's own probe program (opsctl/traffic.py), run on the host over SSH, so the traffic stays on the host's
    loopback. Idle, the stand-in prints no parity line; a test that reads lines without a deploy sends these."""
    with connect(host) as r:
        client = ProbeClient(host, lambda: r, rid_prefix="opsctl-probe-test")
        ready = client.ready(ready_s)
        assert ready.ready, f"{host.name}: the server was not ready within {ready_s:g}s: {ready.describe('/health')}"
        wave = client.wave(requests=requests, max_new_tokens=max_new_tokens)
    assert wave.answered == requests, f"{host.name}: probe requests failed: {wave.failed}"
    return wave


def running_release(host: HostConfig) -> str:
    """The release the unit's main process really runs (its working directory, resolved at its start)."""
    unit = shlex.quote(f"{host.unit}.service")
    with connect(host) as r:
        out = r.run(f'readlink -f /proc/"$(systemctl show -p MainPID --value {unit})"/cwd', timeout=30).stdout
    return out.strip().rstrip("/").rsplit("/", 1)[-1]


def assert_one_release(after: HostEnd, release: str | None) -> None:
    """Exactly one release, current and running, and the lock free."""
    assert after.current == release, f"{after.host}: current {after.current}, expected {release}"
    assert after.running, f"{after.host}: unit {after.active_state}/{after.sub_state}"
    assert not after.lock_present, f"{after.host}: lock left behind: {after.lock_owner}"
    LEDGER.verified(f"{after.host} on exactly {release}, lock free")
