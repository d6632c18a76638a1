"""inventory.yaml: hosts, groups and defaults, validated strictly (``load``, ``parse``), and what a command's target
names (``Inventory.resolve``: a host, a group or ``all``).

Every error names the file, the line and the dotted field (``inventory.yaml:14: hosts.ct200.unit: ...``).
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from ..errors import InventoryError
from ..terminal import escaped
from .fields import NAME_RE, safe_name
from .settings import HostConfig, Strict
from .yamlsource import LineMap, inventory_error, read_yaml, shown

ENV_VAR = "OPSCTL_INVENTORY"
DEFAULT_FILE = "inventory.yaml"


class _InventoryFile(Strict):
    default: str | None = None  # the target of a command given no host: a host, a group or 'all'
    defaults: dict[str, Any] = Field(default_factory=dict)
    hosts: dict[str, dict[str, Any]]
    groups: dict[str, list[str]] = Field(default_factory=dict)


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: dict[str, HostConfig]
    groups: dict[str, tuple[str, ...]]
    default: str | None = None  # `default:` of the file: what a command given no host acts on

    def resolve(self, target: str) -> list[HostConfig]:
        """A host name, a group name or ``all`` -> hosts, in inventory order."""
        if target in self.hosts:
            return [self.hosts[target]]
        if target in self.groups:
            return [self.hosts[h] for h in self.groups[target]]
        if target == "all":
            return list(self.hosts.values())
        known = ", ".join([*self.hosts, *self.groups]) or "none"
        raise InventoryError(f"{self.path}: no host or group named {target!r} (known: {known})")

    def host(self, name: str) -> HostConfig:
        hosts = self.resolve(name)
        if len(hosts) != 1 or name not in self.hosts:
            raise InventoryError(f"{self.path}: {name!r} is a group; this command takes one host")
        return hosts[0]


def default_path(explicit: str | os.PathLike[str] | None = None) -> Path:
    """--inventory, else $OPSCTL_INVENTORY, else ./inventory.yaml."""
    if explicit:
        return Path(explicit)
    env = os.environ.get(ENV_VAR)
    return Path(env) if env else Path(DEFAULT_FILE)


def load(path: str | os.PathLike[str] | None = None) -> Inventory:
    p = default_path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InventoryError(f"{p}: cannot read inventory: {e.strerror or e}") from e
    inv = parse(text, p)
    for host in inv.hosts.values():
        problem = calendar_problem(host.health.on_calendar)
        if problem:
            raise InventoryError(f"{_written_at(text, p, host.name, ('health', 'on_calendar'))}: {problem}")
    return inv


def _written_at(text: str, path: Path, host: str, field: tuple[str, ...]) -> str:
    """``inventory.yaml:14: hosts.ct200.health.on_calendar``: where a host's setting is written (on the host, else
    in ``defaults``). Reads the file's lines again: only on an error's path."""
    lines = read_yaml(text, path)[1]
    for key in (("hosts", host, *field), ("defaults", *field)):
        if key in lines:
            return f"{path}:{lines[key]}: {'.'.join(key)}"
    return f"{path}: hosts.{host}.{'.'.join(field)}"


# An OnCalendar expression is a few dozen characters ("Mon..Fri *-*-* 09:00:00 Europe/Berlin"). The cap is checked
# before systemd-analyze is asked: over 128 KiB its start fails ("Argument list too long").
MAX_CALENDAR_CHARS = 1024


def calendar_problem(expression: str) -> str | None:
    """What systemd says is wrong with an OnCalendar expression (None when it parses, or when this machine has no
    systemd-analyze to ask: the timer's own installation asks again). systemd-analyze's words quote the
    expression: shown escaped."""
    if len(expression) > MAX_CALENDAR_CHARS:
        return f"{len(expression):,} characters; a calendar expression may have at most {MAX_CALENDAR_CHARS:,}"
    if shutil.which("systemd-analyze") is None:
        return None
    try:
        r = subprocess.run(
            ["systemd-analyze", "calendar", "--", expression], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"systemd-analyze could not check it: {escaped(str(e))[:300]}"
    if r.returncode == 0:
        return None
    said = escaped((r.stderr.strip() or r.stdout.strip())[:1000])
    return f"{expression!r} is not a systemd calendar expression: {said}"


def _check_names(path: Path, lines: LineMap, raw: dict[str, Any]) -> None:
    """Host keys, group names and group members are names: anything else (a newline, an escape sequence, a
    non-string) is refused here, shown escaped, before a message could print it raw."""
    for name in raw.get("hosts") or {}:
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise InventoryError(
                f"{path}:{lines.get(('hosts', name), 1)}: hosts.{shown(name)}: {str(name)!r} is not a safe host "
                "name (letters, digits, '_', '.', '-'; max 63)"
            )
    groups = raw.get("groups")
    for group, members in groups.items() if isinstance(groups, dict) else ():
        where = f"{path}:{lines.get(('groups', group), 1)}: groups.{shown(group)}"
        if not isinstance(group, str) or not NAME_RE.fullmatch(group):
            raise InventoryError(
                f"{where}: {str(group)!r} is not a safe group name (letters, digits, '_', '.', '-'; max 63)"
            )
        for member in members if isinstance(members, list) else ():
            if not isinstance(member, str) or not NAME_RE.fullmatch(member):
                raise InventoryError(f"{where}: member {str(member)!r} is not a host name")


def parse(text: str, path: Path | str = DEFAULT_FILE) -> Inventory:
    """inventory.yaml's text -> Inventory: hosts with the defaults merged in, groups, the default target."""
    path = Path(path)
    raw, lines = read_yaml(text, path)
    if not isinstance(raw, dict):
        raise InventoryError(f"{path}:1: the inventory must be a mapping with 'hosts' (and 'defaults', 'groups')")
    _check_names(path, lines, raw)
    try:
        doc = _InventoryFile.model_validate(raw)
    except ValidationError as e:
        raise inventory_error(path, lines, e, ()) from None

    hosts: dict[str, HostConfig] = {}
    for name, fields in doc.hosts.items():
        if not isinstance(fields, dict):
            raise InventoryError(f"{path}:{lines.get(('hosts', name), 1)}: hosts.{name}: must be a mapping")
        merged = _deep_merge(doc.defaults, fields)
        merged["name"] = name
        try:
            hosts[name] = HostConfig.model_validate(merged).located(str(path), lines)
        except ValidationError as e:
            raise inventory_error(path, lines, e, ("hosts", name), defaults_fields=set(doc.defaults)) from None

    groups: dict[str, tuple[str, ...]] = {}
    for group, members in doc.groups.items():
        where = f"{path}:{lines.get(('groups', group), 1)}: groups.{group}"
        try:
            safe_name(group)
        except ValueError as e:
            raise InventoryError(f"{where}: {e}") from None
        if group in hosts:
            raise InventoryError(f"{where}: a group cannot share its name with a host")
        missing = [m for m in members if m not in hosts]
        if missing:
            raise InventoryError(f"{where}: unknown host(s) {', '.join(map(str, missing))}")
        groups[group] = tuple(dict.fromkeys(members))
    if doc.default is not None and doc.default != "all" and doc.default not in hosts and doc.default not in groups:
        known = ", ".join([*hosts, *groups]) or "none"
        raise InventoryError(
            f"{path}:{lines.get(('default',), 1)}: default: {doc.default!r} is no host or group (known: {known}, all)"
        )
    return Inventory(path=path, hosts=hosts, groups=groups, default=doc.default)


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
