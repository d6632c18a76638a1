"""Pure parts of the testbed: names, cache key, prerequisites, port choice, the inventory it writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl import errors
from opsctl.inventory import parse
from opsctl.testbed import (
    PACKAGES,
    Testbed,
    free_port_base,
    host_index,
    host_names,
    inventory_text,
    missing_tools,
    prerequisite_problem,
    recipe_key,
)


def test_host_names_and_indices() -> None:
    assert host_names(3) == ["local", "tb1", "tb2", "tb3"]
    assert host_names(0) == ["local"]
    assert [host_index(n) for n in host_names(2)] == [0, 1, 2]


def test_recipe_key_changes_with_what_goes_into_the_rootfs() -> None:
    assert recipe_key() == recipe_key()
    assert recipe_key(packages=(*PACKAGES, "vim")) != recipe_key()
    assert recipe_key(pip=("torch==2.12.0",)) != recipe_key()
    assert recipe_key(packages=tuple(reversed(PACKAGES))) == recipe_key()  # order does not matter


def test_prerequisites_name_what_to_install() -> None:
    assert prerequisite_problem(0, {}) is None
    msg = prerequisite_problem(1000, {})
    assert msg is not None and "root" in msg
    missing = missing_tools(lambda tool: None if tool in ("systemd-nspawn", "debootstrap") else "/usr/bin/x")
    assert missing == {"systemd-nspawn": "systemd-container", "debootstrap": "debootstrap"}
    msg = prerequisite_problem(0, missing)
    assert msg is not None and "apt-get install -y debootstrap systemd-container" in msg


def test_free_port_base_skips_busy_ranges() -> None:
    busy = {2221, 2232}
    assert free_port_base(2220, 3, busy.__contains__) == 2240
    assert free_port_base(2220, 1, busy.__contains__) == 2220
    with pytest.raises(errors.TestbedError):
        free_port_base(2220, 3, lambda p: True, tries=3)


def test_inventory_text_is_a_valid_inventory(tmp_path: Path) -> None:
    tb = Testbed(tmp_path / "tb", cache_dir=tmp_path / "cache", port_base=2300)
    inv = parse(inventory_text(tb, {"tb2": 2302, "local": 2300, "tb1": 2301}), "inv.yaml")
    assert list(inv.hosts) == ["local", "tb1", "tb2"]
    assert inv.groups == {"testbed": ("local", "tb1", "tb2"), "fleet": ("tb1", "tb2")}
    tb1 = inv.hosts["tb1"]
    assert (tb1.address, tb1.port, tb1.user) == ("127.0.0.1", 2301, "root")
    assert tb1.identity_file == str(tb.client_key) and tb1.known_hosts == str(tb.known_hosts)
    assert tb1.gpu_arch is None and tb1.service.mode == "replay" and tb1.service.python == "/usr/bin/python3"
    assert tb1.root == "/root/kdtree-engine" and tb1.unit == "sglang-k26-ddtree"
    assert tb1.gate.deadline_s == 60 and tb1.gate.poll_interval_s == 1 and tb1.gate.consecutive_passes == 3
    assert len({h.service.port for h in inv.hosts.values()}) == 3  # one service port per host: shared network


def test_machine_names_differ_between_testbeds(tmp_path: Path) -> None:
    a, b = Testbed(tmp_path / "a"), Testbed(tmp_path / "b")
    assert a.machine("tb1") != b.machine("tb1") and a.machine("tb1").startswith("kdtb-")
