"""The read-only host commands' remote command lines, as text, and run for real in a local shell."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

from opsctl import hostinfo
from opsctl import hoststate as hs


def test_journal_command_quotes_and_windows() -> None:
    cmd = hostinfo.journal_command("sglang-k26-ddtree", since="10 min ago", lines=50, follow=False, kdtree_only=True)
    argv = shlex.split(cmd.split(" | ")[0])
    assert argv[:3] == ["journalctl", "-u", "sglang-k26-ddtree.service"]
    assert argv[argv.index("--since") + 1] == "10 min ago" and "-n" not in argv and "-f" not in argv
    assert cmd.endswith("| grep --line-buffered -F '[kdtree]'")
    followed = hostinfo.journal_command("u", since=None, lines=7, follow=True, kdtree_only=False)
    argv = shlex.split(followed)
    assert argv[argv.index("-n") + 1] == "7" and argv[-1] == "-f" and "grep" not in followed


def test_parity_lines_command_quotes_the_invocation() -> None:
    cmd = hostinfo.parity_lines_command("abc'; rm -rf /; echo '", most=5)
    assert shlex.split(cmd)[1] == "_SYSTEMD_INVOCATION_ID=abc'; rm -rf /; echo '"
    assert cmd.endswith("tail -n 5")


def test_release_meta_command_reads_each_manifest(tmp_path: Path) -> None:
    layout = hs.Layout(str(tmp_path / "root with space"))
    for rid, commit in (("r00000000000a", "abc"), ("r00000000000b", None)):
        os.makedirs(layout.release(rid))
        doc = {"created_at": "2026-01-01T00:00:00Z", "source": {"commit": commit, "dirty": False}}
        Path(layout.release(rid), "manifest.json").write_text(json.dumps(doc, indent=1))
    out = subprocess.run(["bash", "-c", hostinfo.release_meta_command(layout)], capture_output=True, text=True).stdout
    meta = hostinfo.parse_release_meta(out)
    assert meta["r00000000000a"] == {"created_at": "2026-01-01T00:00:00Z", "commit": "abc", "dirty": False}
    assert meta["r00000000000b"]["commit"] is None
