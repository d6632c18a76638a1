"""opsctl/cli/helptext.py: help wraps as prose. A docstring's own line breaks never reach the screen (issue 45:
"upload, build, parity, switch,\\n restart"); the terminal's width decides where a paragraph breaks, and the
blank line between paragraphs stays."""

from __future__ import annotations

import importlib
import itertools
import re

import pytest
import typer

from opsctl.cli import main as run_opsctl
from opsctl.cli.helptext import prose

WIDTH = 200
BOX = "│"
ROW_START = 4  # a panel's row starts its name within these columns (options at 1, arguments at 3)


def broken_lines(text: str) -> list[str]:
    """Each line of rendered help after which the next line goes on with the same paragraph although its first
    word would have fitted here: a break the text brought, not the width. Inside a panel a line goes on when its
    first column is empty (the description column wrapped: a row's name starts within the first few columns);
    outside, when it is not blank and not a new block. Typer's own metadata (``[required]``, ``[default: x]``)
    starts a line of its own."""
    found = []
    lines = text.splitlines()
    for line, following in itertools.pairwise(lines):
        boxed = line.startswith(BOX) and following.startswith(BOX)
        here, there = (line[1:-1], following[1:-1]) if boxed else (line, following)
        if not here.strip() or not there.strip() or line.startswith(("╭", "╰")) or following.startswith(("╭", "╰")):
            continue
        goes_on = len(there) - len(there.lstrip()) > ROW_START if boxed else not following.startswith((BOX, "╭", "╰"))
        room = len(here) - len(here.rstrip())
        first_word = there.split()[0]
        if goes_on and not first_word.startswith("[") and len(first_word) + 1 < room - 2:
            found.append(f"{line.rstrip()}\n{following.rstrip()}")
    return found


@pytest.mark.parametrize(
    "args",
    [("deploy", "--help"), ("--help",), ("releases", "--help"), ("compare", "--help"), ("capture", "--help")],
    ids=lambda a: " ".join(a),
)
def test_help_has_no_line_broken_mid_sentence(
    args: tuple[str, ...], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    assert run_opsctl(list(args)) == 0
    text = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert text.strip(), "no help printed"
    assert broken_lines(text) == []


def test_the_check_sees_a_broken_line() -> None:
    """The check above could pass by seeing nothing: the help as it was (the docstring's breaks on screen)."""
    pad = " " * 60
    text = f"{BOX} deploy    upload, build, parity, switch,{pad}{BOX}\n{BOX}           restart, gate.{pad}{' ' * 32}{BOX}\n"
    assert len(broken_lines(text)) == 1
    assert broken_lines(f" Exit codes: 0 PASS;{pad}\n 1 not confirmed{pad}\n") != []
    wrapped = f" {'word ' * 39}word\n more words\n"  # a line the width broke: the next word did not fit
    assert broken_lines(wrapped) == []


def test_prose_joins_the_lines_of_a_paragraph_and_keeps_paragraphs() -> None:
    assert (
        prose("upload, build, parity, switch,\n    restart, gate.") == "upload, build, parity, switch, restart, gate."
    )
    assert prose("First paragraph\ngoes on.\n\nSecond\nparagraph.") == "First paragraph goes on.\n\nSecond paragraph."
    verbatim = "\b\njq a.json\njq b.json"
    assert prose(f"Intro.\n\n{verbatim}") == f"Intro.\n\n{verbatim}"


def test_every_command_help_has_no_line_broken_mid_sentence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command and group of the tree, the lazily imported ones included: the rule holds in one place for all."""
    cli_main = importlib.import_module("opsctl.cli.main")
    paths: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        if isinstance(command, cli_main.LazyCommand):
            command = command.real()
        paths.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(cli_main.app), [])
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    broken = {}
    for path in paths:
        assert run_opsctl([*path, "--help"]) == 0, path
        found = broken_lines(re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out))
        if found:
            broken[" ".join(path)] = found
    assert len(paths) > 20 and broken == {}
