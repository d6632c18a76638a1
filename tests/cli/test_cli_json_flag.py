"""`--json=VALUE` (issue 36 item 10): `opsctl parity check --json=1 F` printed nothing on stdout and a box on
stderr; a flag given a value is a clean usage error, as JSON on stdout like every error under --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opsctl.cli.main import main


@pytest.mark.parametrize("value", ["1", "true", ""])
def test_a_json_flag_given_a_value_is_a_json_usage_error(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal = tmp_path / "j.txt"
    journal.write_text("x\n")
    assert main(["parity", "check", f"--json={value}", str(journal)]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["exit_code"] == 2 and "--json" in doc["error"] and "does not take a value" in doc["error"]
    assert err.startswith("error:") and "╭" not in err
