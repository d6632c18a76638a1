"""What runs on a host: every shell command opsctl sends, built as text by pure functions.

Each module here turns values (paths, unit names, tokens, ids) into a command line with every value
``shlex.quote``d, and parses what the command prints; none of them opens a connection. The modules that talk to
a host (``opsctl.host.rootstate``, ``opsctl.pipeline``, ``opsctl.health.checks``, ...) hand these commands to a ``Remote``
(:mod:`opsctl.ssh.remote`), so a command can be read, and tested as text, in one place (tests/host/).

- :mod:`.remote`: the ``Remote`` protocol every such caller uses;
- :mod:`.facts`: the one probe of systemd, the unit, GPUs and disk, and its parser;
- :mod:`.layout`: the release root (releases, ``current``, state, history), its snapshot;
- :mod:`.lock`: the deploy lock and its lease;
- :mod:`.unit`: systemctl actions on the service unit;
- :mod:`.journal`: journalctl queries (the gate's follower, logs, the latest parity lines);
- :mod:`.replay`: the replay service runs (pre-restart parity, capture replay) and the extension build;
- :mod:`.captures`: the capture directory (listing, arming, pruning);
- :mod:`.probe`: the health probe;
- :mod:`.session`: the SSH layer's own wrappers (run marker, timeout killer, atomic write).
"""
