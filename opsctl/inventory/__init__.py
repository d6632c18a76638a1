"""inventory.yaml: hosts, groups and defaults, validated strictly.

- ``loader``: ``load``/``parse`` the file into an ``Inventory`` (hosts with defaults merged, groups, the default
  target) and ``Inventory.resolve`` a command's target;
- ``settings``: ``HostConfig`` and its sections (gate, probe, service, health), ``with_options``;
- ``fields``: the checked value types (names, paths, shell arguments, webhook URLs) behind those settings;
- ``yamlsource``: the YAML read within limits (nesting, alias expansion), and errors that name file, line and field.
"""

from .fields import WebhookUrl
from .loader import ENV_VAR, Inventory, default_path, load, parse
from .settings import (
    CompareSettings,
    GateSettings,
    HostConfig,
    ProbeSettings,
    ServiceSettings,
    SpeedSettings,
    with_options,
)

__all__ = [
    "ENV_VAR",
    "CompareSettings",
    "GateSettings",
    "HostConfig",
    "Inventory",
    "ProbeSettings",
    "ServiceSettings",
    "SpeedSettings",
    "WebhookUrl",
    "default_path",
    "load",
    "parse",
    "with_options",
]
