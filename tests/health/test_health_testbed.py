"""Health checks against booted testbed hosts: real systemd units, journald, sshd, disks. No mocks.

The unit under check is a small stand-in service installed under the real unit name, so each check meets the
real thing it reads (NRestarts, InvocationID, journal lines) without depending on the deploy pipeline.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl.health.checks import check_hosts
from opsctl.health.levels import HostHealth, Level
from opsctl.health.localstate import HealthHistory
from opsctl.health.probe import ssh_probe
from opsctl.inventory import HostConfig, Inventory
from opsctl.release import FileEntry, Manifest, release_id
from opsctl.ssh import connect
from opsctl.testbed import reset_host

# The testbed's hosts run TP 2: every rank must have spoken for parity to be OK.
PASS_LINES = "; ".join(
    f"echo '[2026-05-31 13:04:12 TP{rank}] [kdtree] L3 max_abs_diff=1.0e-03 mean=1.0e-04 rel=2.0e-03 tp={rank}'"
    for rank in (0, 1)
)
FAIL_LINE = "[2026-05-31 13:04:12 TP1] [kdtree] L56 max_abs_diff=1.6934e+00 mean=1.1948e-01 rel=1.0837e+00 tp=1"


def install_unit(host: HostConfig, exec_start: str, *, restart: str = "no") -> None:
    """A stand-in service under the host's unit name (started, so it has an invocation and a journal)."""
    unit = (
        "[Unit]\nDescription=health-check stand-in\n[Service]\n"
        f"ExecStart=/bin/sh -c {shlex.quote(exec_start)}\nRestart={restart}\nRestartSec=0.2\n"
        "StartLimitIntervalSec=0\n[Install]\nWantedBy=multi-user.target\n"
    )
    name = f"{host.unit}.service"
    with connect(host) as r:
        r.write_file(f"/etc/systemd/system/{name}", unit)
        r.run(f"systemctl daemon-reload && systemctl restart {shlex.quote(name)}", timeout=60)


def install_release(host: HostConfig, files: dict[str, str]) -> str:
    """A release directory with a manifest, and `current` pointing at it (docs/release-layout.md)."""
    entries = tuple(
        FileEntry(p, hashlib.sha256(t.encode()).hexdigest(), len(t.encode()), False) for p, t in sorted(files.items())
    )
    manifest = Manifest(release_id(entries), entries, None, None, "test", "now", "0")
    rel = f"{host.root}/releases/{manifest.id}"
    with connect(host) as r:
        r.run(f"mkdir -p {shlex.quote(host.root)}/state", timeout=30)
        for path, text in files.items():
            r.run(f"mkdir -p {shlex.quote(os.path.dirname(f'{rel}/{path}'))}", timeout=30)
            r.write_file(f"{rel}/{path}", text)
        r.write_file(f"{rel}/manifest.json", manifest.to_json())
        r.run(f"ln -sfn releases/{manifest.id} {shlex.quote(host.root)}/current", timeout=30)
    return manifest.id


def check(host: HostConfig, history: HealthHistory) -> HostHealth:
    return check_hosts([host], ssh_probe, history).results[0]


@pytest.fixture
def tb1(testbed: Inventory, tmp_path: Path) -> Iterator[HostConfig]:
    """tb1 as a host whose unit has no HTTP port (service.mode replay): the units installed here only print."""
    served = testbed.host("tb1")
    host = served.model_copy(update={"service": served.service.model_copy(update={"mode": "replay"})})
    reset_host(host)
    yield host
    reset_host(host)


@pytest.fixture
def history(tmp_path: Path) -> HealthHistory:
    return HealthHistory(tmp_path / "health-history.jsonl")


