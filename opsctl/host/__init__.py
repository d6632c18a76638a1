"""A host as opsctl sees it: its facts, its release root, the programs a release runs there, and the read-only
views the CLI shows.

Remote commands are built as text by pure functions, every value ``shlex.quote``d, each beside the function
that reads what it prints; they run through a ``Remote`` (:mod:`opsctl.ssh.remote`).

- :mod:`.facts`: the one probe of systemd, the unit, GPUs and disk, and its parser (``key_values``: the one
  reader of ``key=value`` output);
- :mod:`.releaseroot`: the release root (releases, ``current``, state, the parity token file), its snapshot and
  the changes to it;
- :mod:`.history`: the history file (one JSON line per deploy, restart, rollback);
- :mod:`.replay`: the programs a release runs on the host (the extension build, the replay service for the
  pre-restart parity and the capture replay);
- :mod:`.ping`: ``opsctl ping``;
- :mod:`.views`: the read-only host commands (status, releases, service, lock, logs) as library calls.

Elsewhere, each in its own package: the lock (:mod:`opsctl.lock`), the unit (:mod:`opsctl.unit`), the journal
(:mod:`opsctl.journal`), captures (:mod:`opsctl.captures`), the health probe (:mod:`opsctl.health`).
"""
