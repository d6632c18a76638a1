"""Issue 47 items 3 and 5, their pure parts (the testbed cases: test_failclosed4_upload_testbed.py).

The key file's check on the host as a shell runs it, the inventory line a refusal names, the checksum failures
verify reads, and rsync comparing content."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from opsctl.host.releaseroot import parse_checksum_failures, verify_checksums_command
from opsctl.hostdata.facts import environment_file_command, environment_file_problem
from opsctl.inventory import parse
from tests.shell import HOSTILE, sh


def test_environment_file_check_in_a_shell(tmp_path: Path) -> None:
    env = tmp_path / "key.env"
    env.write_text("SGLANG_API_KEY=k\n")
    link = tmp_path / "dangling.env"
    link.symlink_to(tmp_path / "nowhere.env")
    hostile = tmp_path / HOSTILE.strip("/").replace("/", "_")
    hostile.write_text("X=1\n")

    def problem(path: Path) -> str | None:
        return environment_file_problem(sh(environment_file_command(str(path))).stdout)

    assert problem(env) is None and problem(hostile) is None  # quoted: one word, whatever it holds
    assert problem(tmp_path / "typo.env") == "does not exist"
    assert problem(link) == "does not exist"  # systemd follows the link as test -e does
    assert problem(tmp_path) == "is not a regular file"
    if os.geteuid() != 0:  # root reads a 0000 file; systemd (root) does too
        env.chmod(0)
        assert problem(env) == "is not readable"


def test_no_answer_is_a_problem_not_a_pass() -> None:
    assert environment_file_problem("env_file=ok\n") is None
    assert environment_file_problem("") is not None and "could not be checked" in environment_file_problem("")  # type: ignore[operator]
    assert environment_file_problem("env_file=maybe\n") is not None


INVENTORY = """\
defaults:
  service:
    environment_file: /etc/kdtree-engine/sglang.env
hosts:
  a:
    address: 10.0.0.1
  b:
    address: 10.0.0.2
    service:
      environment_file: /etc/kdtree-engine/typo.env
      environment_file_optional: true
"""


def test_where_names_the_file_line_and_field() -> None:
    inv = parse(INVENTORY, "inv.yaml")
    a, b = inv.hosts["a"], inv.hosts["b"]
    assert a.where("service", "environment_file") == "inv.yaml:3: defaults.service.environment_file"
    assert b.where("service", "environment_file") == "inv.yaml:10: hosts.b.service.environment_file"
    assert not a.service.environment_file_optional and b.service.environment_file_optional
    # A copy (tests, --accept-new-host-key) still knows; a host built in code names the field only.
    assert a.model_copy(update={"port": 2222}).where("service", "environment_file").startswith("inv.yaml:3: ")
    assert "inv.yaml" not in a.model_dump_json()  # where it came from is not a setting


@pytest.mark.parametrize("value", ['"true"', "1", "'yes'"])  # quoted: YAML's own yes is a boolean
def test_optional_is_a_boolean_only(value: str) -> None:
    from opsctl.errors import InventoryError

    text = INVENTORY.replace("environment_file_optional: true", f"environment_file_optional: {value}")
    with pytest.raises(InventoryError, match=r"inv.yaml:11: hosts.b.service.environment_file_optional"):
        parse(text, "inv.yaml")


def test_checksum_failures_as_sha256sum_prints_them(tmp_path: Path) -> None:
    """The real sha256sum's output: a changed file, a missing one, and a name that needs escaping."""
    names = ["same.txt", "changed.txt", "gone.txt", "back\\slash.txt"]
    for n in names:
        (tmp_path / n).write_text(n)
    checklist = "".join(f"{hashlib.sha256(n.encode()).hexdigest()}  {n}\n" for n in names)
    (tmp_path / "changed.txt").write_text("changed.tx!")  # same size
    (tmp_path / "gone.txt").unlink()
    (tmp_path / "back\\slash.txt").write_text("other")
    escaped = checklist.replace("  back\\slash.txt", "  back\\\\slash.txt").replace(
        hashlib.sha256(b"back\\slash.txt").hexdigest(), "\\" + hashlib.sha256(b"back\\slash.txt").hexdigest()
    )
    res = sh(verify_checksums_command(str(tmp_path)), stdin=escaped)
    assert res.returncode == 1
    assert parse_checksum_failures(res.stdout) == ["changed.txt", "gone.txt", "back\\slash.txt"]
    assert parse_checksum_failures("") == []
