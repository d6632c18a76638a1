"""Every error under --json is one JSON object on stdout, usage errors of the option parser included; numbers
given as options are finite."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from opsctl.cli import common
from opsctl.cli.main import main

INVENTORY = "hosts:\n  h1: {address: 127.0.0.1, gpu_arch: null}\n"


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text(INVENTORY)
    return path


@pytest.mark.parametrize(
    ("args", "kind", "needle"),
    [
        (["parity", "check", "--json", "--tp", "abc", "-"], "BadParameter", "'--tp'"),
        (["parity", "check", "--json"], "MissingParameter", "source"),
        (
            ["deploy", "h1", "--json", "--gate-timeout", "inf"],
            "BadParameter",
            "'--gate-timeout': 'inf': must be a finite",
        ),
        (["rollback", "h1", "--json", "--gate-timeout", "-1"], "BadParameter", "must be >= 0"),
        (["capture", "h1", "--json", "--ttl", "nan"], "BadParameter", "'--ttl': 'nan': must be a finite"),
        (["captures", "h1", "--json", "--keep-mb", "-5"], "BadParameter", "'--keep-mb'"),
        (["status", "--json", "--no-such-option"], "NoSuchOption", "--no-such-option"),
    ],
)
def test_usage_errors_under_json_are_one_json_object(
    args: list[str], kind: str, needle: str, inv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-i", str(inv), *args]) == 2
    out, err = capsys.readouterr()
    doc = json.loads(out)  # stdout is exactly one JSON document: no box, nothing else
    assert set(doc) == {"error", "exit_code", "kind"} and doc["exit_code"] == 2 and doc["kind"] == kind
    assert needle in doc["error"], doc
    assert err.startswith("error: ") and "\n" not in err.strip()


def test_usage_errors_without_json_keep_the_usage_box(inv: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-i", str(inv), "capture", "h1", "--ttl", "inf"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Usage: opsctl capture" in err and "must be a finite number" in err


def test_help_and_version_still_exit_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert main(["captures", "--help"]) == 0
    assert "--disarm" in capsys.readouterr().out


def test_finite_parser() -> None:
    assert common.finite_float("1e-3") == 1e-3
    assert common.finite(0)("0") == 0.0
    for bad in ("inf", "-inf", "nan", "1e999", "x"):
        with pytest.raises(typer.BadParameter):
            common.finite_float(bad)
    with pytest.raises(typer.BadParameter, match=">= 0"):
        common.finite(0)("-1")
