"""Booting and stopping a host with systemd-nspawn: systemd as PID 1, its sshd answering on the host's loopback
port when it is ready; an orderly poweroff, or a pulled plug; a command run inside it without ssh."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

from ..errors import TestbedError
from . import hostdir, procfs
from .localrun import run
from .ports import PORT_BASE_ENV, port_in_use, sshd_answers
from .statedir import StateDir

BOOT_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


def start(tb: StateDir, name: str) -> float:
    """Boot a provisioned host and wait for its sshd. Returns the seconds it took."""
    st = tb.state(name)
    if tb.running(name):
        return 0.0
    if port_in_use(st.port):
        raise TestbedError(
            f"port {st.port} on 127.0.0.1 is already in use, so {name}'s sshd cannot listen there; stop what "
            f"uses it or pick other ports with {PORT_BASE_ENV}"
        )
    hostdir.mount_rootfs(tb, name)
    hostdir.mount_disk(tb, name)
    console = tb.host_dir(name) / "console.log"
    argv = [
        "systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--boot", "--link-journal=no",
        "--console=read-only", f"--machine={st.machine}", f"--hostname={name}",
        f"--bind={tb.disk(name)}:/root", "-D", str(tb.rootfs(name)),
    ]  # fmt: skip
    begin = time.monotonic()
    with open(console, "ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    st.pid, st.init_pid, st.pidns, st.booted_at, st.boot_s = proc.pid, None, None, time.time(), None
    tb.save_state(st)
    deadline = begin + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = "\n".join(console.read_text(errors="replace").splitlines()[-15:])
            raise TestbedError(f"{name} did not boot: systemd-nspawn exited {proc.returncode}; {console}:\n{tail}")
        if st.init_pid is None:
            st.init_pid = procfs.container_init(proc.pid)
            st.pidns = procfs.pidns(st.init_pid) if st.init_pid else None
        if sshd_answers(st.port, timeout=0.5):
            st.boot_s = time.monotonic() - begin
            tb.save_state(st)
            return st.boot_s
        time.sleep(0.1)
    raise TestbedError(
        f"{name} booted but its sshd did not answer on 127.0.0.1:{st.port} within {BOOT_TIMEOUT_S:g}s; see {console}"
    )


def stop(tb: StateDir, name: str, *, hard: bool) -> None:
    """Shut a host down (SIGTERM to nspawn: orderly poweroff) or kill it (SIGKILL to its PID 1)."""
    st = tb.state(name)
    if not tb.running(name):  # also guards against a recycled pid
        return
    assert st.pid is not None
    init = procfs.container_init(st.pid)
    if hard and init:
        with contextlib.suppress(ProcessLookupError):
            os.kill(init, signal.SIGKILL)  # the kernel kills the whole pid namespace with it
    else:
        with contextlib.suppress(ProcessLookupError):
            os.kill(st.pid, signal.SIGTERM)  # nspawn turns it into SIGRTMIN+3: systemd's orderly poweroff
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while procfs.proc_alive(st.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if procfs.proc_alive(st.pid):
        if init:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)
        time.sleep(0.5)
        with contextlib.suppress(ProcessLookupError):
            os.kill(st.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while procfs.proc_alive(st.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    if procfs.proc_alive(st.pid):
        raise TestbedError(f"{name}: systemd-nspawn (pid {st.pid}) does not exit")


def nsenter(tb: StateDir, name: str, argv: list[str], timeout: float = 60) -> None:
    """Run a command inside a running host without ssh (for fault injection on sshd itself)."""
    st = tb.state(name)
    if not tb.running(name) or not st.init_pid:
        raise TestbedError(f"{name} is not running")
    run(
        ["nsenter", "-t", str(st.init_pid), "-m", "-u", "-i", "-p", "-r", "-w", *argv],
        timeout=timeout,
        what=" ".join(argv),
    )
