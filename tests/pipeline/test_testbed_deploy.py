"""The deploy pipeline against real testbed hosts (systemd-nspawn Debian, systemd + journald + sshd).

Every test asserts the final state on the host: current release, unit state, history, lock. Hosts are shared
across the tests of this module (a good release is deployed once and reused) to keep the run short.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opsctl import pipeline as d
from opsctl.errors import DeployFailed, LockHeld, SshError
from opsctl.gate.lines import ParityLine, parse_line
from opsctl.host import history as host_history
from opsctl.host import releaseroot
from opsctl.inventory import HostConfig
from opsctl.release import make_manifest
from opsctl.ssh import connect
from opsctl.testbed import Testbed, reset_host
from tests.builders import without_comparison
from tests.pipeline import trees

# Generous: the gate ends as soon as K passes arrive; only a silent service waits this long (its test sets its own).
GATE_S = 90.0

pytestmark = pytest.mark.skipif(
    not (trees.SOURCE / "backend/kdtree_backend/replay.py").exists(),
    reason="the backend's replay service (backend/kdtree_backend/replay.py) is not in the tree yet",
)


class Recorder:
    """A Reporter that remembers what happened (and can run a hook when a step starts or a parity line comes)."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.failed_steps: list[str] = []
        self.parity_lines: list[ParityLine] = []
        self.prerestart_lines: list[ParityLine] = []
        self.infos: list[str] = []
        self.on_step: dict[str, Any] = {}
        self.on_parity: Any = None

    def step(self, name: str, detail: str = "") -> None:
        self.steps.append(name)
        if name in self.on_step:
            self.on_step.pop(name)()

    def done(self, name: str, detail: str = "") -> None: ...

    def failed(self, name: str, detail: str = "") -> None:
        self.failed_steps.append(name)

    def info(self, message: str) -> None:
        self.infos.append(message)

    def parity(self, line: ParityLine, verdict: str) -> None:
        if not self.steps or not self.steps[-1].startswith("gate"):
            self.prerestart_lines.append(line)  # the pre-restart check's lines: not the gate's
            return
        self.parity_lines.append(line)
        if self.on_parity is not None:
            hook, self.on_parity = self.on_parity, None
            hook()


def fast(host: HostConfig) -> HostConfig:
    """The testbed host (its stand-in server for SGLang, driven by the gate's probe) with a short gate, and without
    the comparison with the release replaced: the tests that use it are not about it (it has its own,
    tests/pipeline/test_testbed_comparison.py), and on a machine loaded by other work it only adds time."""
    host = without_comparison(host)
    gate = host.gate.model_copy(update={"deadline_s": GATE_S, "poll_interval_s": 0.5, "max_restarts": 2})
    return host.model_copy(update={"gate": gate})


def state(host: HostConfig) -> tuple[releaseroot.HostSnapshot, list[dict[str, Any]]]:
    """The host's snapshot and its history of deploys, restarts and rollbacks: cleanup records (written after a
    deploy, failed ones too, only when it removed releases, so their presence depends on what earlier tests left)
    are left out; tests/pipeline/test_cleanup_after_failure.py reads those."""
    with connect(host) as r:
        history = host_history.read_history(r, releaseroot.Layout(host.root))
        snap = releaseroot.read_snapshot(r, host.root, host.unit)
    return snap, [rec for rec in history if rec.event is not host_history.HistoryEvent.CLEANUP]


def assert_healthy(host: HostConfig, release: str) -> releaseroot.HostSnapshot:
    snap, _ = state(host)
    assert snap.current == release
    assert snap.unit.active_state == "active", snap.unit
    assert not snap.lock_present
    return snap


def ensure_good(host: HostConfig, tree: Path, rid: str) -> None:
    """Host runs the good release, gated PASS: reuse it when already so, else reset and deploy."""
    snap, _ = state(host)
    if snap.current == rid and snap.unit.active_state == "active" and snap.last_good == rid and not snap.lock_present:
        return
    if rid in snap.releases and rid not in snap.bad and snap.is_managed and not snap.lock_present:
        back = d.rollback(host, to=rid)  # cheaper than a deploy: switch, restart, gate
        if back.verdict == "PASS":
            return
    reset_host(host)
    res = d.deploy(host, tree, d.DeployOptions())
    assert res.verdict == "PASS", res.line()


