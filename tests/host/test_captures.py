"""The capture directory's commands, as text and in a shell."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest

from opsctl.captures import capturedir as hc
from opsctl.errors import UsageError

from .shell import HOSTILE, sh

CID = "c20260601T120005Z-a1b2c3"


def test_prune_refuses_anything_but_capture_ids() -> None:
    assert hc.prune_command("/d", []) == "true"
    assert shlex.split(hc.prune_command(HOSTILE, [CID])) == ["rm", "-rf", "--", f"{HOSTILE}/{CID}"]
    with pytest.raises(UsageError, match=re.escape("refusing to remove '../x': not a capture id")):
        hc.prune_command("/d", [CID, "../x"])


def test_disarm_only_removes_its_own_request(tmp_path: Path) -> None:
    d = tmp_path / "cap dir"
    assert sh(hc.prepare_dir_command(str(d))).returncode == 0
    assert d.stat().st_mode & 0o777 == 0o700
    (d / hc.REQUEST_FILE).write_text(json.dumps({"id": CID}))
    sh(hc.disarm_command(str(d), "c20260601T120006Z-ffffff"))
    assert (d / hc.REQUEST_FILE).exists()
    sh(hc.disarm_command(str(d), CID))
    assert not (d / hc.REQUEST_FILE).exists()
    with pytest.raises(UsageError, match="bad capture id"):
        hc.disarm_command(str(d), "x; rm -rf /")


def test_list_command_runs_the_listing_script(tmp_path: Path) -> None:
    d = tmp_path / "capture"
    (d / CID).mkdir(parents=True)
    (d / "not-a-capture").mkdir()
    doc = json.loads(sh(hc.list_command(sys.executable, str(d))).stdout)
    assert doc["dir"] == str(d) and [c["id"] for c in doc["captures"]] == [CID]
    assert shlex.split(hc.list_command("/opt/py thon", HOSTILE))[::2] == ["/opt/py thon", hc.LIST_SCRIPT]
