"""The release root's paths on a host (docs/release-layout.md). Every path a command names goes through
:class:`Layout`, whose ``release`` refuses anything but a release id: nothing built from it deletes outside
``<root>/releases`` and ``<root>/state/lock``."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DeployFailed
from ..release import ADOPTED_ID_RE, ID_RE


def valid_id(release: str) -> bool:
    return bool(ID_RE.match(release) or ADOPTED_ID_RE.match(release))


def check_id(release: str) -> str:
    if not valid_id(release):
        raise DeployFailed(f"{release!r} is not a release id (like r0123456789ab)")
    return release


@dataclass(frozen=True)
class Layout:
    root: str

    @property
    def releases(self) -> str:
        return f"{self.root}/releases"

    @property
    def current(self) -> str:
        return f"{self.root}/current"

    @property
    def state(self) -> str:
        return f"{self.root}/state"

    @property
    def lock(self) -> str:
        return f"{self.state}/lock"

    @property
    def history(self) -> str:
        return f"{self.state}/history.jsonl"

    @property
    def bad(self) -> str:
        return f"{self.state}/bad"

    @property
    def last_good(self) -> str:
        return f"{self.state}/last-good"

    @property
    def managed(self) -> str:
        return f"{self.state}/managed.json"

    @property
    def parity_env(self) -> str:
        """The unit's EnvironmentFile holding this invocation's parity token (root-only, rewritten per restart)."""
        return f"{self.state}/parity.env"

    @property
    def cursors(self) -> str:
        return f"{self.state}/cursors"

    def release(self, release: str) -> str:
        return f"{self.releases}/{check_id(release)}"
