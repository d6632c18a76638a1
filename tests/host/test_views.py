"""opsctl.host.views's parser of the release metadata, on what the host command really prints in a shell."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from opsctl.host import releaseroot
from opsctl.host.releaseroot import release_meta_command


def test_release_meta_of_each_manifest_as_the_host_prints_it(tmp_path: Path) -> None:
    layout = releaseroot.Layout(str(tmp_path / "root with space"))
    for rid, commit in (("r00000000000a", "abc"), ("r00000000000b", None)):
        os.makedirs(layout.release(rid))
        doc = {"created_at": "2026-01-01T00:00:00Z", "source": {"commit": commit, "dirty": False}}
        Path(layout.release(rid), "manifest.json").write_text(json.dumps(doc, indent=1))
    out = subprocess.run(["/bin/sh", "-c", release_meta_command(layout)], capture_output=True, text=True).stdout
    meta = releaseroot.parse_release_meta(out)
    assert meta["r00000000000a"] == {"created_at": "2026-01-01T00:00:00Z", "commit": "abc", "dirty": False}
    assert meta["r00000000000b"]["commit"] is None


def test_status_shows_the_newest_line_of_each_rank_and_layer_never_the_middle_of_a_step() -> None:
    from opsctl.cli.parityview import LineJudge, latest_per_rank_and_layer
    from opsctl.gate.lines import ParityLine
    from opsctl.inventory import HostConfig

    def line(rank: int, layer: int, rel: float) -> ParityLine:
        return ParityLine(layer=layer, max_abs_diff=rel, mean=rel, rel=rel, rank=rank)

    # Three steps of 2 ranks x 3 layers, as the service prints them, then the first lines of a fourth step: the
    # old tail (the last 16 lines) began with TP0 L60.
    steps = [line(rank, layer, step / 1000) for step in range(3) for rank in (0, 1) for layer in (0, 30, 60)]
    judge = LineJudge(HostConfig(name="h", address="127.0.0.1", gpu_arch=None), None)
    latest = [j.line for j in latest_per_rank_and_layer([judge.line(p) for p in [*steps, line(0, 0, 0.009)]])]
    assert [(p.rank, p.layer) for p in latest if p] == [(0, 0), (0, 30), (0, 60), (1, 0), (1, 30), (1, 60)]
    assert latest[0] and latest[0].rel == 0.009 and latest[1] and latest[1].rel == 0.002  # the newest of each pair
