"""opsctl's command line: thin over the library (options, rendering, the error boundary), one module a command or
a group of commands (``hosts``, ``deploy``, ``restart`` (restart, rollback), ``adopt``, ``service``, ``releases``,
``status``, ``logs``, ``lock``, ``health``, ``parity``, ``capture``, ``bundle``, ``testbed``), composed in
``main.py``. Shared: ``common.py`` (options, output, the error boundary), ``progress.py`` (a single-host
command's live steps and closing verdict), ``rollout.py`` (a group target's plan and table), ``parityview.py``
(parity lines and their verdicts as status and logs show them), ``render.py`` (the tables and texts of health
results and roll-outs), ``helptext.py`` (every command's help as prose: the terminal wraps it, not the docstring).

The top floor but ``__main__`` (docs/architecture.md, "Floors"): it may import every package of opsctl; none
imports it. A command module imports what it needs inside its commands, so that ``opsctl --help`` starts at once
(main.py)."""

import os

# Pydantic looks for third-party plugins by reading every installed package's metadata the first time a model is
# built: ~15 ms of each start, for hooks (tracing, logging) that opsctl's own models do not use. The command line
# asks for none, as Typer does while it builds its parameters; a value the user set is kept.
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from .main import app, main

__all__ = ["app", "main"]
