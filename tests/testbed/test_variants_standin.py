"""The stand-in fault variants (opsctl.testbed.variants slow and common-mode), without a host: the tree's own
configuration switches the fault on, the backend reads it, and the release is a new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kdtree_backend.config import ConfigError, StandinFault, parse_config

from opsctl.release import make_manifest
from opsctl.testbed import variants

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("name", "fault"),
    [("slow", StandinFault("slow", variants.SLOW_FACTOR)), ("common-mode", StandinFault("common-mode"))],
)
def test_variant_sets_the_standin_fault_of_its_tree(tmp_path: Path, name: str, fault: StandinFault) -> None:
    tree = variants.VARIANTS[name](REPO, tmp_path / name)
    data = json.loads((tree / "deploy" / "kdtree.json").read_text())
    assert parse_config(data).standin.fault == fault
    original = json.loads((REPO / "deploy" / "kdtree.json").read_text())
    assert {k: v for k, v in data.items() if k != "standin"} == {k: v for k, v in original.items() if k != "standin"}
    assert (tree / variants.MARSHAL).read_text() == (REPO / variants.MARSHAL).read_text()  # the code is the same
    assert make_manifest(tree).id != make_manifest(REPO).id


def test_slow_takes_a_factor_in_range() -> None:
    assert StandinFault.parse("slow:2.5") == StandinFault("slow", 2.5)
    for bad in ("slow", "slow:x", "slow:0.5", "slow:1e9", "slow:nan"):
        with pytest.raises(ConfigError, match="slow"):
            StandinFault.parse(bad)
    with pytest.raises(ConfigError, match="takes no argument"):
        StandinFault.parse("common-mode:1")
