"""The one host-facts probe: its text, and its parser on real and hand-written output."""

from __future__ import annotations

import shlex
from pathlib import Path

from opsctl.hostdata.facts import Gpu, facts_command, parse_facts, parse_systemctl_show, unit_show_command
from tests.shell import HOSTILE, sh


def test_unit_show_asks_every_property_in_one_call() -> None:
    cmd = unit_show_command("sglang-k26-ddtree")
    assert shlex.split(cmd)[:3] == ["systemctl", "show", "-p"]
    assert "LoadState" in cmd and "InvocationID" in cmd and "DropInPaths" in cmd and "MainPID" in cmd
    assert cmd.endswith(" sglang-k26-ddtree.service")
    assert shlex.split(unit_show_command("a b;c"))[-1] == "a b;c.service"


def test_facts_command_quotes_the_root_and_unit() -> None:
    cmd = facts_command(HOSTILE, "u n;it")
    assert f"P={shlex.quote(HOSTILE)};" in cmd
    assert shlex.quote("u n;it.service") in cmd


def test_facts_command_runs_and_parses(tmp_path: Path) -> None:
    root = tmp_path / "missing" / "deeper"  # not there yet: the disk is the nearest existing directory's
    out = sh(facts_command(str(root), "opsctl-test-no-such-unit")).stdout
    facts = parse_facts(out)
    assert facts.disk_path == str(tmp_path)
    assert facts.disk_avail_kb is not None and facts.disk_total_kb is not None
    assert 0 < facts.disk_avail_kb <= facts.disk_total_kb
    assert facts.disk_free_mb == facts.disk_avail_kb // 1024
    assert facts.kernel  # uname -r


def test_parse_facts_gpus_and_unit() -> None:
    out = "\n".join(
        [
            "unit.LoadState=loaded",
            "unit.ActiveState=active",
            "unit.NRestarts=3",
            "gpu_rc=0",
            "gpu=NVIDIA H200, 9.0",
            "gpu=NVIDIA H200, 9.0",
            "gpu=Odd, Name, With Commas, 12.0",
            "gpu=",
            "disk_avail_kb=2048",
            "disk_total_kb=4096",
            "hostname=ct200",
            "not a fact line",
        ]
    )
    facts = parse_facts(out)
    assert facts.unit == {"LoadState": "loaded", "ActiveState": "active", "NRestarts": "3"}
    assert facts.gpus == (Gpu("NVIDIA H200", "9.0"), Gpu("NVIDIA H200", "9.0"), Gpu("Odd, Name, With Commas", "12.0"))
    assert facts.compute_caps == ("12.0", "9.0")
    assert facts.gpu_error is None and facts.disk_free_mb == 2 and facts.disk_total_mb == 4
    assert facts.hostname == "ct200"


def test_parse_facts_nvidia_smi_missing_or_failing() -> None:
    missing = parse_facts("gpu_rc=127\ngpu=nvidia-smi: not found\n")
    assert missing.gpus == () and missing.gpu_error == "nvidia-smi failed (rc 127): nvidia-smi: not found"
    failing = parse_facts("gpu_rc=9\ngpu=NVIDIA-SMI has failed because it couldn't communicate with the driver\n")
    assert failing.gpus == () and failing.gpu_error and "rc 9" in failing.gpu_error and "driver" in failing.gpu_error
    timed_out = parse_facts("gpu_rc=124\ngpu=\n")
    assert timed_out.gpu_error == "nvidia-smi failed (rc 124): nvidia-smi: timed out"
    assert parse_facts("").gpu_error is None and parse_facts("").disk_free_mb is None


def test_probe_without_nvidia_smi_on_path_says_not_found(tmp_path: Path) -> None:
    # sh's builtins only: no nvidia-smi, no df; the probe still ends, and says what is missing.
    out = sh(facts_command(str(tmp_path), "u"), env={"PATH": "/nonexistent"}).stdout
    facts = parse_facts(out)
    assert facts.gpu_error == "nvidia-smi failed (rc 127): nvidia-smi: not found" and facts.disk_avail_kb is None


def test_parse_systemctl_show() -> None:
    assert parse_systemctl_show("A=1\nExecStart={ path=/x ; argv[]=/x a=b }\njunk\n") == {
        "A": "1",
        "ExecStart": "{ path=/x ; argv[]=/x a=b }",
    }
