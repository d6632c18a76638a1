"""The pre-restart speed check (docs/gate.md "The pre-restart speed check"): the new release's verify path timed
against the running release's on the host's GPU, on the same calls, alternating, before anything is switched.

``judge.py``: the timed pairs in, PASS / FAIL / cannot run and the figures out (pure). ``check.py``: the host
program's command and the reader of what it prints, and the step's I/O.

Imports: ``errors``, ``inventory``, ``ssh`` (the Remote protocol), ``comparison`` (the signed-rank test), ``host``."""
