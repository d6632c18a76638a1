"""opsctl/testbed/procfs.py on this machine's own processes: what /proc says, read the way the testbed reads it
about its hosts."""

from __future__ import annotations

import os
import subprocess
import sys

from opsctl.testbed.procfs import children, cmdline, container_init, pidns, proc_alive, root_mount


def test_a_child_is_alive_until_it_exits_and_is_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert proc_alive(child.pid) and child.pid in children(os.getpid())
        assert cmdline(child.pid)[:2] == [sys.executable, "-c"]
        assert container_init(os.getpid()) is None  # its children share our pid namespace: no container here
    finally:
        child.kill()
        child.wait()
    assert not proc_alive(child.pid) and not proc_alive(None)


def test_namespace_and_root_of_this_process() -> None:
    assert pidns(os.getpid()) is not None and pidns(os.getpid()) == pidns(os.getppid())
    root = root_mount(os.getpid())
    assert root is not None and root[0] == "/"
