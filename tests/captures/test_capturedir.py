"""The capture directory's commands, as text and in a shell, and the listing program they run on the host."""

from __future__ import annotations

import ast
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from kdtree_backend.wire import CAPTURE_ID_RE

from opsctl.captures import capturedir as hc
from opsctl.captures import listing_on_host as on_host
from opsctl.errors import UsageError
from tests.shell import HOSTILE, sh

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


def test_list_command_runs_the_listing_program_from_stdin(tmp_path: Path) -> None:
    d = tmp_path / "capture"
    (d / CID).mkdir(parents=True)
    (d / "not-a-capture").mkdir()
    program = hc.LISTING_PROGRAM
    doc = json.loads(sh(program.command(sys.executable), stdin=program.payload(hc.listing_config(str(d)))).stdout)
    assert doc["dir"] == str(d) and [c["id"] for c in doc["captures"]] == [CID]
    argv = shlex.split(program.command("/opt/py thon"))
    assert argv == ["/opt/py thon", "-"]  # the directory, the pattern and the file's name travel on stdin
    assert hc.listing_config(HOSTILE) == {
        "dir": HOSTILE,
        "id_pattern": CAPTURE_ID_RE.pattern,
        "request_file": hc.REQUEST_FILE,
    }
    hostile = json.loads(sh(program.command(sys.executable), stdin=program.payload(hc.listing_config(HOSTILE))).stdout)
    assert hostile["dir"] == HOSTILE


def test_the_program_shipped_is_the_module() -> None:
    assert hc.LISTING_PROGRAM.text() == Path(on_host.__file__).read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------- listing_on_host


def test_load_json_is_none_for_what_cannot_be_read(tmp_path: Path) -> None:
    (tmp_path / "ok.json").write_text('{"a": 1}')
    (tmp_path / "torn.json").write_text('{"a": ')
    assert on_host.load_json(str(tmp_path / "ok.json")) == {"a": 1}
    assert on_host.load_json(str(tmp_path / "torn.json")) is None
    assert on_host.load_json(str(tmp_path / "missing.json")) is None
    assert on_host.load_json(str(tmp_path)) is None  # a directory


def test_tree_bytes_counts_files_not_link_targets(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "a").write_bytes(b"x" * 10)
    (tree / "sub" / "b").write_bytes(b"y" * 5)
    (tmp_path / "outside").write_bytes(b"z" * 1000)
    (tree / "link").symlink_to(tmp_path / "outside")
    assert on_host.tree_bytes(str(tree)) == 15 + (tree / "link").lstat().st_size
    assert on_host.tree_bytes(str(tmp_path / "missing")) == 0


def test_call_entry_lists_the_manifest_keys_and_the_name() -> None:
    call = on_host.call_entry({"tp": 1, "layer": 30, "secret": "x"}, "tp1-L30-s0")
    assert list(call) == [*on_host.CALL_KEYS, "name"]
    assert call["tp"] == 1 and call["layer"] == 30 and call["bs"] is None and call["name"] == "tp1-L30-s0"
    assert "secret" not in call


def test_capture_entry_sorts_children_into_calls_done_and_partial(tmp_path: Path) -> None:
    d = tmp_path / CID
    (d / "tp0-L0-s0").mkdir(parents=True)
    (d / "tp0-L0-s0" / "manifest.json").write_text(json.dumps({"tp": 0, "layer": 0, "step": 0}))
    (d / "tp1-L0-s0").mkdir()  # no manifest yet: still being written
    (d / ".tp1-L0-s1.partial").mkdir()
    (d / "tp0.done.json").write_text(json.dumps({"tp": 0, "reason": "steps"}))
    (d / "tp1.done.json").write_text("[]")  # not a finish document
    (d / "notes.txt").write_text("ignored")
    entry = on_host.capture_entry(str(d), CID)
    assert list(entry) == ["id", "mtime", "bytes", "calls", "done", "partial"]
    assert [c["name"] for c in entry["calls"]] == ["tp0-L0-s0"]
    assert entry["done"] == [{"tp": 0, "reason": "steps"}] and entry["partial"] == 2
    assert entry["bytes"] == on_host.tree_bytes(str(d)) and entry["mtime"] == d.lstat().st_mtime


def test_listing_takes_only_real_capture_directories(tmp_path: Path) -> None:
    root = tmp_path / "capture"
    (root / CID).mkdir(parents=True)
    (root / "not-a-capture").mkdir()
    (root / "c20260601T120007Z-000000").symlink_to(root / CID)
    (root / "c20260601T120008Z-000000").write_text("a file")
    (root / hc.REQUEST_FILE).write_text(json.dumps({"id": CID}))
    doc = on_host.listing(str(root), CAPTURE_ID_RE, hc.REQUEST_FILE, 123.0)
    assert list(doc) == ["now", "dir", "request", "captures"]
    assert doc["now"] == 123.0 and doc["request"] == {"id": CID} and [c["id"] for c in doc["captures"]] == [CID]
    assert on_host.listing(str(tmp_path / "none"), CAPTURE_ID_RE, hc.REQUEST_FILE, 1.0) == {
        "now": 1.0,
        "dir": str(tmp_path / "none"),
        "request": None,
        "captures": [],
    }


def test_main_prints_one_document_and_refuses_a_wrong_call(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert on_host.main(json.dumps(hc.listing_config(str(tmp_path)))) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and json.loads(out)["dir"] == str(tmp_path)
    assert on_host.main(json.dumps({"dir": str(tmp_path)})) == on_host.EXIT_USAGE
    assert "usage:" in capsys.readouterr().err


def test_the_listing_program_imports_only_the_standard_library() -> None:
    """It runs with the host's bare python3: no opsctl, no kdtree_backend, nothing installed."""
    tree = ast.parse(Path(on_host.__file__).read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported and imported <= sys.stdlib_module_names | {"__future__"}
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))
