"""The deploy lock, held as a lease that a thread renews while this process lives."""

from __future__ import annotations

import threading
from typing import Protocol

from ..hostdata.layout import Layout
from ..inventory import HostConfig
from ..ssh.session import Connect, Session
from . import hostlock
from .hostlock import LockOwner


class Announcer(Protocol):
    """What taking the lock needs of the pipeline's Reporter (opsctl.pipeline.report), which stands floors above
    the lock: a line to show."""

    def info(self, message: str) -> None: ...


class LeaseKeeper:
    """Renews the deploy lock's lease every third of it, from a thread with its own SSH connection, while this
    process holds the lock: a long build or gate keeps it, and a killed or cut-off run loses it after the lease
    (another run may then take it over, with a warning naming this one)."""

    def __init__(
        self, host: HostConfig, owner: LockOwner, connect: Connect, lease_s: float = hostlock.LOCK_LEASE_S
    ) -> None:
        self.layout = Layout(host.root)
        self.owner = owner
        self.lease_s = lease_s
        self._session = Session(host, connect)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{host.name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                hostlock.renew_lock(self._session.r, self.layout, self.owner, self.lease_s)
            except Exception:  # an SSH drop: the next round reconnects; the lease covers two missed rounds
                self._session.drop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._session.drop()


def take_lock(session: Session, host: HostConfig, owner: LockOwner, rep: Announcer) -> str:
    """Acquire (retried across SSH drops: a retry after a lost reply finds its own token). Returns the step's
    detail; taking over an expired or pre-reboot lock is announced with the old owner's name."""
    taken = session.call(lambda r: hostlock.acquire_lock(r, Layout(host.root), owner, host.name))
    lease = f"lease {hostlock.LOCK_LEASE_S:g}s, renewed while this run lives"
    if taken:
        rep.info(f"warning: {host.name}: took over the deploy lock of {taken}")
        return f"took over the lock of {taken}; {lease}"
    return lease
