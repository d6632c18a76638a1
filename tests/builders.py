"""The tests' one set of builders for hosts and inventories (``from tests.builders import host, inventory``).

``host`` is one ``HostConfig`` with the inventory's defaults, at 127.0.0.1 unless told otherwise; ``inventory`` goes
through the real parser (``opsctl.inventory.parse``), so defaults, merging and validation apply as for a file.
"""

from __future__ import annotations

from typing import Any

import yaml

from opsctl.inventory import HostConfig, Inventory, parse

LOCAL = "127.0.0.1"


def host(name: str = "h1", **fields: Any) -> HostConfig:
    """One host named ``name``: ``fields`` as inventory.yaml would give them (sections such as ``service`` or
    ``gate`` as mappings or as settings objects), ``address`` 127.0.0.1 unless given, every other field its
    inventory default (``gpu_arch`` included: pass ``gpu_arch=None`` for a host without a GPU)."""
    return HostConfig.model_validate({"name": name, "address": LOCAL, **fields})


def inventory(hosts: dict[str, dict[str, Any]] | list[str], defaults: dict[str, Any] | None = None) -> Inventory:
    """An inventory of ``hosts`` (name -> fields, or just names) at 127.0.0.1 unless ``defaults`` say otherwise,
    all of them in the group ``fleet``; parsed from YAML as a file would be."""
    if isinstance(hosts, list):
        hosts = {h: {} for h in hosts}
    doc = {
        "defaults": {"address": LOCAL, **(defaults or {})},
        "hosts": hosts,
        "groups": {"fleet": list(hosts)},
    }
    return parse(yaml.safe_dump(doc), "test-inventory.yaml")


def without_comparison(h: HostConfig) -> HostConfig:
    """``h`` with ``gate.compare.enabled: false`` and ``gate.speed.enabled: false``: for testbed tests that are not
    about the comparison with the release replaced nor the pre-restart speed check
    (tests/pipeline/test_testbed_comparison.py and test_speed_testbed.py are). On the 2-core machine, with other hosts
    restarting beside it, an A/A comparison or speed check only adds seconds, and a busy moment can turn a figure."""
    compare = h.gate.compare.model_copy(update={"enabled": False})
    speed = h.gate.speed.model_copy(update={"enabled": False})
    return h.model_copy(update={"gate": h.gate.model_copy(update={"compare": compare, "speed": speed})})


def with_speed_check(h: HostConfig) -> HostConfig:
    """``h`` with the pre-restart speed check on (``gate.speed.enabled: true``)."""
    speed = h.gate.speed.model_copy(update={"enabled": True})
    return h.model_copy(update={"gate": h.gate.model_copy(update={"speed": speed})})


def comparing_at_1_and_8(h: HostConfig) -> HostConfig:
    """``h`` with the comparison on at concurrency 1 and 8, the default of ``gate.compare`` (the testbed's inventory
    runs only 1: with three test workers on 2 cores the testbed cannot judge 8 concurrent requests of an A/A deploy),
    and without the pre-restart speed check (issue 48), which refuses a slow release before the comparison sees it."""
    compare = h.gate.compare.model_copy(update={"enabled": True, "concurrency": [1, 8]})
    speed = h.gate.speed.model_copy(update={"enabled": False})
    return h.model_copy(update={"gate": h.gate.model_copy(update={"compare": compare, "speed": speed})})
