"""HostConfig builders for the pure tests (through the real inventory parser, so defaults and validation apply)."""

from __future__ import annotations

from typing import Any

import yaml

from opsctl.inventory import HostConfig, Inventory, parse


def inventory(hosts: dict[str, dict[str, Any]] | list[str], defaults: dict[str, Any] | None = None) -> Inventory:
    if isinstance(hosts, list):
        hosts = {h: {} for h in hosts}
    doc = {
        "defaults": {"address": "127.0.0.1", **(defaults or {})},
        "hosts": hosts,
        "groups": {"fleet": list(hosts)},
    }
    return parse(yaml.safe_dump(doc), "test-inventory.yaml")


def host(**fields: Any) -> HostConfig:
    return inventory({"h1": fields}).hosts["h1"]
