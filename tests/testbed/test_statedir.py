"""opsctl/testbed/statedir.py: host names, machine names, where a testbed keeps things, and its state files."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl import errors
from opsctl.testbed.statedir import HostState, StateDir, host_index, host_names


def test_host_names_and_indices() -> None:
    assert host_names(3) == ["local", "tb1", "tb2", "tb3"]
    assert host_names(0) == ["local"]
    assert [host_index(n) for n in host_names(2)] == [0, 1, 2]


def test_machine_names_differ_between_testbeds(tmp_path: Path) -> None:
    a, b = StateDir(tmp_path / "a"), StateDir(tmp_path / "b")
    assert a.machine("tb1") != b.machine("tb1") and a.machine("tb1").startswith("kdtb-")


def test_state_round_trip_and_provisioned_order(tmp_path: Path) -> None:
    tb = StateDir(tmp_path / "tb", cache_dir=tmp_path / "cache", port_base=2300)
    for name in ("tb10", "local", "tb2"):
        tb.host_dir(name).mkdir(parents=True)
        tb.save_state(HostState(name=name, port=2300 + host_index(name), machine=tb.machine(name)))
    (tb.hosts_dir / ".tb3.provisioning").mkdir()  # half provisioned: not a host yet
    assert tb.provisioned() == ["local", "tb2", "tb10"]  # by index, not by name
    assert tb.state("tb10") == HostState(name="tb10", port=2310, machine=tb.machine("tb10"))


def test_state_of_a_host_never_provisioned_says_what_to_run(tmp_path: Path) -> None:
    tb = StateDir(tmp_path / "tb", cache_dir=tmp_path / "cache")
    with pytest.raises(errors.TestbedError, match="run `opsctl testbed up`"):
        tb.state("tb1")
    with pytest.raises(errors.TestbedError, match="no testbed at"):
        tb.inventory()


def test_recorded_port_base_wins_over_the_asked_one(tmp_path: Path) -> None:
    assert StateDir(tmp_path / "tb", port_base=2300).port_base == 2300
    (tmp_path / "tb").mkdir()
    StateDir(tmp_path / "tb").port_base_file.write_text("2450\n")  # moved past busy ports at the first up
    assert StateDir(tmp_path / "tb", port_base=2300).port_base == 2450
