"""The one runner of opsctl's programs on a host (opsctl/ssh/hostprogram.py): the bundle of several modules, the
configuration on stdin, the failures it reports; and the programs it ships (the probe traffic, the health probe,
the capture listing) are standard library only, with one CONFIG_TEXT line each."""

from __future__ import annotations

import ast
import sys

import pytest

from opsctl.captures.capturedir import LISTING_PROGRAM
from opsctl.errors import DeployFailed
from opsctl.health.probe import PROBE_PROGRAM
from opsctl.probe.answers import document
from opsctl.probe.traffic import TRAFFIC_PROGRAM
from opsctl.ssh.hostprogram import CONFIG_LINE, HostProgram, bundle
from tests.pipeline.localremote import LocalRemote

PROGRAMS = [TRAFFIC_PROGRAM, PROBE_PROGRAM, LISTING_PROGRAM]

A = '''"""Module a."""

from __future__ import annotations

import json


def double(x: int) -> int:
    return 2 * x
'''
B = '''"""Module b."""

from __future__ import annotations

import sys

from .a import (
    double,
)
from .a import double as twice  # noqa


def main() -> int:
    print(double(21))
    return 0
'''


def test_bundle_leaves_out_the_modules_imports_of_each_other_and_repeats_no_future_import() -> None:
    text = bundle([A, B], ["a.py", "b.py"])
    tree = ast.parse(text)
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))
    assert text.count("from __future__ import annotations") == 1
    assert "import json" in text and "import sys" in text and "def main" in text
    namespace: dict[str, object] = {}
    exec(compile(text, "bundle", "exec"), namespace)
    assert namespace["double"](2) == 4  # type: ignore[operator]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.modules[-1])
def test_each_program_is_standard_library_only_with_one_config_line(program: HostProgram) -> None:
    text = program.text()
    assert text.count(CONFIG_LINE) == 1
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            assert all(a.name.split(".")[0] in sys.stdlib_module_names for a in node.names), ast.unparse(node)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and (node.module or "").split(".")[0] in {*sys.stdlib_module_names, "__future__"}


def test_the_configuration_travels_on_stdin_and_comes_back_as_the_program_read_it() -> None:
    remote = LocalRemote()
    config = {"mode": "dance", "env_file": "/etc/x y;z"}
    with pytest.raises(DeployFailed) as e:
        TRAFFIC_PROGRAM.run(remote, config, timeout=60, where="h1", read=document)
    assert remote.commands == ["python3 -"]  # nothing of the configuration in argv
    assert e.value.message.startswith("h1: the probe program's answer is unreadable: the probe program refused")
    assert "not 'dance'" in e.value.message  # the program read the configuration it was sent


def test_a_program_that_cannot_run_is_a_deploy_failure_naming_the_host_and_the_program() -> None:
    with pytest.raises(DeployFailed, match=r"^h1: the comparison workload failed on the host \(exit 127\)"):
        TRAFFIC_PROGRAM.run(
            LocalRemote(),
            {},
            timeout=60,
            where="h1",
            read=str,
            what="the comparison workload",
            python="/nonexistent/python3",
        )


def test_many_threads_asking_for_a_program_at_once_get_the_same_text() -> None:
    # A parallel roll-out asks from one thread per host; CPython 3.11's ast.parse in two threads at once once failed a
    # host of CI's roll-out ("AST constructor recursion depth mismatch"): the text is built once, under a lock.
    from concurrent.futures import ThreadPoolExecutor

    from opsctl.ssh import hostprogram

    hostprogram._built.cache_clear()
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(lambda _: TRAFFIC_PROGRAM.text(), range(32)))
    assert len(set(texts)) == 1 and texts[0].count(CONFIG_LINE) == 1
    assert hostprogram._built.cache_info().misses == 1
