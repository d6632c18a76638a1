"""The probe's host-side program run as a local process on a scratch release root (no SSH): what it finds, and how
the findings evaluate. The same program runs on testbed hosts over SSH in test_health_testbed.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from opsctl.health.checks import evaluate
from opsctl.health.levels import Level
from opsctl.health.probe import (
    facts_from_probe,
    lock_owner,
    pid_alive,
    probe_command,
    probe_params,
    probe_payload,
    read_probe,
)
from opsctl.release import FileEntry, Manifest, release_id
from tests.builders import host


def make_release(root: Path) -> Path:
    rel = root / "releases" / "rtmp"
    (rel / "kernel").mkdir(parents=True)
    (rel / "backend").mkdir()
    (rel / "kernel" / "a.cu").write_text("kernel source\n")
    (rel / "backend" / "b.py").write_text("print('x')\n")
    entries = tuple(
        FileEntry(p, hashlib.sha256((rel / p).read_bytes()).hexdigest(), (rel / p).stat().st_size, False)
        for p in ("kernel/a.cu", "backend/b.py")
    )
    m = Manifest(release_id(entries), entries, None, None, "t", "now", "0")
    (rel / "manifest.json").write_text(m.to_json())
    (rel / "kernel" / "build").mkdir()
    (rel / "kernel" / "build" / "ext.so").write_bytes(b"\0built")  # a build output: not in the manifest
    (root / "current").symlink_to("releases/rtmp")
    (root / "state").mkdir()
    return rel


def probe_locally(h, path: str | None = None):  # type: ignore[no-untyped-def]
    params = probe_params(h)
    cmd = probe_command(params, python=sys.executable)
    env = {**os.environ, "PATH": path} if path is not None else None
    out = subprocess.run(
        ["/bin/sh", "-c", cmd],
        input=probe_payload(params),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    ).stdout
    return read_probe(out)


def facts(h, probed):  # type: ignore[no-untyped-def]
    system, raw = probed
    return facts_from_probe(
        h,
        system,
        raw,
        local_time=time.time(),
        elapsed_s=0.1,
        lock_owner=lock_owner,
        pid_alive=pid_alive,
        local_hostname="me",
    )


def test_probe_finds_release_disk_and_drift(tmp_path: Path) -> None:
    rel = make_release(tmp_path)
    h = host(root=str(tmp_path), gpu_arch=None, service={"mode": "replay"})
    result = evaluate(h, facts(h, probe_locally(h)))
    assert result.release == "rtmp"
    assert result.check("drift").level is Level.OK  # type: ignore[union-attr]
    assert result.check("disk").value and result.check("disk").value > 0  # type: ignore[union-attr]
    assert result.check("lock").level is Level.OK  # type: ignore[union-attr]
    (rel / "backend" / "b.py").write_text("print('hand edit')\n")
    (rel / "kernel" / "a.cu").unlink()
    drifted = evaluate(h, facts(h, probe_locally(h))).check("drift")
    assert drifted is not None and drifted.level is Level.CRIT
    assert "backend/b.py" in drifted.detail and "kernel/a.cu" in drifted.detail


def test_probe_without_a_release_is_crit(tmp_path: Path) -> None:
    h = host(root=str(tmp_path / "nothing"), gpu_arch=None, service={"mode": "replay"})
    r = evaluate(h, facts(h, probe_locally(h)))
    assert r.check("drift").level is Level.CRIT and "no current release" in r.check("drift").detail  # type: ignore[union-attr]


def test_lock_of_a_dead_local_owner_is_stale(tmp_path: Path) -> None:
    make_release(tmp_path)
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock = tmp_path / "state" / "lock"
    lock.mkdir()
    (lock / "owner.json").write_text(json.dumps({"client": "me", "pid": dead.pid, "user": "u", "since": "x"}))
    h = host(root=str(tmp_path), gpu_arch=None, service={"mode": "replay"})
    stale = evaluate(h, facts(h, probe_locally(h))).check("lock")
    assert stale is not None and stale.level is Level.CRIT and str(dead.pid) in stale.detail
    (lock / "owner.json").write_text(json.dumps({"client": "me", "pid": os.getpid()}))
    live = evaluate(h, facts(h, probe_locally(h))).check("lock")
    assert live is not None and live.level is Level.OK


def test_gpu_expected_but_no_nvidia_smi_is_crit(tmp_path: Path) -> None:
    make_release(tmp_path)
    h = host(root=str(tmp_path), gpu_arch="12.0", service={"mode": "replay"})
    raw = probe_locally(h, path="/nonexistent")
    gpu = evaluate(h, facts(h, raw)).check("gpu")
    assert gpu is not None and gpu.level is Level.CRIT


def test_gpu_facts_come_from_the_shared_probe_parser() -> None:
    from opsctl.hostdata.facts import parse_facts

    system = parse_facts("gpu_rc=0\ngpu=NVIDIA H200, 9.0\ngpu=NVIDIA H200, 9.0\ndisk_avail_kb=1048576\n")
    raw = {"release_error": "[Errno 2] No such file or directory: '/x'"}
    h200 = host(gpu_arch="9.0", service={"mode": "replay"})
    run = facts_from_probe(
        h200,
        system,
        raw,
        local_time=0.0,
        elapsed_s=0.1,
        lock_owner=lock_owner,
        pid_alive=pid_alive,
        local_hostname="me",
    )
    assert run.gpu is not None and run.gpu.gpus == (("NVIDIA H200", "9.0"), ("NVIDIA H200", "9.0"))
    assert run.disk_free_mb == 1024.0
    assert evaluate(h200, run).check("gpu").level is Level.OK  # type: ignore[union-attr]
    wrong = host(gpu_arch="12.0", service={"mode": "replay"})
    assert evaluate(wrong, facts(wrong, (system, raw))).check("gpu").level is Level.CRIT  # type: ignore[union-attr]
    cpu = host(gpu_arch=None, service={"mode": "replay"})
    assert facts(cpu, (system, raw)).gpu is None  # not expected: not looked at
