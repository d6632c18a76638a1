"""The lines journald hid from the gate, on a real testbed host (issue 36, items 1 and 2): a release whose TP rank 1
prints one failing L30 line padded to 5,116 characters, or glued behind a served-request line, both carrying the
invocation's token, FAILs and is rolled back. Both used to PASS and become last-good (``journalctl -o json``
without ``--all`` printed the padded line's MESSAGE as null; the glued one was IGNORED as "inside another message").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl import pipeline as d
from opsctl.inventory import HostConfig
from opsctl.release import make_manifest
from opsctl.testbed import variants
from tests.pipeline import trees
from tests.pipeline.test_testbed_deploy import assert_healthy, ensure_good


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (variants.padded_line, "longer than 4096 characters"),
        (variants.glued_line, "inside another message"),
    ],
    ids=["padded", "glued"],
)
def test_a_hidden_failing_line_fails_the_gate_and_rolls_back(
    make: object,
    why: str,
    tb1: HostConfig,  # tests/pipeline/conftest.py
    good_tree: Path,
    good_id: str,
    tmp_path: Path,
) -> None:
    ensure_good(tb1, good_tree, good_id)
    bad = make(trees.SOURCE, tmp_path / "bad")  # type: ignore[operator]
    bad_id = make_manifest(bad).id
    # Past the pre-restart replay (which prints the same line): the gate reading the journal is what is tested.
    res = d.deploy(tb1, bad, d.DeployOptions(skip_prerestart_parity=True, force=True))  # force: bad from a rerun
    assert res.verdict == "FAIL", res.line()  # was PASS, and the release became last-good
    assert why in res.reason, res.reason
    assert res.rolled_back_to == good_id and res.rollback_verdict == "PASS", res.line()
    snap = assert_healthy(tb1, good_id)
    assert bad_id in snap.bad and snap.last_good == good_id
