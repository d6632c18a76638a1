"""Reading inventory.yaml as YAML, within limits, and saying where in the file a problem is.

Before anything is built from the file: collections nested too deep and aliases that expand too much are refused
(a few hundred bytes must not cost minutes and gigabytes). Every error names the file, the line and the dotted field
(``inventory.yaml:14: hosts.ct200.unit: ...``), with names from the file shown escaped when not printable.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import InventoryError

# Dotted key path -> 1-based line of that key in the file.
LineMap = dict[tuple[str | int, ...], int]


def shown(value: object) -> str:
    """A name from the file as an error message shows it: as is when printable, else escaped like a Python
    literal (``'a\\nb'``), so a newline or an escape sequence in a key can never split or forge a line."""
    text = str(value)
    return text if text.isprintable() else repr(text)


# Aliases may add this many values beyond the ones written in the file (:func:`_bound_aliases`).
MAX_ALIAS_EXPANSION = 10_000
MAX_NESTING = 64  # an inventory is five levels deep; PyYAML's composer recurses once per level
# A file's size and its number of values (scalars and collections) are bounded before anything is built: every
# command reads the inventory, and `hosts --json` must stay fast (a 10 MB prompt once made it take 21 s).
MAX_INVENTORY_CHARS = 8 * 1024 * 1024
MAX_VALUES = 250_000
# libyaml's parser when PyYAML has it (10x faster on large files; the same events and marks), else PyYAML's own.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _bound_nesting(text: str, path: Path) -> None:
    """Refuse collections nested deeper than :data:`MAX_NESTING` from the event stream (linear, no recursion):
    ``[[[[...]]]]`` a few thousand deep would otherwise end in a RecursionError inside the YAML composer."""
    depth = values = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.ScalarEvent | yaml.CollectionStartEvent):
                values += 1
                if values > MAX_VALUES:
                    raise InventoryError(
                        f"{path}:{event.start_mark.line + 1}: more than {MAX_VALUES:,} values in the inventory"
                    )
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_NESTING:
                    raise InventoryError(
                        f"{path}:{event.start_mark.line + 1}: nested more than {MAX_NESTING} levels deep"
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if "nesting depth" in str(getattr(e, "problem", "")) and mark is not None:  # libyaml's own bound, 1000
            raise InventoryError(f"{path}:{mark.line + 1}: nested more than {MAX_NESTING} levels deep") from None
        return  # the composer below reports it, with its line


def _bound_aliases(node: yaml.Node | None, path: Path) -> None:
    """Refuse YAML aliases that expand to too much, before anything is built from the node graph: nine aliases of
    nine aliases of ... make a few hundred bytes expand to billions of values (an "alias bomb"; minutes and
    gigabytes before a field check sees them). A plain anchor shared by a few hosts is fine. Linear in the
    file: each node's expanded size is computed once (the composer shares an aliased node, it does not copy)."""
    sizes: dict[int, int] = {}
    distinct = 0

    def expanded(n: yaml.Node) -> int:
        nonlocal distinct
        key = id(n)
        if key in sizes:
            if sizes[key] < 0:
                raise InventoryError(f"{path}:{n.start_mark.line + 1}: a YAML alias refers to itself")
            return sizes[key]
        sizes[key] = -1  # being sized: meeting it again below is a cycle
        distinct += 1
        total = 1
        if isinstance(n, yaml.MappingNode):
            total += sum(expanded(k) + expanded(v) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total += sum(expanded(v) for v in n.value)
        sizes[key] = total
        return total

    if node is None:
        return
    total = expanded(node)
    if total - distinct > MAX_ALIAS_EXPANSION:
        raise InventoryError(
            f"{path}: YAML aliases expand the inventory to {total:,} values ({distinct:,} written); at most "
            f"{MAX_ALIAS_EXPANSION:,} may come from aliases: put shared settings in `defaults:`"
        )


def read_yaml(text: str, path: Path) -> tuple[Any, LineMap]:
    """The file's data and the line of each key; InventoryError (with its line) for bad or oversized YAML."""
    if len(text) > MAX_INVENTORY_CHARS:
        raise InventoryError(f"{path}: {len(text):,} characters; an inventory may have at most {MAX_INVENTORY_CHARS:,}")
    _bound_nesting(text, path)
    try:
        node = yaml.compose(text, Loader=_LOADER)
        _bound_aliases(node, path)
        # Built from the node just checked (not parsed again): SafeLoader's constructor, on an empty stream.
        raw = None if node is None else yaml.SafeLoader("").construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = getattr(e, "problem", None) or str(e)
        raise InventoryError(f"{where}: invalid YAML: {problem}") from e
    return raw, _line_map(node)


def _line_map(node: yaml.Node | None) -> LineMap:
    """Dotted key path -> 1-based line of that key in the file."""
    lines: LineMap = {}

    def walk(n: yaml.Node, prefix: tuple[str | int, ...]) -> None:
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                key = (*prefix, k.value)
                lines[key] = k.start_mark.line + 1
                walk(v, key)
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                key = (*prefix, i)
                lines[key] = v.start_mark.line + 1
                walk(v, key)

    if node is not None:
        walk(node, ())
    return lines


def inventory_error(
    path: Path,
    lines: LineMap,
    err: ValidationError,
    prefix: tuple[str, ...],
    defaults_fields: Iterable[str] = (),
) -> InventoryError:
    first = err.errors()[0]
    loc = tuple(first["loc"])
    full = (*prefix, *loc)
    line = _closest_line(lines, full)
    # A bad value inherited from `defaults` (not written on the host itself) is reported where it is written.
    if full not in lines and prefix and loc and ("defaults", *loc) in lines and loc[0] in set(defaults_fields):
        full = ("defaults", *loc)
        line = lines[full]
    dotted = ".".join(shown(p) for p in full) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"] == "missing":
        msg = "required field is missing"
    msg = msg.removeprefix("Value error, ")
    return InventoryError(f"{path}:{line or 1}: {dotted}: {msg}")


def _closest_line(lines: LineMap, key: tuple[str | int, ...]) -> int | None:
    for n in range(len(key), 0, -1):
        if key[:n] in lines:
            return lines[key[:n]]
    return None
