"""Shared fixtures.

Testbed tests (booted Debian hosts, see opsctl/testbed/ and docs/testbed.md):

    def test_something(testbed: Inventory) -> None:      # session-scoped: hosts are booted once (if not up)
        host = testbed.host("tb1")
        reset_host(host)                                  # unit stopped and removed, release root gone
        ...
        opsctl.testbed.poweroff("tb1"); opsctl.testbed.boot("tb1")   # fault injection, also stop_sshd/fill_disk

A test that uses the ``testbed`` or ``testbed_handle`` fixture (even through another fixture, as the fault tests do)
is marked ``testbed`` automatically (select with ``-m testbed``, leave out with ``-m "not testbed"``).
Without root or the tools, such tests are skipped on a dev machine but FAIL in CI (CI=true) or as root: a CI
that silently skipped them would prove nothing.
Hosts: ``local`` and ``tb1..tbN`` (N = $OPSCTL_TESTBED_HOSTS, default 2); groups ``testbed`` and ``fleet``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# The checkout's own packages win over anything installed elsewhere (tests run against this tree).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from opsctl.inventory import Inventory
    from opsctl.testbed import Testbed

HOSTS_ENV = "OPSCTL_TESTBED_HOSTS"
# Under pytest-xdist (CI: `-n 3 --dist loadfile`) every worker but gw0 boots a testbed of its own, so that tests
# of different files never share a host: <testbed dir>-gwN, sshd ports 100*N above the base. gw0 (or a run without
# xdist) uses the default one, which the README's rehearsal leaves up. The testbed tests mostly wait (restarts,
# readiness, gate deadlines), so three of them side by side fit on two cores.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER:
    # xdist's workers start with COLUMNS=80 set; without it Rich's piped width is the one a serial run sees (tests
    # that want a width pass COLUMNS themselves).
    os.environ.pop("COLUMNS", None)
_OWN_TESTBED = _WORKER.startswith("gw") and _WORKER != "gw0"
if _OWN_TESTBED:
    from opsctl.testbed.ports import PORT_BASE_ENV
    from opsctl.testbed.statedir import STATE_ENV, StateDir

    _default = StateDir()  # the default testbed's directory and port base, as opsctl resolves them
    os.environ[STATE_ENV] = f"{_default.state_dir}-{_WORKER}"
    os.environ[PORT_BASE_ENV] = str(_default.port_base + 100 * int(_WORKER.removeprefix("gw")))


# The import names of the CLI's third-party dependencies (pyproject.toml's ``dependencies``; a test pins the two
# lists together).
CLI_DEPENDENCIES = ("typer", "rich", "paramiko", "yaml", "pydantic")


def _cli_dependency_missing() -> ModuleNotFoundError | None:
    """The CLI's first missing third-party module (pydantic, paramiko, ...), or None when all of them are there.

    A bare GPU machine has torch, triton and the SGLang wheel only: the opsctl imports stay inside the fixtures
    so that ``pytest -m gpu tests/`` collects the GPU tests there (issue 18). Each dependency is looked for, not
    only those ``opsctl.inventory`` imports: the SGLang wheel brings pydantic, and the machine's image PyYAML, so
    the inventory imports there while paramiko, typer and rich are missing (issue 47)."""
    for name in CLI_DEPENDENCIES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a finder that refuses it, a module without a spec
            found = False
        if not found:
            return ModuleNotFoundError(f"No module named {name!r}", name=name)
    try:
        importlib.import_module("opsctl.inventory")
    except ModuleNotFoundError as exc:
        if exc.name and not exc.name.startswith("opsctl"):
            return exc
        raise
    return None


_CLI_MISSING = _cli_dependency_missing()


_SKIPPED_FOLDERS: list[str] = []
_OWN_PACKAGES = {"opsctl", "kdtree_kernel", "kdtree_backend", "tests"}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Without the CLI's dependencies, a test folder whose own conftest imports opsctl is not collected (its
    conftest would fail to import before any hook could report it as skipped); the session summary names it."""
    conftest = collection_path / "conftest.py"
    if _CLI_MISSING is None or not conftest.is_file():
        return None
    if re.search(r"^\s*(from|import) opsctl\b", conftest.read_text(), re.MULTILINE):
        _SKIPPED_FOLDERS.append(str(collection_path))
        return True
    return None


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for folder in _SKIPPED_FOLDERS:
        terminalreporter.write_line(f"not collected: {folder} (needs the CLI's dependencies: {_CLI_MISSING})")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    """Without the CLI's dependencies, a test module that fails to import for want of a third-party module
    (pydantic, paramiko, ...) is reported as skipped, with the reason, instead of stopping the whole session.
    With them installed (dev machines, CI) nothing changes: every collection error still fails."""
    outcome = yield
    if _CLI_MISSING is None:
        return
    report = outcome.get_result()
    if not report.failed or not isinstance(collector, pytest.Module):
        return
    missing = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", str(report.longrepr))
    if missing is None or missing[1].split(".")[0] in _OWN_PACKAGES:
        return  # any other collection error (a broken module of this repo's own) still fails
    reason = f"cannot be imported here: no module named {missing[1]!r} (the CLI's dependencies: {_CLI_MISSING})"
    report.outcome = "skipped"
    report.longrepr = (str(collector.path), 0, f"Skipped: {reason}")
    report.result = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if {"testbed", "testbed_handle"} & set(getattr(item, "fixturenames", ())):  # also fault tests' hosts
            item.add_marker(pytest.mark.testbed)


def _must_not_skip() -> bool:
    return bool(os.environ.get("CI")) or os.geteuid() == 0


@pytest.fixture(scope="session")
def testbed_handle() -> Generator[Testbed, None, None]:
    """The default testbed ($OPSCTL_TESTBED_DIR or ./.testbed), booted: for power and disk helpers."""
    from opsctl.errors import OpsError
    from opsctl.testbed import DEFAULT_HOSTS, Testbed, missing_tools, prerequisite_problem

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
    yield tb
    if _OWN_TESTBED:  # this worker booted it; the default one is left to whoever brought it up
        tb.down()


@pytest.fixture(scope="session")
def testbed(testbed_handle: Testbed) -> Inventory:
    """The booted testbed's inventory (hosts local, tb1..tbN)."""
    return testbed_handle.inventory()


@pytest.fixture(scope="session")
def good_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of this checkout's tree, a good release: one for the session, so that a host a test left running it
    is reused by the next test's ``ensure_good`` (tests/pipeline/test_testbed_deploy.py) instead of redeployed."""
    from tests.pipeline import trees

    return trees.copy_tree(tmp_path_factory.mktemp("good"))


@pytest.fixture(scope="session")
def good_id(good_tree: Path) -> str:
    from opsctl.release import make_manifest

    return make_manifest(good_tree).id


# Property tests (hypothesis): a bounded run by default (CI); a longer one with KDTREE_HYPOTHESIS_EXAMPLES=20000
# (docs/gate.md "The grammar").
try:
    from hypothesis import HealthCheck
    from hypothesis import settings as _hypothesis_settings
except ModuleNotFoundError:  # the dev extra is not installed: the property tests fail on import, nothing else
    pass
else:
    _hypothesis_settings.register_profile(
        "kdtree",
        max_examples=int(os.environ.get("KDTREE_HYPOTHESIS_EXAMPLES", "300")),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    _hypothesis_settings.load_profile("kdtree")
