"""The house: opsctl's packages stand on floors (docs/architecture.md, "Floors"), and an import only ever goes
down. Read from the source with ``ast`` (every import: module level, inside functions, under TYPE_CHECKING), so
a new upward import or a circle fails here before it becomes a knot."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "opsctl"
ARCHITECTURE = REPO / "docs" / "architecture.md"


def declared_floors(text: str) -> dict[str, int]:
    """The floor of each package, from the doc's table: ``| 3 | `unit`, `testbed` | ... |``."""
    section = text.split("\n## Floors", 1)[1].split("\n## ", 1)[0]
    floors: dict[str, int] = {}
    for m in re.finditer(r"^\|\s*(\d+)\s*\|([^|]*)\|", section, re.MULTILINE):
        for name in re.findall(r"`([a-z_]+)`", m.group(2)):
            floors[name] = int(m.group(1))
    return floors


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The opsctl modules ``name`` imports (``from . import x`` is module ``x`` when there is one)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "opsctl"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "opsctl":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in known else source)
    return out - {name}


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(name, path, known) for name, path in found.items()}


def package_of(module: str) -> str:
    """``opsctl.gate.lines`` -> ``gate``; ``opsctl.errors`` -> ``errors``; ``opsctl`` (its ``__init__``) -> ``opsctl``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph (its nodes in order), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_every_package_has_a_floor() -> None:
    floors = declared_floors(ARCHITECTURE.read_text())
    packages = {package_of(m) for m in modules()}
    assert packages - set(floors) == set(), "a package without a floor in docs/architecture.md"
    assert set(floors) - packages == set(), "a floor names a package that is not there"


def test_imports_only_go_down() -> None:
    floors = declared_floors(ARCHITECTURE.read_text())
    upward = []
    for module, targets in graph().items():
        here = floors[package_of(module)]
        for target in targets:
            there = floors[package_of(target)]
            if package_of(target) != package_of(module) and there >= here:
                upward.append(f"{module} (floor {here}) -> {target} (floor {there})")
    assert upward == [], "imports that do not go down a floor:\n" + "\n".join(sorted(upward))


def test_no_import_circle() -> None:
    edges = graph()
    packages: dict[str, set[str]] = {}
    for module, targets in edges.items():
        packages.setdefault(package_of(module), set()).update(
            package_of(t) for t in targets if package_of(t) != package_of(module)
        )
    assert cycle(packages) is None, f"packages import each other: {' -> '.join(cycle(packages) or [])}"
    assert cycle(edges) is None, f"modules import each other: {' -> '.join(cycle(edges) or [])}"


def test_the_checker_sees_a_circle_and_an_upward_import() -> None:
    """The checks above could pass by seeing nothing: they find what they are for on a made-up graph."""
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
    floors = declared_floors("\n## Floors\n| floor | packages |\n|---|---|\n| 0 | `errors` |\n| 2 | `ssh`, `x` |\n")
    assert floors == {"errors": 0, "ssh": 2, "x": 2}
    edges = graph()
    assert "opsctl.ssh.remote" in edges["opsctl.unit.unitfile"]  # relative imports resolved
    assert "opsctl.pipeline" in edges["opsctl.fleet.rollout"]  # `from opsctl import pipeline`, inside a function


def shared_base_names(paths: list[Path]) -> dict[str, list[str]]:
    """Base names held by more than one of ``paths`` (``__init__.py`` aside), each with the paths holding it."""
    holders: dict[str, list[str]] = {}
    for p in paths:
        if p.name != "__init__.py":
            holders.setdefault(p.name, []).append(p.relative_to(REPO).as_posix())
    return {name: found for name, found in holders.items() if len(found) > 1}


def test_one_name_per_module_outside_the_cli() -> None:
    """A module's name says what it is, once: two ``layout.py`` in two packages read as one thing in a traceback, a
    search or a table (docs/architecture.md). The command modules of opsctl/cli/ are named for their verbs, so
    ``cli/compare.py`` beside ``gate/compare.py`` is allowed."""
    outside_cli = [p for p in sorted(PACKAGE.rglob("*.py")) if not p.is_relative_to(PACKAGE / "cli")]
    assert shared_base_names(outside_cli) == {}, "modules outside opsctl/cli/ that share a name"


def test_the_name_check_sees_a_shared_name() -> None:
    found = shared_base_names([REPO / "opsctl/a/layout.py", REPO / "opsctl/b/layout.py", REPO / "opsctl/a/__init__.py"])
    assert found == {"layout.py": ["opsctl/a/layout.py", "opsctl/b/layout.py"]}
    assert shared_base_names([REPO / "opsctl/a/__init__.py", REPO / "opsctl/b/__init__.py"]) == {}
