"""Finding the prebuilt module and failing clearly without it; the build script's exit codes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kdtree_kernel
import pytest
import torch
from kdtree_kernel import extension

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "deploy" / "build_extension.py"


def test_candidate_dirs_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(extension.ENV_DIR, str(tmp_path / "env"))
    dirs = extension.candidate_dirs(tmp_path / "given")
    assert dirs == [tmp_path / "given", tmp_path / "env", extension.DEFAULT_BUILD_DIR]


def test_find_module_file_takes_first_dir_with_a_module(tmp_path: Path) -> None:
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    (second / f"{extension.EXT_NAME}.cpython-312-x86_64-linux-gnu.so").write_bytes(b"")
    (first / "unrelated.so").write_bytes(b"")
    assert extension.find_module_file([tmp_path / "missing", first, second]) == second / (
        f"{extension.EXT_NAME}.cpython-312-x86_64-linux-gnu.so"
    )
    assert extension.find_module_file([first]) is None


def test_missing_extension_raises_actionable_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extension, "_loaded", None)
    monkeypatch.setattr(extension, "DEFAULT_BUILD_DIR", tmp_path / "none")
    monkeypatch.delenv(extension.ENV_DIR, raising=False)
    with pytest.raises(extension.ExtensionNotBuilt, match=r"build_extension\.py"):
        extension.load_extension(tmp_path)
    assert extension.extension_available(tmp_path) is False


def test_verify_attention_without_extension_fails_clearly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extension, "_loaded", None)
    monkeypatch.setattr(extension, "DEFAULT_BUILD_DIR", tmp_path / "none")
    monkeypatch.delenv(extension.ENV_DIR, raising=False)
    q = torch.zeros(9, 8, 576, dtype=torch.bfloat16)
    with pytest.raises(extension.ExtensionNotBuilt):
        kdtree_kernel.verify_attention(q, q, q, q, q, q, 0.1, q_len=9, max_prefix_len=0)


def _run_build(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BUILD_SCRIPT), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_build_script_rejects_bad_arch(tmp_path: Path) -> None:
    proc = _run_build("--arch", "sm90", "--out", str(tmp_path))
    assert proc.returncode == 2
    assert "--arch" in proc.stderr


@pytest.mark.slow  # imports torch.utils.cpp_extension in a fresh interpreter
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit path")
def test_build_script_without_cuda_exits_3(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_extension", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if module.cuda_toolchain_problem() is None:
        pytest.skip("this torch has CUDA libraries and nvcc: the no-CUDA path is not reachable here")
    for arch in ("12.0", "0.0", "auto"):  # opsctl passes 0.0 for hosts without a declared GPU
        proc = _run_build("--arch", arch, "--out", str(tmp_path / "out"))
        assert proc.returncode == 3, proc.stderr
        assert "reference path" in proc.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").glob("*.so"))


def test_arch_flags_embed_sass_and_ptx() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_extension", BUILD_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.arch_flags("12.0") == [
        "-gencode=arch=compute_120,code=sm_120",
        "-gencode=arch=compute_120,code=compute_120",
    ]
