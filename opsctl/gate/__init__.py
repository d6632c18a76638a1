"""The parity gate (docs/gate.md): what decides whether a release may stay.

- ``lines``: the parser of the ``[kdtree]`` lines (the grammar of docs/lines.md; the marker and the token's form
  come from ``kdtree_backend.wire``), with ``shapes`` (the shapes line and what it proves) and ``ownership``
  (whose a line is: the invocation's token, whole, cut short or in pieces);
- ``verdicts``: the verdicts and the one rule that gives a parity line its verdict (``line_verdict``), with the
  reasons in words;
- ``decision``: the gate's state and ``judge``: one message in, its verdict out. Every reader of parity lines (the
  deploy's gate, the pre-restart check, the capture replay, ``status``, ``logs``, ``parity check``) asks it;
- ``parity_check``: the gate's rules over a stored journal (``opsctl parity check``), with what it found in
  ``parity_report``.

It may import the packages on the floors below it (docs/architecture.md "Floors"): ``journal`` (the entries, a
stored journal's reader), ``hostdata``, ``inventory``,
``errors``, ``probe`` (what the probe traffic's answers say); and ``kdtree_backend.wire``.
"""
