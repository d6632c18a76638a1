"""The testbed itself: a private testbed (own directory and ports, shared rootfs cache) is booted, has faults
injected, and is brought up and down twice; nothing of it may be left running or mounted."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from opsctl.errors import CommandFailed, HostUnreachable
from opsctl.fleet.ping import ping
from opsctl.inventory import HostConfig, Inventory
from opsctl.ssh import connect
from opsctl.testbed import Testbed, reset_host


def _free_port_base(start: int = 2400, width: int = 4) -> int:
    """A run of free loopback ports (other testbeds may be up on this machine)."""
    for base in range(start, start + 2000, 10):
        if all(_port_free(p) for p in range(base, base + width)):
            return base
    raise AssertionError("no free port range for a private testbed")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


PRIVATE_PORT_BASE = _free_port_base()


def _processes_rooted_in(marker: str) -> list[int]:
    """Processes whose "/" is a mount whose source starts with ``marker`` (a testbed host's overlay)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            for line in (d / "mountinfo").read_text().splitlines():
                fields = line.split()
                if fields[4] == "/" and fields[fields.index("-") + 2].startswith(marker):
                    found.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def _mounts_under(path: Path) -> list[str]:
    return [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if line.split()[4].startswith(f"{path}/")
    ]


def _processes_naming(text: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def private(testbed_handle: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """local + tb1 in a directory of their own; the rootfs cache of the main testbed is reused."""
    tb = Testbed(tmp_path_factory.mktemp("tb"), cache_dir=testbed_handle.cache_dir, port_base=PRIVATE_PORT_BASE)
    tb.up(1)
    yield tb
    tb.down()


def test_hosts_are_real_systemd_machines(private: Testbed) -> None:
    inv = private.inventory()
    assert list(inv.hosts) == ["local", "tb1"] and inv.groups == {"testbed": ("local", "tb1"), "fleet": ("tb1",)}
    ids = set()
    for host in inv.hosts.values():
        with connect(host) as r:
            out = r.run(
                "hostname; cat /etc/machine-id; readlink /proc/1/exe; systemctl is-system-running --wait"
            ).stdout.split()
            hostname, machine_id, pid1, state = out
            assert hostname == host.name and pid1.endswith("systemd") and state in ("running", "degraded")
            ids.add(machine_id)
            assert r.run("python3 -c 'import torch, numpy; print(torch.__version__)'").stdout.startswith("2.13.0")
            r.run("journalctl -b --no-pager -n 1 -u ssh.service")  # journald answers
    assert len(ids) == 2  # each host its own machine-id


def test_status_reports_each_host(private: Testbed) -> None:
    st = {h.name: h for h in private.status()}
    assert set(st) == {"local", "tb1"}
    assert all(h.state == "running" and h.sshd and h.boot_s and h.boot_s < 60 for h in st.values())
    assert st["tb1"].port == PRIVATE_PORT_BASE + 1


def test_poweroff_and_boot_keep_the_disk(private: Testbed) -> None:
    host = private.inventory().host("tb1")
    with connect(host) as r:
        r.write_file("/root/survives", "yes\n")
        boot_id = r.read_file("/proc/sys/kernel/random/boot_id")
    private.poweroff("tb1")
    assert not private.running("tb1")
    with pytest.raises(HostUnreachable):
        with connect(host):
            pass
    private.boot("tb1")
    with connect(host) as r:
        assert r.read_file("/root/survives") == b"yes\n"
        assert r.read_file("/proc/sys/kernel/random/boot_id") != boot_id  # a new boot
        assert r.run("systemctl is-system-running --wait", check=False).stdout.strip() in ("running", "degraded")


def test_stop_sshd_refuses_new_sessions_but_keeps_open_ones(private: Testbed) -> None:
    host = private.inventory().host("tb1")
    with connect(host) as open_session:
        private.stop_sshd("tb1")
        try:
            with pytest.raises(HostUnreachable):
                with connect(host):
                    pass
            assert open_session.run("echo still-here").stdout.strip() == "still-here"
        finally:
            private.start_sshd("tb1")
    with connect(host) as r:
        assert r.run("systemctl is-active ssh.service").stdout.strip() == "active"


def test_fill_disk_makes_writes_fail_and_ping_report_it(private: Testbed) -> None:
    host = private.inventory().host("tb1")
    private.fill_disk("tb1")
    try:
        facts = ping(host)
        assert facts.disk_ok is False and facts.disk_free_mb is not None and facts.disk_free_mb < host.min_free_disk_mb
        with connect(host) as r, pytest.raises(CommandFailed) as exc:
            r.run("mkdir -p /root/kdtree-engine && head -c 2000000 /dev/zero > /root/kdtree-engine/big")
        assert "No space left" in exc.value.stderr_tail
    finally:
        private.free_disk("tb1")
    assert ping(host).disk_ok is True


def test_reset_host_removes_unit_and_release_root(private: Testbed) -> None:
    host = private.inventory().host("tb1")
    unit = f"{host.unit}.service"
    with connect(host) as r:
        r.run(f"mkdir -p {host.root}/releases/x")
        r.write_file(f"/etc/systemd/system/{unit}", "[Service]\nExecStart=/bin/sleep infinity\n")
        r.run(f"systemctl daemon-reload && systemctl start {unit}")
        assert r.run(f"systemctl is-active {unit}").stdout.strip() == "active"
    private.poweroff("tb1")  # reset_host also brings a powered-off host back
    reset_host(host)
    with connect(host) as r:
        assert r.run(f"test -e {host.root}", check=False).rc == 1
        assert r.run(f"systemctl show {unit} -p LoadState --value").stdout.strip() == "not-found"
        assert r.run("systemctl --failed --no-legend").stdout.strip() == ""


def test_ping_cli_reports_real_systemd_and_sshd_facts(testbed: Inventory) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "opsctl", "--inventory", str(testbed.path), "ping", "local", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr
    (facts,) = json.loads(proc.stdout)
    assert facts["host"] == "local" and facts["ok"] and facts["reachable"] and facts["auth"]
    assert facts["hostname"] == "local"
    assert facts["system_state"] in ("running", "degraded") and int(facts["systemd_version"]) >= 252
    assert facts["sshd_version"].startswith("SSH-2.0-OpenSSH_") and facts["sshd_active"] == "active"
    assert facts["unit"]["LoadState"] in ("loaded", "not-found") and "ActiveState" in facts["unit"]
    assert facts["gpus"] == [] and facts["disk_free_mb"] > 0 and facts["disk_path"].startswith("/root")


def test_ping_cli_failure_is_one_red_line_and_exit_code(testbed: Inventory, tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    local: HostConfig = testbed.host("local")
    inv.write_text(
        f"hosts:\n  gone:\n    address: 127.0.0.1\n    port: 1\n    connect_timeout_s: 2\n    known_hosts: {local.known_hosts}\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "opsctl", "ping", "gone"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "OPSCTL_INVENTORY": str(inv)},
    )
    assert proc.returncode == HostUnreachable.exit_code
    assert "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        line for line in proc.stderr.splitlines() if line.strip()
    ]


def test_up_down_twice_leaves_nothing_running(private: Testbed) -> None:
    marker = f"kdtb-{private.tag}-"
    ports = [PRIVATE_PORT_BASE, PRIVATE_PORT_BASE + 1]
    for _ in range(2):
        start = time.monotonic()
        report = private.up(1)
        assert [h.name for h in report.hosts] == ["local", "tb1"] and all(h.sshd for h in report.hosts)
        assert time.monotonic() - start < 120
        assert _processes_rooted_in(marker) and _mounts_under(private.state_dir)  # the checks below can see hosts
        again = private.up(1)  # idempotent: the running hosts are kept
        assert [h.pid for h in again.hosts] == [h.pid for h in report.hosts]
        private.down()
        assert _processes_rooted_in(marker) == []
        assert _processes_naming(marker) == [] and _processes_naming(str(private.state_dir)) == []
        assert _mounts_under(private.state_dir) == []
        assert [p for p in ports if not _port_free(p)] == []
        assert private.status() == []
    private.up(1)  # leave it up for the fixture's own teardown


def test_ping_group_in_parallel_keeps_order(testbed: Inventory) -> None:
    from opsctl.fleet.ping import ping_many

    hosts = testbed.resolve("testbed")
    facts = ping_many(hosts)
    assert [f.host for f in facts] == [h.name for h in hosts]
    assert all(f.ok and f.hostname == f.host for f in facts)


def test_cli_accept_new_host_key_flag_reaches_the_ssh_layer(testbed: Inventory, tmp_path: Path) -> None:
    local = testbed.host("local")
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    inv = tmp_path / "inv.yaml"
    inv.write_text(
        f"hosts:\n  local:\n    address: 127.0.0.1\n    port: {local.port}\n    identity_file: {local.identity_file}\n"
        f"    known_hosts: {kh}\n    gpu_arch: null\n"
    )

    def opsctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "opsctl", "-i", str(inv), *args],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    refused = opsctl("ping", "local")
    assert refused.returncode == 13 and "SHA256:" in refused.stderr and kh.read_text() == ""
    accepted = opsctl("--accept-new-host-key", "ping", "local")
    assert accepted.returncode == 0, accepted.stderr
    assert f"[127.0.0.1]:{local.port} ssh-ed25519 " in kh.read_text()
    assert opsctl("ping", "local").returncode == 0  # recorded: strict checking passes from now on
