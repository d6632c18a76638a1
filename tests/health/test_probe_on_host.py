"""The probe's host-side program (opsctl/health/probe_on_host.py), function by function, in this process."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path

import pytest
from kdtree_backend.wire import MARKER

from opsctl.health import probe_on_host as host
from opsctl.health.probe import PROBE_PROGRAM


def test_the_shipped_text_is_this_module() -> None:
    assert PROBE_PROGRAM.text() == Path(host.__file__).read_text(encoding="utf-8")


def journal(*entries: object) -> str:
    return "\n".join(e if isinstance(e, str) else json.dumps(e) for e in entries)


def test_parity_lines_keep_the_markers_lines_newest_last() -> None:
    text = journal(
        {"MESSAGE": f"{MARKER} parity a", "__REALTIME_TIMESTAMP": "1700000000500000"},
        "not json",
        {"MESSAGE": "something else"},
        {"MESSAGE": list(f"{MARKER} bytes".encode())},  # journald stores a non-UTF-8-clean message as bytes
        {"MESSAGE": f"{MARKER} parity c", "__REALTIME_TIMESTAMP": "1700000002000000"},
    )
    assert host.parity_lines(text, MARKER, 10) == [
        [1700000000.5, f"{MARKER} parity a"],
        [0.0, f"{MARKER} bytes"],
        [1700000002.0, f"{MARKER} parity c"],
    ]
    assert [m for _, m in host.parity_lines(text, MARKER, 2)] == [f"{MARKER} bytes", f"{MARKER} parity c"]
    assert host.parity_lines(text, "[other]", 10) == []


def test_journal_argv_reads_one_invocation_in_whole_seconds() -> None:
    argv = host.journal_argv("kdtree", "abc", 600.9)
    assert argv[:4] == ["journalctl", "-u", "kdtree", "_SYSTEMD_INVOCATION_ID=abc"]
    assert argv[argv.index("--since") + 1] == "-600s" and "json" in argv


def release(root: Path) -> Path:
    rel = root / "releases" / "r1"
    (rel / "sub" / "__pycache__").mkdir(parents=True)
    (rel / "a.txt").write_text("a\n")
    (rel / "sub" / "b.txt").write_text("b\n")
    (rel / "sub" / "__pycache__" / "c.pyc").write_bytes(b"\0")
    (rel / "big.bin").write_bytes(b"x" * 100)
    (rel / "link").symlink_to("a.txt")
    (root / "current").symlink_to("releases/r1/")
    return rel


def test_release_facts_hash_the_release_but_links_caches_and_the_manifest(tmp_path: Path) -> None:
    rel = release(tmp_path)
    (rel / "manifest.json").write_text('{"files": []}')
    found = host.release_facts(str(tmp_path), max_hash_bytes=50)
    assert found["release"] == "r1" and found["manifest"] == '{"files": []}'
    assert found["hashes"] == {
        "a.txt": hashlib.sha256(b"a\n").hexdigest(),
        "sub/b.txt": hashlib.sha256(b"b\n").hexdigest(),
        "big.bin": "too-large",
    }


def test_release_facts_without_a_manifest_or_a_release(tmp_path: Path) -> None:
    release(tmp_path)
    found = host.release_facts(str(tmp_path), max_hash_bytes=1000)
    assert found["release"] == "r1" and "manifest.json" in found["manifest_error"] and "manifest" not in found
    none = host.release_facts(str(tmp_path / "nothing"), max_hash_bytes=1000)
    assert list(none) == ["release_error"] and "No such file" in none["release_error"]


def test_lock_facts_read_the_owner_record_of_a_directory_or_a_plain_file(tmp_path: Path) -> None:
    assert host.lock_facts(str(tmp_path)) is None
    lock = tmp_path / "state" / "lock"
    lock.mkdir(parents=True)
    assert host.lock_facts(str(tmp_path))["text"].startswith("unreadable: ")  # type: ignore[index]
    (lock / "owner.json").write_text('{"pid": 1}')
    info = host.lock_facts(str(tmp_path))
    assert info is not None and info["text"] == '{"pid": 1}' and 0 <= info["age_s"] < 60
    (lock / "owner.json").unlink()
    lock.rmdir()
    lock.write_text("x" * 5000)
    assert host.lock_facts(str(tmp_path))["text"] == "x" * host.SMALL_FILE_MAX_CHARS  # type: ignore[index]


def test_run_reports_a_missing_program_as_127() -> None:
    assert host.run(["/nonexistent/journalctl"]) == (127, "", "/nonexistent/journalctl: not found")


def test_http_facts_report_a_refused_connection_as_an_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        found = host.http_facts(f"http://127.0.0.1:{port}/health", timeout=2)
    assert "status" not in found and found["error"].startswith("URLError") and found["elapsed_s"] >= 0


def test_main_prints_one_document_in_the_probes_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    release(tmp_path)
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "parity.env").write_text("KDTREE_PARITY_TOKEN=t\n")
    monkeypatch.setenv("PATH", os.fspath(tmp_path / "no-journalctl"))
    cfg = {
        "unit": "u",
        "root": str(tmp_path),
        "http_url": None,
        "http_timeout": 1,
        "window": 60,
        "max_lines": 10,
        "max_hash_bytes": 1000,
        "marker": MARKER,
    }
    assert host.main(json.dumps(cfg), ["-", "inv"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc) == ["host_time", "release", "hashes", "manifest_error", "journal_error", "parity_env"]
    assert doc["journal_error"] == "journalctl: not found" and doc["parity_env"] == "KDTREE_PARITY_TOKEN=t\n"
