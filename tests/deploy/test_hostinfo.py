"""opsctl.hostinfo's parser of the release metadata, on what the host command really prints in a shell."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from opsctl import hostinfo
from opsctl import hoststate as hs
from opsctl.host.layout import release_meta_command


def test_release_meta_of_each_manifest_as_the_host_prints_it(tmp_path: Path) -> None:
    layout = hs.Layout(str(tmp_path / "root with space"))
    for rid, commit in (("r00000000000a", "abc"), ("r00000000000b", None)):
        os.makedirs(layout.release(rid))
        doc = {"created_at": "2026-01-01T00:00:00Z", "source": {"commit": commit, "dirty": False}}
        Path(layout.release(rid), "manifest.json").write_text(json.dumps(doc, indent=1))
    out = subprocess.run(["bash", "-c", release_meta_command(layout)], capture_output=True, text=True).stdout
    meta = hostinfo.parse_release_meta(out)
    assert meta["r00000000000a"] == {"created_at": "2026-01-01T00:00:00Z", "commit": "abc", "dirty": False}
    assert meta["r00000000000b"]["commit"] is None
