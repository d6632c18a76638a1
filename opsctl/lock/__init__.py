"""The deploy lock of a host (docs/release-layout.md).

- ``hostlock``: the lock's commands (atomic mkdir, owner record, boot id, lease), what they print read back,
  and ``LockOwner``;
- ``lease``: the lock held as a lease that a thread renews while the command runs.
"""
