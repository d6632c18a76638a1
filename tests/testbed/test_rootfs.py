"""opsctl/testbed/rootfs.py: the cache key of a rootfs, and when a cached one counts as complete."""

from __future__ import annotations

from pathlib import Path

from opsctl.testbed.rootfs import PACKAGES, RECIPE_MARKER, cached_rootfs, is_complete, recipe_key


def test_recipe_key_changes_with_what_goes_into_the_rootfs() -> None:
    assert recipe_key() == recipe_key()
    assert recipe_key(packages=(*PACKAGES, "vim")) != recipe_key()
    assert recipe_key(pip=("torch==2.12.0",)) != recipe_key()
    assert recipe_key(packages=tuple(reversed(PACKAGES))) == recipe_key()  # order does not matter


def test_a_rootfs_is_complete_only_with_its_marker(tmp_path: Path) -> None:
    root = cached_rootfs(tmp_path)
    assert root.parent == tmp_path and root.name == f"rootfs-{recipe_key()}"
    (root / "etc").mkdir(parents=True)
    assert not is_complete(root)  # a half build (or someone else's directory) is never used
    (root / RECIPE_MARKER).write_text(recipe_key() + "\n")
    assert is_complete(root)
