"""What the inventory shows and how fast (issue 36 items 7, 10): `hosts --json` never prints an alert command's
arguments, and an inventory at the documented limits still loads and lists quickly, while a 10 MB prompt (which
made `hosts --json` take 21 s) is refused at load, naming the file, line and field."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from opsctl.cli.main import main
from opsctl.inventory.settings import MAX_INPUT_IDS, MAX_PROMPT_CHARS

SECRET = "s3cr3t-T0ken"


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text("hosts:\n  a:\n    address: 10.0.0.1\n    gpu_arch: null\n" + body)
    return path


def test_hosts_json_redacts_the_alert_commands_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = write(tmp_path, f"    health:\n      alert_command: /usr/local/bin/page --token {SECRET} --to ops\n")
    assert main(["--inventory", str(inv), "hosts", "--json"]) == 0
    out = capsys.readouterr().out
    health = json.loads(out)["hosts"][0]["health"]
    assert health["alert_command"] == "/usr/local/bin/page ... (arguments redacted)" and SECRET not in out


def test_an_inventory_at_the_limits_lists_quickly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prompts = json.dumps(["p" * MAX_PROMPT_CHARS] * 4)  # 1 MiB of prompts: the section's limit
    ids = json.dumps([[7] * MAX_INPUT_IDS] * 2)  # 65,536 token ids: the limit
    inv = write(
        tmp_path, f"    gate:\n      probe:\n        prompts: {prompts}\n      compare:\n        input_ids: {ids}\n"
    )
    t = time.monotonic()
    assert main(["--inventory", str(inv), "hosts", "--json"]) == 0
    elapsed = time.monotonic() - t
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["hosts"][0]["gate"]["probe"]["prompts"]) == 4
    assert elapsed < 10, f"hosts --json took {elapsed:.1f}s"


def test_a_10_mb_prompt_is_refused_at_load_naming_the_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = write(tmp_path, "    gate:\n      probe:\n        prompts:\n          - " + "x" * 10_000_000 + "\n")
    t = time.monotonic()
    assert main(["--inventory", str(inv), "hosts", "--json"]) == 2
    assert time.monotonic() - t < 5
    assert "10,000" in json.loads(capsys.readouterr().out)["error"]
    inv = write(tmp_path, "    gate:\n      probe:\n        prompts:\n          - " + "x" * 2_000_000 + "\n")
    assert main(["--inventory", str(inv), "hosts", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error.startswith(f"{inv}:7: hosts.a.gate.probe.prompts: prompt 0 has 2,000,000 characters"), error
