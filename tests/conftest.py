"""Shared fixtures.

Testbed tests (booted Debian hosts, see opsctl/testbed.py):

    def test_something(testbed: Inventory) -> None:      # session-scoped: hosts are booted once (if not up)
        host = testbed.host("tb1")
        reset_host(host)                                  # unit stopped and removed, release root gone
        ...
        opsctl.testbed.poweroff("tb1"); opsctl.testbed.boot("tb1")   # fault injection, also stop_sshd/fill_disk

A test that uses the ``testbed`` fixture is marked ``testbed`` automatically (select with ``-m testbed``).
Without root or the tools, such tests are skipped on a dev machine but FAIL in CI (CI=true) or as root: a CI
that silently skipped them would prove nothing.
Hosts: ``local`` and ``tb1..tbN`` (N = $OPSCTL_TESTBED_HOSTS, default 2); groups ``testbed`` and ``fleet``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# The checkout's own packages win over anything installed elsewhere (tests run against this tree).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opsctl.errors import OpsError
from opsctl.inventory import Inventory
from opsctl.testbed import DEFAULT_HOSTS, Testbed, missing_tools, prerequisite_problem, reset_host

__all__ = ["reset_host"]

HOSTS_ENV = "OPSCTL_TESTBED_HOSTS"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "testbed" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.testbed)


def _must_not_skip() -> bool:
    return bool(os.environ.get("CI")) or os.geteuid() == 0


@pytest.fixture(scope="session")
def testbed_handle() -> Testbed:
    """The default testbed ($OPSCTL_TESTBED_DIR or ./.testbed), booted: for power and disk helpers."""
    problem = prerequisite_problem(os.geteuid(), missing_tools())
    if problem:
        if _must_not_skip():
            pytest.fail(f"testbed unavailable: {problem}", pytrace=False)
        pytest.skip(f"testbed unavailable on this dev machine: {problem}")
    tb = Testbed()
    try:
        tb.up(int(os.environ.get(HOSTS_ENV) or DEFAULT_HOSTS))
    except OpsError as e:
        pytest.fail(f"the testbed could not boot: {e}", pytrace=False)
    return tb


@pytest.fixture(scope="session")
def testbed(testbed_handle: Testbed) -> Inventory:
    """The booted testbed's inventory (hosts local, tb1..tbN)."""
    return testbed_handle.inventory()
