"""journald on a host, and journals read back.

- ``entry``: one journal entry (``Entry``), read live from a host or from a stored journal;
- ``query``: the journalctl commands, each beside the function that reads its output (mark, poll, logs, latest
  parity lines);
- ``follower``: follows a unit's new invocation(s) after a restart, resumable by cursor (the gate's source);
- ``reader``: a stored journal (journalctl's text or JSON output) read as entries: the journald prefixes,
  ``[N blob data]``, restart boundaries, whole lines from blocks of input (``opsctl parity check``'s input).

It knows nothing of what a parity line means (that is ``gate``, a floor above). It may import the packages on the
floors below it (docs/architecture.md "Floors": here ``unit``, ``hostdata``, ``errors``) and ``kdtree_backend.wire``.
"""
