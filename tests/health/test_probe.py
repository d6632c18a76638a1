"""The health probe's command: the facts probe first, then the host-side program (its text on stdin), handed the
unit's invocation."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from kdtree_backend.wire import MARKER

from opsctl.health import probe as hp
from opsctl.hostdata.facts import facts_command, parse_facts
from tests.shell import HOSTILE, sh


def params(root: str, http_url: str | None = None) -> hp.ProbeParams:
    return hp.ProbeParams(unit="u", root=root, http_url=http_url, http_timeout_s=5, parity_window_s=600)


def test_probe_text_carries_the_facts_and_quoted_parameters() -> None:
    cmd = hp.probe_command(params(HOSTILE, "http://127.0.0.1:30000/health"))
    assert cmd.startswith(f"F=$(exec </dev/null\n{facts_command(HOSTILE, 'u')}")
    assert HOSTILE not in cmd.rsplit("python3 - ", 1)[1]  # the configuration travels on stdin, never in argv
    payload = hp.probe_payload(params(HOSTILE, "http://127.0.0.1:30000/health"))
    doc = json.loads(json.loads(payload.split("CONFIG_TEXT: str | None = ", 1)[1].split("\n", 1)[0]))
    assert doc["root"] == HOSTILE and doc["unit"] == "u" and doc["window"] == 600
    assert doc["marker"] == MARKER and doc["max_lines"] == hp.MAX_PARITY_LINES
    assert doc["http_url"] == "http://127.0.0.1:30000/health"


def test_health_url_keeps_the_path_a_path() -> None:
    assert hp.health_url(30000, "/health") == "http://127.0.0.1:30000/health"
    assert hp.health_url(1, "/@evil.example/x").startswith("http://127.0.0.1:1/")


def test_probe_runs_locally_and_splits(tmp_path: Path) -> None:
    p = params(str(tmp_path))
    out = sh(hp.probe_command(p, python=sys.executable), stdin=hp.probe_payload(p)).stdout
    facts_text, doc = hp.split_probe_output(out)
    assert parse_facts(facts_text).disk_path == str(tmp_path)
    assert "host_time" in doc and "release_error" in doc and "parity_lines" not in doc  # no unit: no invocation


def test_split_refuses_other_output() -> None:
    with pytest.raises(ValueError, match="no separator"):
        hp.split_probe_output("python3: not found\n")
    with pytest.raises(ValueError):
        hp.split_probe_output(f"x=1\n{hp.SEPARATOR}\n[1, 2]\n")
