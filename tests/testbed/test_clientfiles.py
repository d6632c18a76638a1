"""opsctl/testbed/clientfiles.py: the inventory.yaml and known_hosts the testbed writes for opsctl."""

from __future__ import annotations

from pathlib import Path

from opsctl.inventory import parse
from opsctl.testbed.clientfiles import inventory_text, known_hosts_text, write_known_hosts_and_inventory
from opsctl.testbed.statedir import HostState, StateDir


def test_inventory_text_is_a_valid_inventory(tmp_path: Path) -> None:
    tb = StateDir(tmp_path / "tb", cache_dir=tmp_path / "cache", port_base=2300)
    inv = parse(inventory_text(tb, {"tb2": 2302, "local": 2300, "tb1": 2301}), "inv.yaml")
    assert list(inv.hosts) == ["local", "tb1", "tb2"]
    assert inv.groups == {"testbed": ("local", "tb1", "tb2"), "fleet": ("tb1", "tb2")}
    tb1 = inv.hosts["tb1"]
    assert (tb1.address, tb1.port, tb1.user) == ("127.0.0.1", 2301, "root")
    assert tb1.identity_file == str(tb.client_key) and tb1.known_hosts == str(tb.known_hosts)
    assert (
        tb1.gpu_arch is None
        and tb1.service.mode == "standin"
        and tb1.service.standin_args == ["--load-delay", "1"]
        and tb1.service.python == "/usr/bin/python3"
    )
    assert tb1.root == "/root/kdtree-engine" and tb1.unit == "sglang-k26-ddtree"
    assert tb1.gate.deadline_s == 60 and tb1.gate.poll_interval_s == 1 and tb1.gate.consecutive_passes == 3
    assert len({h.service.port for h in inv.hosts.values()}) == 3  # one service port per host: shared network


def _provisioned(tb: StateDir, name: str, port: int, key: str) -> None:
    """A host directory as hostdir.provision leaves it, as far as these files care: state and host key."""
    ssh = tb.host_dir(name) / "upper/etc/ssh"
    ssh.mkdir(parents=True)
    (ssh / "ssh_host_ed25519_key.pub").write_text(f"ssh-ed25519 {key} root@{name}\n")
    tb.save_state(HostState(name=name, port=port, machine=tb.machine(name)))


def test_known_hosts_pins_each_host_key_to_its_port(tmp_path: Path) -> None:
    tb = StateDir(tmp_path / "tb", cache_dir=tmp_path / "cache", port_base=2300)
    _provisioned(tb, "tb1", 2301, "AAAAkeyOfTb1")
    _provisioned(tb, "local", 2300, "AAAAkeyOfLocal")
    assert known_hosts_text(tb) == (
        "[127.0.0.1]:2300 ssh-ed25519 AAAAkeyOfLocal\n[127.0.0.1]:2301 ssh-ed25519 AAAAkeyOfTb1\n"
    )
    write_known_hosts_and_inventory(tb)
    assert tb.known_hosts.read_text() == known_hosts_text(tb)
    inv = parse(tb.inventory_path.read_text(), "inv.yaml")
    assert {n: h.port for n, h in inv.hosts.items()} == {"local": 2300, "tb1": 2301}
    assert not list(tb.state_dir.glob("*.tmp"))  # written whole, then renamed into place
