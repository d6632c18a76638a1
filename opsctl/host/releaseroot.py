"""The release root on a host (docs/release-layout.md) and the commands that read and change it.

<root>/releases/<id>/   one release
<root>/current          symlink -> releases/<id>, switched by rename(2) of a temp symlink
<root>/state/           managed.json, history.jsonl, lock/, bad/<id>, last-good, parity.env, cursors/

Every path a command names goes through :class:`Layout`, whose ``release`` refuses anything but a release id:
nothing built here deletes outside ``<root>/releases`` and ``<root>/state/lock``.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import DeployFailed
from ..lock.hostlock import lease_expiry_expr
from ..release import ADOPTED_ID_RE, ID_RE
from .facts import facts_command


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


def snapshot_command(root: str, unit: str) -> str:
    """Everything preflight and status need, in one command: the layout's ``key=value`` lines (parsed by
    ``opsctl.host.rootstate.parse_snapshot``) followed by the host facts (:func:`opsctl.host.facts.facts_command`)."""
    lay = Layout(root)
    r = shlex.quote(root)
    return f"""R={r}
echo "root_exists=$(test -d "$R" && echo 1 || echo 0)"
echo "managed=$(cat "$R/state/managed.json" 2>/dev/null | tr -d '\\n')"
echo "current=$(readlink "$R/current" 2>/dev/null)"
for d in "$R"/releases/*/; do [ -d "$d" ] && echo "release=$(stat -c %Y "$d") $(basename "$d")"; done
for f in "$R"/state/bad/*; do [ -f "$f" ] && echo "bad=$(basename "$f") $(head -c 800 "$f" | tr -d '\\n')"; done
echo "last_good=$(cat "$R/state/last-good" 2>/dev/null)"
if [ -d "$R/state/lock" ]; then echo "lock_present=1"; echo "lock=$(cat "$R/state/lock/owner.json" 2>/dev/null | tr -d '\\n')"; echo "lock_boot=$(cat "$R/state/lock/boot_id" 2>/dev/null)"; echo "lock_lease=$({lease_expiry_expr(lay.lock)})"; fi
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id)"
if [ -d "$R" ]; then for e in "$R"/*; do [ -e "$e" ] && echo "entry=$(basename "$e")"; done; fi
echo "now=$(date +%s)"
{facts_command(root, unit)}
"""


def ensure_layout_command(layout: Layout, managed_doc: str) -> str:
    """Create the directories, and ``managed.json`` with ``managed_doc`` unless the root is managed already."""
    dirs = [layout.releases, layout.state, layout.bad, layout.cursors]
    managed = shlex.quote(layout.managed)
    return (
        f"mkdir -p {' '.join(shlex.quote(d) for d in dirs)} && "
        f"{{ test -f {managed} || printf '%s\\n' {shlex.quote(managed_doc)} > {managed}; }}"
    )


def append_history_command(layout: Layout, line: str) -> str:
    """Append one line (one small write: concurrent readers never see half of it)."""
    return (
        f"mkdir -p {shlex.quote(layout.state)} && printf '%s\\n' {shlex.quote(line)} >> {shlex.quote(layout.history)}"
    )


def read_quietly_command(path: str) -> str:
    """``cat`` that prints nothing, and succeeds, when the file is not there."""
    return f"cat -- {shlex.quote(path)} 2>/dev/null || true"


def read_history_command(layout: Layout) -> str:
    return read_quietly_command(layout.history)


def switch_current_command(layout: Layout, release: str, tmp_name: str) -> str:
    """New symlink under ``tmp_name`` (in the root), then rename(2) over ``current``: readers see the old or the
    new target, never none. Fails when the release is not there."""
    tmp = f"{layout.root}/{tmp_name}"
    target = f"releases/{check_id(release)}"
    return (
        f"test -d {shlex.quote(layout.release(release))} && ln -sfn {shlex.quote(target)} {shlex.quote(tmp)} "
        f"&& mv -Tf {shlex.quote(tmp)} {shlex.quote(layout.current)}"
    )


def remove_releases_argv(layout: Layout, ids: Iterable[str]) -> list[str] | None:
    """``rm -rf`` of those releases (None when there are none); every id is checked to be a release id."""
    paths = [layout.release(i) for i in ids]
    return ["rm", "-rf", "--", *paths] if paths else None


def make_private_dir_argv(path: str) -> list[str]:
    return ["mkdir", "-p", "-m", "0700", "--", path]


def verify_checksums_command(release_dir: str) -> str:
    """Check the release's files against the manifest's ``sha256sum`` list, given on stdin."""
    return f"cd {shlex.quote(release_dir)} && sha256sum --quiet --strict -c -"


def release_meta_command(layout: Layout) -> str:
    """Per release: ``== <id>`` then its manifest's created_at, commit and dirty lines."""
    fields = "; ".join(f'grep -m1 \'"{k}"\' "$d/manifest.json" 2>/dev/null' for k in ("created_at", "commit", "dirty"))
    return f'for d in {shlex.quote(layout.releases)}/*/; do echo "== $(basename "$d")"; {fields}; done'


def foreign_files_command(root: str) -> str:
    """sha256sum of every file in ``root`` that opsctl did not put there (adopt: the hand-made install)."""
    return (
        f"cd {shlex.quote(root)} && find . \\( -path ./releases -o -path ./state -o -path ./current \\) -prune "
        "-o -type f -print0 | sort -z | xargs -0 -r sha256sum"
    )


def size_mb_command(root: str, entries: Iterable[str]) -> str:
    """Total MiB of ``entries`` (names in ``root``)."""
    names = " ".join(shlex.quote(e) for e in entries) or "/dev/null"
    return f"cd {shlex.quote(root)} && du -smc -- {names} | tail -n 1"


def resolve_current_command(root: str) -> str:
    return f"readlink -f -- {shlex.quote(root + '/current')}"


def is_dir_command(path: str) -> str:
    return f"test -d {shlex.quote(path)}"
