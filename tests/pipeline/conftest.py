"""The testbed hosts the pipeline's testbed tests deploy to, each as ``fast`` makes it (a short gate, no comparison
with the release replaced): ``tb1``, ``tb2`` and ``local``. A test module that needs a host otherwise defines its
own fixture of the same name, which takes precedence.

opsctl is imported inside the fixtures only, as in tests/conftest.py: a bare GPU machine collects ``tests/`` without
the CLI's dependencies, and a folder whose conftest names ``opsctl`` in an import is not collected there at all
(tests/conftest.py, ``pytest_ignore_collect``; tests/core/test_bare_gpu_collection.py wants this folder's modules
reported as skipped, each with its reason). So the types come by way of tests.builders."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.builders import HostConfig, Inventory


def fast_host(testbed: Inventory, name: str) -> HostConfig:
    from tests.pipeline.test_testbed_deploy import fast

    return fast(testbed.host(name))


@pytest.fixture
def tb1(testbed: Inventory) -> HostConfig:
    return fast_host(testbed, "tb1")


@pytest.fixture
def tb2(testbed: Inventory) -> HostConfig:
    return fast_host(testbed, "tb2")


@pytest.fixture
def local(testbed: Inventory) -> HostConfig:
    return fast_host(testbed, "local")
