"""The CLI starts at once (issue 38): the commands that connect nowhere (--help, hosts, parity check, bundle)
never import the SSH stack (paramiko, invoke) or the pipeline; the lazily registered commands show their own help;
host and group names complete from the inventory, offline."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from opsctl.cli.common import ENV_VAR
from opsctl.cli.completion import complete_target
from opsctl.inventory import loader

cli_main = importlib.import_module("opsctl.cli.main")  # the module (opsctl.cli.main is also the function)
REPO = Path(__file__).resolve().parents[2]
HEAVY = ("paramiko", "invoke", "opsctl.pipeline", "opsctl.ssh.client")

_PROBE = """
import json, sys
from opsctl.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as e:
    rc = e.code
sys.stdout.flush()
print("\\nLOADED " + json.dumps([m for m in {heavy!r} if m in sys.modules]) + f" RC {{rc}}")
"""


def _loaded(*args: str, tmp_path: Path) -> tuple[list[str], str]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "100", "HOME": str(tmp_path)},
        timeout=120,
    )
    tail = proc.stdout.rsplit("\nLOADED ", 1)
    assert len(tail) == 2, proc.stdout + proc.stderr
    return json.loads(tail[1].split(" RC ")[0]), tail[0]


def _inventory_file(tmp_path: Path) -> Path:
    doc = {
        "defaults": {"address": "127.0.0.1"},
        "hosts": {"gpu-a": {}, "gpu-b": {}, "edge": {}},
        "groups": {"fleet": ["gpu-a", "gpu-b"]},
    }
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("hosts", "--json"),
        ("parity", "check", "journal.txt"),
        ("parity", "check", "--help"),
        ("compare", "--help"),
        ("bundle", "--json", "--src", str(REPO)),
        ("status", "--help"),
        ("deploy", "--help"),
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_commands_that_connect_nowhere_load_no_ssh_stack(tmp_path: Path, args: tuple[str, ...]) -> None:
    _inventory_file(tmp_path)
    (tmp_path / "journal.txt").write_text("")
    loaded, out = _loaded(*args, tmp_path=tmp_path)
    assert loaded == [], f"opsctl {' '.join(args)} imported {loaded}"
    assert out.strip(), "the command printed nothing"


def test_help_lists_every_command_with_its_own_help() -> None:
    """The lazily imported commands show, in `opsctl --help`, the first paragraph of their own help."""
    for name, (_module, _attribute, _group, short_help) in cli_main.LAZY.items():
        real = cli_main.load_command(name)
        assert (real.help or "").split("\n\n")[0].strip() == short_help, name
    group = typer.main.get_command(cli_main.app)
    assert set(cli_main.LAZY) <= set(group.commands)  # type: ignore[attr-defined]


def test_the_inventory_variable_is_the_loaders() -> None:
    assert ENV_VAR == loader.ENV_VAR


def test_host_and_group_names_complete_from_the_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _inventory_file(tmp_path)
    monkeypatch.setenv(ENV_VAR, str(path))
    ctx = typer.Context(typer.main.get_command(cli_main.app))
    assert complete_target(ctx, "gpu") == ["gpu-a", "gpu-b"]
    assert complete_target(ctx, "") == [
        "edge",
        "gpu-a",
        "gpu-b",
        "fleet",
    ]  # hosts (as the file lists them), then groups
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "missing.yaml"))
    assert complete_target(ctx, "") == []  # nothing to read: nothing completed, no error in the shell


def test_completion_through_the_shell_protocol(tmp_path: Path) -> None:
    """What bash asks after `opsctl --install-completion`: the names come back, and no host is contacted."""
    path = _inventory_file(tmp_path)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        ENV_VAR: str(path),
        "_OPSCTL_COMPLETE": "complete_bash",
        "COMP_WORDS": "opsctl status gpu",
        "COMP_CWORD": "2",
    }
    code = "import sys; from opsctl.cli import main; sys.exit(main())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.split() == ["gpu-a", "gpu-b"], proc.stdout + proc.stderr


@pytest.mark.parametrize("args", [("--help",), ("bundle", "--json", "--src", str(REPO))], ids=["--help", "bundle"])
def test_commands_without_the_inventory_load_no_pydantic(tmp_path: Path, args: tuple[str, ...]) -> None:
    # pydantic (~0.1 s of a start) comes with the inventory's models, and with Typer 0.29's per-parameter
    # adapters (pyproject.toml keeps Typer below 0.29): a command that reads no inventory does not pay for it.
    probe = _PROBE.format(heavy=("pydantic",))
    proc = subprocess.run(
        [sys.executable, "-c", probe, *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "100", "HOME": str(tmp_path)},
        timeout=120,
    )
    assert "\nLOADED []" in proc.stdout, proc.stdout[-400:] + proc.stderr[-400:]
