"""Help text as prose: a docstring's own line breaks (kept under 120 columns in the source) are not the screen's. Each
paragraph of a command's help, short help, epilog and option help is joined into one line, so that the terminal wraps
it at its own width; the blank lines between paragraphs stay, and a paragraph Click marks verbatim (``\\b``) is
kept as written. Applied to every command once, where the command tree is built (main.py)."""

from __future__ import annotations

from typer._click.core import Command  # Typer's own copy of Click's classes
from typer.core import TyperGroup


def prose(text: str) -> str:
    """``text`` with each paragraph on one line (its lines joined by a space); paragraph breaks and ``\\b``
    paragraphs kept."""
    paragraphs = text.strip("\n").split("\n\n")
    return "\n\n".join(p if p.lstrip().startswith("\b") else " ".join(p.split()) for p in paragraphs)


def flow_help(command: Command) -> Command:
    """``command`` (and, for a group, every command under it) with its help texts as prose; the same object."""
    for attribute in ("help", "short_help", "epilog"):
        text = getattr(command, attribute, None)
        if text:
            setattr(command, attribute, prose(text))
    for param in command.params:
        text = getattr(param, "help", None)
        if text:
            param.help = prose(text)  # type: ignore[attr-defined]
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            flow_help(sub)
    return command
