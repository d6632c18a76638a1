"""The parity gate (docs/gate.md): what decides whether a release may stay.

- ``lines``: the parser of the ``[kdtree]`` lines (the grammar of docs/lines.md; the marker and the token's form
  come from ``kdtree_backend.wire``);
- ``decision``: the gate's state and verdicts, and ``judge``: one message in, its verdict out. Every reader of
  parity lines (the deploy's gate, the pre-restart check, the capture replay, ``status``, ``logs``, ``parity
  check``) asks it;
- ``parity_check``: the gate's rules over a stored journal (``opsctl parity check``).
"""
