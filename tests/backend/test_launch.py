"""The launcher: argument composition, preflight decisions, the release's plugin metadata, failing fast."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from importlib import metadata

import pytest
from kdtree_backend.launch import (
    EXIT_EXTENSION,
    EXIT_PLUGIN,
    EXIT_SGLANG,
    PreflightError,
    check_plugin_discoverable,
    check_sglang_version,
    preflight,
    server_argv,
)

from tests.backend.helpers import PYTHON, REPO, replay_env


def test_adds_kdtree_and_triton_draft_backends() -> None:
    assert server_argv(["--model-path", "m"], "kdtree") == [
        "--model-path", "m", "--attention-backend", "kdtree", "--speculative-draft-attention-backend", "triton",
    ]  # fmt: skip


def test_prefill_mode_splits_prefill_and_decode() -> None:
    argv = server_argv([], "prefill")
    assert argv[:4] == ["--prefill-attention-backend", "kdtree", "--decode-attention-backend", "triton"]


def test_keeps_the_callers_choices() -> None:
    args = ["--prefill-attention-backend", "kdtree", "--decode-attention-backend", "triton",
            "--speculative-draft-attention-backend=triton"]  # fmt: skip
    assert server_argv(args, "kdtree") == args


@pytest.mark.parametrize(("version", "ok"), [("0.5.23", True), ("0.5.22", False), (None, False)])
def test_sglang_version_gate(version: str | None, ok: bool) -> None:
    if ok:
        check_sglang_version(version)
        return
    with pytest.raises(PreflightError) as info:
        check_sglang_version(version)
    assert info.value.code == EXIT_SGLANG and "0.5.23" in str(info.value)


def test_plugin_gate() -> None:
    good = metadata.EntryPoint("kdtree", "kdtree_backend.plugin:register", "sglang.srt.plugins")
    other = metadata.EntryPoint("other", "x:y", "sglang.srt.plugins")
    check_plugin_discoverable([other, good])
    with pytest.raises(PreflightError) as info:
        check_plugin_discoverable([other])
    assert info.value.code == EXIT_PLUGIN and "PYTHONPATH" in str(info.value)


def test_preflight_order_stops_at_the_first_failure() -> None:
    calls: list[str] = []

    def extension() -> None:
        calls.append("extension")

    with pytest.raises(PreflightError):
        preflight(sglang_version=lambda: "0.5.1", plugin_entry_points=list, extension=extension)
    assert calls == []


def test_release_backend_dir_makes_the_plugin_discoverable() -> None:
    code = (
        "import json; from importlib.metadata import entry_points; "
        "print(json.dumps([[e.name, e.value, e.dist.name] for e in entry_points(group='sglang.srt.plugins')]))"
    )
    res = subprocess.run([PYTHON, "-c", code], cwd="/", env=replay_env(REPO), capture_output=True, text=True)
    found = json.loads(res.stdout)
    assert ["kdtree", "kdtree_backend.plugin:register", "kdtree-backend-plugin"] in found


def test_launcher_fails_fast_with_one_message_without_gpu() -> None:
    if importlib.util.find_spec("torch") is None:  # pragma: no cover
        pytest.skip("torch missing")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this host has a GPU; the failing preflight is checked on CPU machines")
    res = subprocess.run(
        [PYTHON, "-m", "kdtree_backend.launch", "--kdtree-dry-run", "--model-path", "m"],
        cwd=REPO, env=replay_env(REPO), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode in (EXIT_SGLANG, EXIT_EXTENSION)
    message = [line for line in res.stderr.splitlines() if line.startswith("kdtree-launch: ")]
    assert len(message) == 1, res.stderr
    assert "exec" not in res.stdout
