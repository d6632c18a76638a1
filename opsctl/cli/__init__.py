"""opsctl's command line: thin over the library (options, rendering, the error boundary), one module a group of
commands (``hosts``, ``deploy``, ``health``, ``parity``, ``capture``, ``bundle``, ``testbed``), composed in
``main.py``; ``common.py`` holds the shared options and output, ``render.py`` the tables and texts of results."""

from .main import app, main

__all__ = ["app", "main"]
