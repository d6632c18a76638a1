"""Captures of real verify calls on a host (docs/capture.md): opsctl's side. The backend
(``kdtree_backend.capture``) does the capturing; opsctl writes its request file, reads what it stored, removes old
captures and replays them with a chosen release.

What is where:

- ``capturedir``: the capture directory's remote commands, as text (list, prepare, disarm, prune) and the
  capture-id check;
- ``listing_on_host``: the program that lists the directory, run on the host (stdlib only, sent on stdin);
- ``listing``: its JSON parsed into capture sets and the request file's state, and the SSH call that reads it;
- ``pruning``: the prune plan and ``opsctl captures``' session (list, prune, disarm);
- ``arming``: the request document, arming, waiting for every TP rank, disarming, ``opsctl capture``'s session;
- ``capture_replay``: the replay of stored captures with a release and its judgement by the gate's rules (the
  deploy's pre-restart check and ``opsctl parity replay``).

The CLI over them is ``opsctl/cli/capture.py``.
"""