def test_healthy_host_then_drift_and_parity_failure(tb1: HostConfig, history: HealthHistory) -> None:
    release = install_release(tb1, {"kernel/a.cu": "// kernel\n", "backend/b.py": "x = 1\n"})
    install_unit(tb1, f"{PASS_LINES}; exec sleep infinity")
    time.sleep(0.5)  # journald has the line
    t0 = time.monotonic()
    ok = check(tb1, history)
    elapsed = time.monotonic() - t0
    levels = {c.name: c.level for c in ok.checks}
    assert levels["unit"] is Level.OK and levels["drift"] is Level.OK and levels["parity"] is Level.OK
    assert levels["http"] is Level.SKIP and levels["gpu"] is Level.SKIP  # no HTTP port (replay mode), no GPU expected
    assert ok.release == release and ok.invocation_id
    print(f"health-check run time for one testbed host: {elapsed:.2f}s")

    # a hand edit on the host is drift
    with connect(tb1) as r:
        r.run(f"echo '# hotfix' >> {shlex.quote(tb1.root)}/current/backend/b.py", timeout=30)
    drift = check(tb1, history).check("drift")
    assert drift is not None and drift.level is Level.CRIT and "backend/b.py" in drift.detail

    # a failing parity line from the current invocation (TP1) is CRIT; the earlier invocation's lines do not count
    install_unit(tb1, f"echo {shlex.quote(FAIL_LINE)}; exec sleep infinity")
    time.sleep(0.5)
    bad = check(tb1, history)
    parity = bad.check("parity")
    assert parity is not None and parity.level is Level.CRIT and "L56 TP1" in parity.detail
    assert bad.wants_rollback


def test_crash_loop_is_crit_and_a_stopped_unit_a_warning(tb1: HostConfig, history: HealthHistory) -> None:
    install_unit(tb1, "exit 1", restart="always")
    time.sleep(1.5)
    unit = check(tb1, history).check("unit")
    assert unit is not None and unit.level is Level.CRIT
    install_unit(tb1, "exec sleep infinity")
    first = check(tb1, history).check("unit")
    assert first is not None and first.level is Level.OK  # a manual restart reset NRestarts
    with connect(tb1) as r:
        r.run(f"systemctl stop {tb1.unit}.service", timeout=60)
    stopped_run = check(tb1, history)
    stopped = stopped_run.check("unit")
    # An operator's stop (inactive, not failed) is not evidence against the release: WARN, never a rollback.
    assert stopped is not None and stopped.level is Level.WARN and "stopped" in stopped.detail
    assert not stopped_run.wants_rollback


def test_stale_lock_of_a_dead_opsctl_and_a_live_one(tb1: HostConfig, history: HealthHistory) -> None:
    install_release(tb1, {"kernel/a.cu": "k\n"})
    gone = os.fork()
    if gone == 0:
        os._exit(0)
    os.waitpid(gone, 0)
    owner = {
        "token": "t",
        "user": "root",
        "client": socket.gethostname(),
        "pid": gone,
        "command": "deploy",
        "since": "x",
    }
    with connect(tb1) as r:
        r.run(f"mkdir -p {shlex.quote(tb1.root)}/state/lock", timeout=30)
        r.write_file(f"{tb1.root}/state/lock/owner.json", json.dumps(owner))
    lock = check(tb1, history).check("lock")
    assert lock is not None and lock.level is Level.CRIT and f":{gone}" in lock.detail
    with connect(tb1) as r:
        r.write_file(f"{tb1.root}/state/lock/owner.json", json.dumps({**owner, "pid": os.getpid()}))
    live = check(tb1, history).check("lock")
    assert live is not None and live.level is Level.OK and "in progress" in live.detail


def test_unreachable_and_full_disk(testbed: Inventory, tb1: HostConfig, history: HealthHistory) -> None:
    from opsctl.testbed import Testbed

    tb = Testbed(Path(os.path.expanduser(tb1.known_hosts)).parent)
    tb.fill_disk("tb1")
    try:
        disk = check(tb1, history).check("disk")
        assert disk is not None and disk.level is Level.CRIT
    finally:
        tb.free_disk("tb1")
    tb.stop_sshd("tb1")
    try:
        t0 = time.monotonic()
        down = check(tb1, history)
        assert down.level is Level.CRIT and down.check("ssh").level is Level.CRIT  # type: ignore[union-attr]
        assert time.monotonic() - t0 < tb1.connect_timeout_s + 5
    finally:
        tb.start_sshd("tb1")


def test_hostile_http_path_is_data_not_shell(testbed: Inventory, tb1: HostConfig, history: HealthHistory) -> None:
    # passes the inventory's shell checks ($ without "(", quotes, spaces) and would run `touch` if interpolated
    hostile = tb1.model_copy(
        update={
            "service": tb1.service.model_copy(update={"mode": "sglang", "port": 39999}),
            "health": tb1.health.model_copy(update={"http_path": "/h' $IFS'x\" touch /tmp/pwned '"}),
        }
    )
    install_unit(tb1, "exec sleep infinity")
    http = check(hostile, history).check("http")
    assert http is not None and http.level is Level.CRIT  # nothing listens on 39999
    with connect(tb1) as r:
        assert r.run("test -e /tmp/pwned", check=False).rc != 0
