"""A host as opsctl sees it: its release root, its history, the programs a release runs there, and the read-only
views the CLI shows.

Remote commands are built as text by pure functions, every value ``shlex.quote``d, each beside the function
that reads what it prints; they run through a ``Remote`` (:mod:`opsctl.ssh.remote`).

- :mod:`.releaseroot`: the release root (releases, ``current``, state, the parity token file), its snapshot and
  the changes to it;
- :mod:`.history`: the history file (one JSON line per deploy, restart, rollback);
- :mod:`.replay`: the programs a release runs on the host (the extension build, the replay service for the
  pre-restart parity and the capture replay);
- :mod:`.views`: the read-only host commands (status, releases, service, lock, logs) as library calls.

Below it (docs/architecture.md, "Floors"): the release root's paths and the host-facts probe with the readers of
host output (:mod:`opsctl.hostdata`), the lock (:mod:`opsctl.lock`), the unit (:mod:`opsctl.unit`), the journal
(:mod:`opsctl.journal`). Above it: captures, the pipeline, ``opsctl ping`` (:mod:`opsctl.fleet.ping`), health.
"""