# ------------------------------------------------------------------------------------------------ good path


def test_good_release_passes_and_redeploy_moves_little(
    tb1: HostConfig, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    reset_host(tb1)
    rec = Recorder()
    first = d.deploy(tb1, good_tree, d.DeployOptions(), rec)
    assert first.verdict == "PASS", first.line()
    assert rec.steps[:4] == ["preflight", "lock", "upload", "verify"] and "gate" in rec.steps
    assert first.gate and first.gate["pass"] >= 3 and first.gate["fail"] == 0
    snap = assert_healthy(tb1, good_id)
    assert snap.last_good == good_id and good_id not in snap.bad
    _, history = state(tb1)
    assert history[-1].verdict == "PASS" and history[-1].release == good_id
    # The unit runs from <root>/current, not from a release path.
    with connect(tb1) as r:
        unit = r.read_file(f"/etc/systemd/system/{tb1.unit}.service").decode()
        assert f"WorkingDirectory={tb1.root}/current" in unit
    # Same tree again: nothing to do. Forced: the same id, rsync sends next to nothing.
    again = d.deploy(tb1, good_tree, d.DeployOptions())
    assert again.verdict == "UP-TO-DATE"
    forced = d.deploy(tb1, good_tree, d.DeployOptions(force=True))
    assert forced.verdict == "PASS" and forced.bytes_sent is not None and first.bytes_sent is not None
    assert forced.bytes_sent < first.bytes_sent / 5
    # A one-file change hard-links the rest from the current release.
    changed = trees.copy_tree(tmp_path / "changed", "one-file-change")
    third = d.deploy(tb1, changed, d.DeployOptions())
    assert third.verdict == "PASS" and third.bytes_sent is not None and third.bytes_sent < first.bytes_sent / 2
    _print_measurements(first, forced, third)
    ensure_good(tb1, good_tree, good_id)  # leave tb1 on the good release (a normal deploy back to it)


def _print_measurements(first: d.DeployResult, forced: d.DeployResult, third: d.DeployResult) -> None:
    overhead = sum(v for k, v in first.step_times.items() if k not in ("restart", "gate", "build", "parity"))
    print(
        f"\n[measure] first deploy steps: { {k: round(v, 2) for k, v in first.step_times.items()} }"
        f"\n[measure] bytes sent: first {first.bytes_sent}, unchanged redeploy {forced.bytes_sent}, one-file change {third.bytes_sent}"
        f"\n[measure] opsctl overhead outside build/parity/restart/gate: {overhead:.2f}s of {first.elapsed_s:.1f}s"
    )


# ------------------------------------------------------------------------------------------------ failures -> rollback


@pytest.mark.skipif(
    not (trees.SOURCE / "backend/kdtree_backend/marshal.py").exists(), reason="backend marshal.py not in the tree"
)
def test_classic_bug_fails_gate_and_rolls_back(tb1: HostConfig, good_tree: Path, good_id: str, tmp_path: Path) -> None:
    ensure_good(tb1, good_tree, good_id)
    bad = trees.classic_bug(tmp_path / "bug")
    bad_id = make_manifest(bad).id
    res = d.deploy(tb1, bad, d.DeployOptions(skip_prerestart_parity=True))
    assert res.verdict == "FAIL", res.line()
    assert res.rolled_back_to == good_id and res.rollback_verdict == "PASS"
    snap = assert_healthy(tb1, good_id)
    assert bad_id in snap.bad and snap.last_good == good_id
    _, history = state(tb1)
    assert [h.verdict for h in history[-2:]] == ["FAIL", "PASS"]
    assert history[-2].release == bad_id and history[-1].event == "rollback"
    # Deploying it again is refused (marked bad) unless forced.
    with pytest.raises(DeployFailed, match="marked bad"):
        d.deploy(tb1, bad, d.DeployOptions(skip_prerestart_parity=True))


@pytest.mark.skipif(
    not (trees.SOURCE / "backend/kdtree_backend/marshal.py").exists(), reason="backend marshal.py not in the tree"
)
def test_classic_bug_caught_before_restart(tb1: HostConfig, good_tree: Path, good_id: str, tmp_path: Path) -> None:
    ensure_good(tb1, good_tree, good_id)
    before, _ = state(tb1)
    bad = trees.classic_bug(tmp_path / "bug2", tag="classic-bug-prerestart")
    rec = Recorder()
    res = d.deploy(tb1, bad, d.DeployOptions(), rec)
    # Reported like a gate failure: verdict FAIL, the failing layers' rel in the reason, the lines to the reporter.
    assert res.verdict == "FAIL" and not res.ok, res.line()
    assert res.reason.startswith("pre-restart parity L") and "rel=" in res.reason, res.reason
    assert res.line().startswith(f"tb1: deploy {make_manifest(bad).id} -> FAIL (pre-restart parity L")
    assert rec.prerestart_lines and "parity" in rec.failed_steps and "switch" not in rec.steps
    snap = assert_healthy(tb1, good_id)
    assert snap.unit.invocation_id == before.unit.invocation_id  # never restarted
    assert make_manifest(bad).id in snap.bad
    assert snap.bad_reasons[make_manifest(bad).id] == res.reason
    _, history = state(tb1)
    assert history[-1].verdict == "FAIL" and history[-1].stage == "pre-restart parity"  # not ERROR
    # A redeploy is refused for the reason it is bad, not "a failed gate".
    with pytest.raises(DeployFailed, match="marked bad there \\(pre-restart parity L"):
        d.deploy(tb1, bad, d.DeployOptions())


def test_build_failure_switches_nothing(tb1: HostConfig, good_tree: Path, good_id: str, tmp_path: Path) -> None:
    ensure_good(tb1, good_tree, good_id)
    before, _ = state(tb1)
    tree = trees.build_fails(tmp_path / "bf")
    with pytest.raises(DeployFailed, match="build failed") as e:
        d.deploy(tb1, tree, d.DeployOptions())
    assert "simulated compile failure" in e.value.message
    snap = assert_healthy(tb1, good_id)
    assert snap.unit.invocation_id == before.unit.invocation_id
    _, history = state(tb1)
    assert history[-1].verdict == "ERROR" and history[-1].release == make_manifest(tree).id


def test_crash_loop_rolls_back(tb1: HostConfig, good_tree: Path, good_id: str, tmp_path: Path) -> None:
    ensure_good(tb1, good_tree, good_id)
    tree = trees.crash_loop(tmp_path / "crash")
    res = d.deploy(tb1, tree, d.DeployOptions())
    assert res.verdict == "FAIL", res.line()
    assert "crash loop" in res.reason or "unit failed" in res.reason
    assert res.rolled_back_to == good_id and res.rollback_verdict == "PASS"
    snap = assert_healthy(tb1, good_id)
    assert make_manifest(tree).id in snap.bad


def test_no_parity_line_before_deadline_rolls_back(
    tb1: HostConfig, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    ensure_good(tb1, good_tree, good_id)
    tree = trees.silent(tmp_path / "silent")
    t = time.monotonic()
    # The deadline leaves the server (ready ~3 s after the restart, more on a loaded machine) time to get ready:
    # a silence after readiness is NODATA, a server never ready is another verdict.
    res = d.deploy(tb1, tree, d.DeployOptions(gate_timeout_s=10))
    assert res.verdict == "NODATA", res.line()
    assert 10 <= res.step_times["gate"] < 35  # decided by the deadline, not later than a few polls after it
    assert res.rolled_back_to == good_id and res.rollback_verdict == "PASS"
    assert time.monotonic() - t < 240
    snap = assert_healthy(tb1, good_id)
    assert make_manifest(tree).id in snap.bad


def test_no_restart_then_restart_rollback_on_fail(
    tb1: HostConfig, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    ensure_good(tb1, good_tree, good_id)
    before, _ = state(tb1)
    tree = trees.crash_loop(tmp_path / "staged", tag="staged-crash")
    staged = d.deploy(tb1, tree, d.DeployOptions(no_restart=True))
    assert staged.verdict == "STAGED"
    snap, _ = state(tb1)
    assert snap.current == make_manifest(tree).id and snap.unit.invocation_id == before.unit.invocation_id
    # A plain restart reports the failure and leaves the decision to the user...
    plain = d.restart(tb1)
    assert plain.verdict == "FAIL" and plain.rolled_back_to is None
    assert state(tb1)[0].current == make_manifest(tree).id
    # ... --rollback-on-fail goes back to the last good release and marks this one bad.
    res = d.restart(tb1, rollback_on_fail=True)
    assert res.verdict == "FAIL" and res.rolled_back_to == good_id and res.rollback_verdict == "PASS"
    snap = assert_healthy(tb1, good_id)
    assert make_manifest(tree).id in snap.bad


# ------------------------------------------------------------------------------------------------ lock, interrupts, faults


def test_concurrent_deploy_refused_with_owner(tb2: HostConfig, good_tree: Path, good_id: str, tmp_path: Path) -> None:
    ensure_good(tb2, good_tree, good_id)
    slow = trees.slow_build(tmp_path / "slow", seconds=8)
    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            outcome["res"] = d.deploy(tb2, slow, d.DeployOptions(), command="deploy-first")
        except Exception as e:  # recorded for the assertion below
            outcome["err"] = e

    th = threading.Thread(target=first)
    th.start()
    deadline = time.monotonic() + 20
    while not state(tb2)[0].lock_present and time.monotonic() < deadline:
        time.sleep(0.2)
    with pytest.raises(LockHeld) as e:
        d.deploy(tb2, trees.copy_tree(tmp_path / "second", "second"), d.DeployOptions(force=True))
    assert f"pid {os.getpid()}" in e.value.message and "deploy-first" in e.value.message
    th.join(120)
    assert outcome.get("res") is not None and outcome["res"].verdict == "PASS", outcome
    assert_healthy(tb2, make_manifest(slow).id)
    ensure_good(tb2, good_tree, good_id)


def test_sigint_mid_deploy_releases_lock(tb2: HostConfig, good_tree: Path, good_id: str, tmp_path: Path) -> None:
    ensure_good(tb2, good_tree, good_id)
    before, _ = state(tb2)
    slow = trees.slow_build(tmp_path / "slow", seconds=60)
    script = (
        # A child of a background job starts with SIGINT ignored; give it Python's KeyboardInterrupt handler back.
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import sys; from pathlib import Path; from opsctl import pipeline as d; from opsctl.testbed import Testbed\n"
        "h = Testbed().inventory().host('tb2')\n"
        "d.deploy(h, Path(sys.argv[1]), d.DeployOptions())\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(slow)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 30
    while not state(tb2)[0].lock_present and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # now in the build step
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # never leave it running against tb2 for the tests that follow
        _, err = proc.communicate()
        raise AssertionError(f"deploy did not stop within 60 s of SIGINT; stderr tail:\n{err[-2000:]}") from None
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    snap = assert_healthy(tb2, good_id)  # lock released, current unchanged
    assert snap.unit.invocation_id == before.unit.invocation_id
    _, history = state(tb2)
    assert history[-1].verdict == "INTERRUPTED" and history[-1].current == good_id


def test_ssh_cut_during_gate_resumes(
    tb2: HostConfig, testbed_handle: Testbed, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    ensure_good(tb2, good_tree, good_id)
    tree = trees.copy_tree(tmp_path / "cut", "ssh-cut")
    # One decode step per probe wave (3 lines a rank): the 12 passes a rank needs take 4 waves, so the gate must
    # read on after the cut at its first line (one default wave would print all of them at once).
    probe = tb2.gate.probe.model_copy(update={"requests": 1, "concurrency": 1, "max_new_tokens": 1})
    host = tb2.model_copy(update={"gate": tb2.gate.model_copy(update={"consecutive_passes": 12, "probe": probe})})
    sessions: list[Any] = []

    def tracking_connect(h: HostConfig) -> Any:
        cm = connect(h)

        class Wrapper:
            def __enter__(self) -> Any:
                r = cm.__enter__()
                sessions.append(r)
                return r

            def __exit__(self, *exc: object) -> None:
                cm.__exit__(*exc)

        return Wrapper()

    def cut() -> None:
        testbed_handle.stop_sshd("tb2")  # new connections refused for a while
        sessions[-1].client.close()  # and the live one is gone
        threading.Timer(3.0, testbed_handle.start_sshd, args=("tb2",)).start()

    rec = Recorder()
    rec.on_parity = cut
    res = d.deploy(host, tree, d.DeployOptions(), rec, connect=tracking_connect)
    assert res.verdict == "PASS", res.line()
    assert any("SSH trouble" in m for m in rec.infos) and len(sessions) >= 2
    # No line counted twice: what the gate saw is exactly the journal's parity lines, in order, up to the verdict.
    with connect(tb2) as r:
        inv = releaseroot.read_snapshot(r, tb2.root, tb2.unit).unit.invocation_id
        text = r.run(f"journalctl _SYSTEMD_INVOCATION_ID={inv} -o cat --no-pager -q", timeout=60).stdout
    journal = [p.raw for p in (parse_line(x) for x in text.splitlines()) if isinstance(p, ParityLine)]
    seen = [p.raw for p in rec.parity_lines]
    assert seen == journal[: len(seen)]
    assert res.gate and res.gate["lines"] <= len(seen)
    assert_healthy(tb2, make_manifest(tree).id)


def test_poweroff_mid_upload(
    tb2: HostConfig, testbed_handle: Testbed, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    ensure_good(tb2, good_tree, good_id)
    tree = trees.copy_tree(tmp_path / "power", "poweroff")
    rec = Recorder()
    rec.on_step["upload"] = lambda: testbed_handle.poweroff("tb2")
    try:
        with pytest.raises(SshError) as e:
            d.deploy(tb2, tree, d.DeployOptions(), rec)
        assert "tb2" in e.value.message
    finally:
        testbed_handle.boot("tb2")
    snap, _ = state(tb2)
    deadline = time.monotonic() + 30
    while snap.unit.active_state != "active" and time.monotonic() < deadline:
        time.sleep(0.5)
        snap, _ = state(tb2)
    assert snap.current == good_id and snap.unit.active_state == "active"  # the old release came back up by itself
    assert not snap.lock_present or snap.lock_stale  # a lock from before the power cut is stale, never blocking
    res = d.deploy(tb2, tree, d.DeployOptions())
    assert res.verdict == "PASS", res.line()
    assert_healthy(tb2, make_manifest(tree).id)


# ------------------------------------------------------------------------------------------------ rollback, adopt, logs


def test_rollback_with_nothing_to_roll_back_to(local: HostConfig, good_tree: Path, good_id: str) -> None:
    reset_host(local)
    with pytest.raises(DeployFailed, match="not managed"):
        d.rollback(local)
    assert d.deploy(local, good_tree, d.DeployOptions()).verdict == "PASS"
    with pytest.raises(DeployFailed, match="nothing to roll back to"):
        d.rollback(local)
    assert_healthy(local, good_id)


@pytest.fixture
def hand_made(local: HostConfig, good_tree: Path) -> Iterator[HostConfig]:
    """`local` with a hand-rsynced install and a hand-edited unit, like ct200 before opsctl (serving on the
    inventory's port, so the gate's probe reaches it as it reaches SGLang)."""
    reset_host(local)
    ext = f"{local.root}/sglang_ext"
    unit = (
        "[Unit]\nDescription=hand-made kdtree service\n[Service]\n"
        f"Environment=PYTHONPATH={ext}/kernel:{ext}/backend\nEnvironment=PYTHONUNBUFFERED=1\n"
        f"Environment=KDTREE_CONFIG={ext}/deploy/kdtree.json\nWorkingDirectory={ext}\n"
        f"ExecStart=/usr/bin/python3 -m kdtree_backend.serve --port {local.service.port} "
        f"--tp-size {local.service.tp} --load-delay 1\n"
        "[Install]\nWantedBy=multi-user.target\n"
    )
    with connect(local) as r:
        r.rsync(good_tree, ext)
        r.write_file(f"/etc/systemd/system/{local.unit}.service", unit)
        r.run(f"systemctl daemon-reload && systemctl enable --now {local.unit}.service", timeout=60)
    yield local


def test_adopt_then_deploy_then_rollback_to_release_zero(hand_made: HostConfig, good_tree: Path, good_id: str) -> None:
    host = hand_made
    with connect(host) as r:
        original_unit = r.read_file(f"/etc/systemd/system/{host.unit}.service")
    with pytest.raises(DeployFailed, match="opsctl adopt"):
        d.deploy(host, good_tree, d.DeployOptions())
    adopted = d.adopt(host)
    zero = adopted.release
    assert adopted.verdict == "ADOPTED" and zero and zero.startswith("r0-")
    snap, history = state(host)
    assert snap.current == zero and snap.last_good == zero and history[-1].event == "adopt"
    assert snap.unit.active_state == "active"
    res = d.deploy(host, good_tree, d.DeployOptions())
    assert res.verdict == "PASS", res.line()
    back = d.rollback(host)
    assert back.release == zero and back.verdict == "PASS", back.line()
    assert_healthy(host, zero)
    with connect(host) as r:
        assert r.read_file(f"/etc/systemd/system/{host.unit}.service") == original_unit
        assert r.run(f"test -d {host.root}/sglang_ext/backend", check=False).rc == 0  # the original files stay


def opsctl(*args: str, inventory: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI, as a user runs it (on the testbed's inventory, or ``inventory``)."""
    inv_path = str(inventory or Testbed().inventory_path)
    return subprocess.run(
        [sys.executable, "-m", "opsctl", "--inventory", inv_path, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=trees.REPO,
        env={**os.environ, "COLUMNS": "200"},
    )


# Quiet: the inventory's comparison judges decode speed, and beside two other workers on 2 cores an A/A deploy was
# once measured at 0.50x then 0.35x (the host's short calibration did not see the contention) and rolled back.
@pytest.mark.quiet
def test_cli_deploy_status_logs(local: HostConfig, good_tree: Path, good_id: str, tmp_path: Path) -> None:
    ensure_good(local, good_tree, good_id)
    # The CLI deploy: progress per step, one verdict line, exit 0 on PASS (testbed inventory settings).
    tree = trees.copy_tree(tmp_path / "cli", "cli")
    res = opsctl("deploy", "local", "--yes", "--src", str(tree), "--gate-timeout", "60")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "upload" in res.stdout and "gate" in res.stdout
    assert f"local: deploy {make_manifest(tree).id} -> PASS" in res.stdout
    st = opsctl("status", "local", "--json")
    assert st.returncode == 0 and f'"current": "{make_manifest(tree).id}"' in st.stdout
    shapes = opsctl("logs", "local", "--grep", "shapes", "--lines", "300")
    assert shapes.returncode == 0, shapes.stderr
    assert "shapes" in shapes.stdout and "q=(" in shapes.stdout and "query tokens" in shapes.stdout
    parity = opsctl("logs", "local", "--grep", "parity", "--json", "--lines", "300")
    assert parity.returncode == 0 and '"kind": "parity"' in parity.stdout
    rel = opsctl("releases", "local")
    assert rel.returncode == 0 and good_id in rel.stdout
    dry = opsctl("deploy", "local", "--dry-run", "--src", str(good_tree))
    assert dry.returncode == 0 and "PLANNED" in dry.stdout
    assert_healthy(local, make_manifest(tree).id)  # the dry run changed nothing
