import shutil
import subprocess
from pathlib import Path

import pytest

from opsctl.inventory import HostConfig, parse
from opsctl.unit.unitfile import exec_argv, render, render_from_tree, systemd_word
from tests import builders

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = (REPO / "systemd" / "sglang-k26-ddtree.service").read_text()
LOCAL_PYTHON = "/usr/bin/python3"


def gpu_host(**service: object) -> HostConfig:
    svc = {"python": LOCAL_PYTHON, "environment_file": "/etc/kdtree-engine/sglang.env", **service}
    return builders.host("gpu1", address="10.0.0.1", gpu_arch="12.0", root="/srv/kdtree-engine", service=svc)


def replay_host() -> HostConfig:
    svc = {"mode": "replay", "python": LOCAL_PYTHON, "replay_args": ["--interval", "0.5"]}
    return builders.host("tb1", gpu_arch=None, root="/srv/kdtree-engine", service=svc)


def standin_host(*args: str) -> HostConfig:
    svc = {"mode": "standin", "python": LOCAL_PYTHON, "port": 30007, "tp": 2, "standin_args": list(args)}
    return builders.host("tb2", gpu_arch=None, root="/srv/kdtree-engine", service=svc)


def test_gpu_unit_contents() -> None:
    text = render(TEMPLATE, gpu_host(speculative_num_draft_tokens=9, tp=8, start_timeout_s=1500))
    assert "@@" not in text
    assert "ExecStart=/usr/bin/python3 -m kdtree_backend.launch --model-path /models/Kimi-K2.6 --tp-size 8" in text
    assert "--attention-backend kdtree" in text and "--speculative-algorithm DDTREE" in text
    assert "--speculative-num-draft-tokens 9" in text
    assert "WorkingDirectory=/srv/kdtree-engine/current\n" in text
    assert "Environment=PYTHONPATH=/srv/kdtree-engine/current/kernel:/srv/kdtree-engine/current/backend\n" in text
    assert "Environment=PYTHONUNBUFFERED=1\n" in text
    assert "Environment=KDTREE_CONFIG=/srv/kdtree-engine/current/deploy/kdtree.json\n" in text
    # Without systemd's '-': a missing key file fails the start rather than serving with no key (issue 47).
    assert "EnvironmentFile=/etc/kdtree-engine/sglang.env\n" in text
    assert "LogRateLimitIntervalSec=0\n" in text and "TimeoutStartSec=1500\n" in text
    assert "Restart=on-failure\n" in text and "DeviceAllow=char-nvidia-frontend rw" in text


def test_prefill_only_attention() -> None:
    argv = exec_argv(gpu_host(attention="prefill-kdtree"))
    assert "--prefill-attention-backend" in argv and "--decode-attention-backend" in argv
    assert "--attention-backend" not in argv


def test_replay_unit() -> None:
    text = render(TEMPLATE, replay_host())
    assert "-m kdtree_backend.replay --steps 0 --interval 0.5 --tp-size 8" in text
    # Each restart's parity token reaches the unit through a root-only EnvironmentFile.
    assert "EnvironmentFile=-/srv/kdtree-engine/state/parity.env" in text
    assert "DeviceAllow" not in text and "EnvironmentFile=-/etc" not in text


def test_standin_unit() -> None:
    text = render(TEMPLATE, standin_host("--load-delay", "3"))
    assert "\nExecStart=/usr/bin/python3 -m kdtree_backend.serve --port 30007 --tp-size 2 --load-delay 3\n" in text
    assert "(CPU stand-in for SGLang (testbed), release from /srv/kdtree-engine/current)" in text
    assert "EnvironmentFile=-/srv/kdtree-engine/state/parity.env" in text
    assert "DeviceAllow" not in text and "# no GPU on this host (standin mode)" in text
    assert "RestartSec=1\n" in text
    assert exec_argv(standin_host()) == [
        LOCAL_PYTHON,
        "-m",
        "kdtree_backend.serve",
        "--port",
        "30007",
        "--tp-size",
        "2",
    ]


