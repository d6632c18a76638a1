"""Fixtures of the fault matrix: three testbed hosts brought to a good release once per session (both modules
share them), and put right before each scenario if an earlier one left one broken (so one failure does not
cascade into the next scenarios). The repair checks the three hosts at once, one SSH session each."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from opsctl import pipeline
from opsctl.fleet.rollout import plan_rollout, run_rollout
from opsctl.host import releaseroot
from opsctl.inventory import HostConfig, Inventory
from opsctl.lock import hostlock
from opsctl.ssh import connect
from opsctl.testbed import Testbed, reset_host
from tests.builders import without_comparison
from tests.fault.harness import FAKE_NVIDIA_SMI, LEDGER, deploy_action, remove_fake_gpu, source_root, variant

FLEET = ("tb1", "tb2", "tb3")
FIGURES: dict[str, float] = {}
# Set to measure the serial redeploy of the three hosts as well (the figure beside the parallel one).
SERIAL_FIGURE_ENV = "OPSCTL_FAULT_SERIAL_FIGURE"
_tags = itertools.count(1)


def next_variant(tmp: Path, what: str) -> Path:
    return variant(tmp / f"{what}-{next(_tags)}", f"{what}-{next(_tags)}-{time.time_ns()}")


@pytest.fixture(scope="session")
def fleet_inventory(testbed_handle: Testbed) -> Inventory:
    """tb1..tb3 booted (the default testbed has two fleet hosts; a third is added, the others are kept)."""
    replay = source_root() / "backend" / "kdtree_backend" / "replay.py"
    if not replay.is_file():
        pytest.skip(f"nothing to deploy yet: the replay service {replay} is not in the tree")
    testbed_handle.up(len(FLEET))
    return testbed_handle.inventory()


@pytest.fixture(scope="session")
def fleet(fleet_inventory: Inventory, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[HostConfig]]:
    """tb1..tb3 reset and given a first release (in parallel); with $OPSCTL_FAULT_SERIAL_FIGURE set, then a
    redeploy one host after another (measured; test_parallel_batch_really_overlaps measures the same redeploy in
    parallel). Once per session: every scenario starts from whatever the previous one left, repaired by
    ``hosts``. Reset again at the end, so the tests that follow find the hosts as a reset leaves them."""
    hosts = [without_comparison(fleet_inventory.host(n)) for n in FLEET]
    with ThreadPoolExecutor(len(hosts)) as pool:
        list(pool.map(reset_host, hosts))
    tmp = tmp_path_factory.mktemp("fleet")
    plan = plan_rollout(hosts, canary=None)
    first = run_rollout(plan, deploy_action(next_variant(tmp, "first")), parallel=True)
    assert first.ok, [(o.host, o.outcome, o.detail) for o in first.outcomes]
    FIGURES["first deploy, 3 hosts, parallel (s)"] = first.elapsed_s
    if os.environ.get(SERIAL_FIGURE_ENV):  # a figure only (40-80 s here): CI leaves it out
        serial = run_rollout(plan, deploy_action(next_variant(tmp, "serial")), parallel=False)
        assert serial.ok, [(o.host, o.outcome, o.detail) for o in serial.outcomes]
        FIGURES["redeploy, 3 hosts, serial (s)"] = serial.elapsed_s
        FIGURES["slowest single-host redeploy (s)"] = max(o.elapsed_s for o in serial.outcomes)
    yield hosts
    for h in hosts:
        reset_host(h)
        remove_fake_gpu(h)  # a scenario's fake nvidia-smi is outside what a reset removes


def _repair(host: HostConfig, tb: Testbed, tmp: Path) -> None:
    """Put a host back to: reachable, disk free, no fake GPU, lock free, running a good release."""
    if not tb.running(host.name):
        tb.boot(host.name)
    tb.start_sshd(host.name)
    tb.free_disk(host.name)
    with connect(host) as r:  # one session for the checks of a host that is (nearly always) fine
        r.run(f"rm -f {FAKE_NVIDIA_SMI}", timeout=30)
        snap = releaseroot.read_snapshot(r, host.root, host.unit)
        if snap.lock_present:
            hostlock.release_lock(r, releaseroot.Layout(host.root), None)
            snap = releaseroot.read_snapshot(r, host.root, host.unit)
    running = snap.unit.active_state == "active" and snap.unit.sub_state == "running"
    if not running or (snap.current is not None and snap.current in snap.bad):
        res = pipeline.deploy(host, next_variant(tmp, "repair"), pipeline.DeployOptions())
        assert res.ok, f"could not repair {host.name}: {res.line()}"


@pytest.fixture
def hosts(
    fleet: list[HostConfig],
    testbed_handle: Testbed,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[list[HostConfig]]:
    """The three hosts, each healthy on a good release before the scenario (repaired in parallel if the previous
    scenario left one broken; a failed scenario is repaired by the next one's set-up or the session's reset)."""
    tmp = tmp_path_factory.mktemp("repair")
    with ThreadPoolExecutor(len(fleet)) as pool:
        for done in [pool.submit(_repair, h, testbed_handle, tmp) for h in fleet]:
            done.result()
    LEDGER.scenarios.append(request.node.name)
    yield fleet


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not LEDGER.scenarios:
        return
    for name, value in FIGURES.items():
        terminalreporter.write_line(f"fault matrix figure: {name}: {value:.1f}")
    terminalreporter.write_line(LEDGER.closing_line())
