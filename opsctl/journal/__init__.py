"""journald on a host.

- ``query``: the journalctl commands, each beside the function that reads its output (mark, poll, logs, latest
  parity lines);
- ``follower``: follows a unit's new invocation(s) after a restart, resumable by cursor (the gate's source).
"""
