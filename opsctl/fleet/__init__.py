"""Many hosts at once.

- ``fanout``: the one way to run a function on many hosts, side by side, each result or exception kept as data;
- ``rollout``: group roll-outs of a single-host command (deploy, restart, rollback): canary, batches, failure
  budget, never touching a host after the roll-out stopped.
"""
