"""`pytest -m gpu tests/` on a bare GPU machine (torch, triton and the SGLang wheel; no paramiko, typer or rich:
kernel/bench/run_device.sh's all-tests stage) collects every GPU test, and a module it cannot import there is
skipped with the reason, never a collection error (issue 47: 17 errors ``No module named 'paramiko'``, 0 GPU tests
run, because the wheel's pydantic let ``opsctl.inventory`` import and the conftest took the CLI as installed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import CLI_DEPENDENCIES

ROOT = Path(__file__).resolve().parents[2]
IMPORT_NAMES = {"pyyaml": "yaml"}  # distribution name -> import name, where they differ

# Run pytest with the CLI's SSH and terminal packages made unimportable, as on the GPU machine (pydantic and
# PyYAML stay: the SGLang wheel and the image bring them).
_BARE = """
import importlib.abc, sys
BLOCKED = {"paramiko", "typer", "rich"}
class Bare(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Bare())
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_the_conftest_looks_for_every_dependency_of_the_cli() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~\[ ;]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert {IMPORT_NAMES.get(n, n) for n in names} == set(CLI_DEPENDENCIES)


@pytest.mark.slow
def test_without_the_cli_the_gpu_tests_are_collected_and_the_rest_skipped_with_a_reason() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    res = subprocess.run(
        [sys.executable, "-c", _BARE, "-m", "gpu", "--collect-only", "-q", "-rs", "-p", "no:cacheprovider", "tests/"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    assert " error" not in out.splitlines()[-1], out[-3000:]
    collected = re.search(r"(\d+)/\d+ tests collected", out)
    assert collected is not None and int(collected[1]) > 0, out[-3000:]
    # The testbed and CLI modules are skipped, each naming what it could not import.
    assert "tests/pipeline/test_testbed_deploy.py:0: cannot be imported here: no module named 'paramiko'" in out
    assert "tests/cli/test_cli_errors.py:0: cannot be imported here: no module named" in out