def test_standin_mode_from_inventory_yaml() -> None:
    text = """
hosts:
  tb1:
    address: 127.0.0.1
    gpu_arch: null
    service: {mode: standin, port: 30001, tp: 2, standin_args: ["--load-delay", "3"]}
"""
    host = parse(text, Path("inventory.yaml")).host("tb1")
    assert exec_argv(host)[2:] == ["kdtree_backend.serve", "--port", "30001", "--tp-size", "2", "--load-delay", "3"]


def test_render_is_deterministic_and_host_specific() -> None:
    a, b = render(TEMPLATE, replay_host()), render(TEMPLATE, replay_host())
    assert a == b
    assert render(TEMPLATE, gpu_host()) != a


def test_unknown_placeholder_fails() -> None:
    with pytest.raises(KeyError):
        render(TEMPLATE + "\n# @@NOPE@@\n", replay_host())


def test_systemd_word() -> None:
    assert systemd_word("plain") == "plain"
    assert systemd_word("50%") == "50%%"
    assert systemd_word("a b") == '"a b"'
    assert systemd_word("$HOME") == "$$HOME"


def test_repo_inventory_renders() -> None:
    inv = parse((REPO / "inventory.yaml").read_text(), REPO / "inventory.yaml")
    text = render_from_tree(REPO, inv.host("ct200"))
    assert "--tp-size 8" in text


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize(
    "host", [gpu_host(), replay_host(), standin_host("--load-delay", "3")], ids=["gpu", "replay", "standin"]
)
def test_systemd_analyze_verify(tmp_path: Path, host: HostConfig) -> None:
    unit = tmp_path / "sglang-k26-ddtree.service"
    unit.write_text(render(TEMPLATE, host))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    # verify prints warnings without failing; the unit's own lines must be clean.
    assert "sglang-k26-ddtree.service:" not in res.stderr, res.stderr


def percent_host() -> HostConfig:
    svc = {"mode": "replay", "python": LOCAL_PYTHON, "environment_file": "/etc/kd%i/sglang%.env"}
    return builders.host("tb1", gpu_arch=None, root="/srv/kd%n", service=svc)


def test_percent_in_inventory_values_is_escaped_for_systemd() -> None:
    """systemd expands %n, %i ... in WorkingDirectory=, Environment=, EnvironmentFile=: unescaped, its paths
    differed from the ones opsctl writes (and the token file it checks for)."""
    text = render(TEMPLATE, percent_host())
    assert "WorkingDirectory=/srv/kd%%n/current\n" in text
    assert "EnvironmentFile=-/srv/kd%%n/state/parity.env\n" in text
    assert "EnvironmentFile=/etc/kd%%i/sglang%%.env\n" in text
    assert "Environment=PYTHONPATH=/srv/kd%%n/current/kernel:/srv/kd%%n/current/backend\n" in text
    settings = [line for line in text.splitlines() if "=" in line and not line.startswith("#")]
    # No single '%' is left in any setting: each one is doubled (ExecStart's words are escaped by systemd_word).
    assert all("%" not in line.replace("%%", "") for line in settings), settings


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_escaped_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    unit = tmp_path / "sglang-k26-ddtree.service"
    unit.write_text(render(TEMPLATE, percent_host()))
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert "sglang-k26-ddtree.service:" not in res.stderr, res.stderr


def test_an_optional_environment_file_is_read_with_systemds_dash() -> None:
    """Only ``service.environment_file_optional: true`` lets systemd ignore a missing file (issue 47)."""
    strict = render(TEMPLATE, gpu_host())
    optional = render(TEMPLATE, gpu_host(environment_file_optional=True))
    assert "EnvironmentFile=/etc/kdtree-engine/sglang.env\n" in strict and "-/etc/kdtree" not in strict
    assert "EnvironmentFile=-/etc/kdtree-engine/sglang.env\n" in optional
    # Strict: a quoted "true" or a 1 is not the boolean (an accidental optional would turn the key off again).
    with pytest.raises(ValueError, match="environment_file_optional"):
        gpu_host(environment_file_optional="true")
