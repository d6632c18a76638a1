"""run_device.sh builds for the GPU it finds and puts its results in that GPU's folder (kernel/bench/gpu_tag.py:
results/<tag>/), and the sm_120 projection starts only from an H200 run (kernel/bench/project_sm120.py). CPU only:
nvidia-smi's line is the input."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "kernel" / "bench"
COMMITTED = BENCH / "results" / "h200"  # the H200's committed results, as run_device.sh writes them


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench scripts import their neighbours by name (gpu_tag, mma_probe), as they do run from kernel/bench."""
    monkeypatch.syspath_prepend(str(BENCH))


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"kdtree_bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("NVIDIA H200, 9.0", ("9.0", "h200")),
        ("NVIDIA H100 80GB HBM3, 9.0\n", ("9.0", "h100")),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0", ("12.0", "rtxpro6000")),
        ("NVIDIA GeForce RTX 4090, 8.9", ("8.9", "sm89")),
        ("NVIDIA B200, 10.0", ("10.0", "sm100")),
    ],
)
def test_arch_and_tag_from_the_smi_line(line: str, expected: tuple[str, str]) -> None:
    assert load("gpu_tag").arch_and_tag(line) == expected


@pytest.mark.parametrize("line", ["", "NVIDIA H200", "NVIDIA H200, 9", ", 9.0", "NVIDIA H200, [N/A]"])
def test_a_line_without_name_and_capability_is_refused(line: str) -> None:
    with pytest.raises(ValueError, match=r"NAME, MAJOR\.MINOR"):
        load("gpu_tag").arch_and_tag(line)


def test_the_script_prints_what_run_device_reads() -> None:
    script = str(BENCH / "gpu_tag.py")
    done = subprocess.run([sys.executable, script, "NVIDIA H200, 9.0"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, "9.0 h200\n")
    bad = subprocess.run([sys.executable, script, "no gpu"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert "'no gpu'" in bad.stderr


def test_the_projection_refuses_a_run_that_is_not_an_h200s(tmp_path: Path) -> None:
    project = load("project_sm120")
    committed = json.loads((COMMITTED / "results.json").read_text())
    assert project.project_all(committed)  # the committed run predates the field: an H200 run
    measured = {**committed, "device": "NVIDIA RTX PRO 6000 Blackwell", "compute_capability": "12.0"}
    with pytest.raises(ValueError, match=r"compute capability 12\.0.*not an H200"):
        project.project_all(measured)
    path = tmp_path / "results" / "rtxpro6000" / "results.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(measured))
    assert project.main(["--results", str(path), "--out", str(tmp_path / "p.json")]) == 2
    assert not (tmp_path / "p.json").exists()


def test_the_benchmark_table_projects_only_an_h200_run(tmp_path: Path) -> None:
    bench = load("bench_verify")
    committed = json.loads((COMMITTED / "results.json").read_text())
    extras = json.loads((COMMITTED / "results.extra.json").read_text())["cases"]
    h200, sm120 = tmp_path / "h200.md", tmp_path / "sm120.md"
    bench.write_markdown(h200, committed, extras, 0.0)
    measured = {**committed, "device": "NVIDIA RTX PRO 6000 Blackwell", "compute_capability": "12.0"}
    bench.write_markdown(sm120, measured, extras, 0.0)
    assert "sm_120 floor us" in h200.read_text()
    assert "sm_120 floor us" not in sm120.read_text()
    assert "(compute capability 12.0): no sm_120 projection from this run" in sm120.read_text()


def test_results_and_patches_live_where_run_device_puts_them() -> None:
    gpu_tag = load("gpu_tag")
    assert gpu_tag.results_dir() == COMMITTED
    assert gpu_tag.results_dir("rtxpro6000") == BENCH / "results" / "rtxpro6000"
    assert sorted(p.name for p in gpu_tag.PATCHES.glob("*.diff")) == ["phases-kernel.diff", "trace-kernel.diff"]
    script = (BENCH / "run_device.sh").read_text()
    assert 'RESULTS="kernel/bench/results/$TAG"' in script and "PATCHES=kernel/bench/patches" in script


@pytest.mark.skipif(shutil.which("git") is None, reason="git not found on PATH")
def test_kernel_bench_commits_scripts_results_and_patches_only() -> None:
    """A run's logs and profiles stay out of git (kernel/bench/.gitignore); a result's JSON and markdown are kept."""
    listed = subprocess.run(["git", "ls-files", "--", "."], cwd=BENCH, capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"not a git checkout: {listed.stderr.strip()}")
    misplaced = [
        name
        for name in listed.stdout.splitlines()
        if not (
            ("/" not in name and name.endswith((".py", ".sh", ".cu", ".md", ".gitignore")))
            or (name.startswith("patches/") and name.endswith(".diff"))
            or (name.startswith("results/") and name.count("/") == 2 and name.endswith((".json", ".md")))
        )
    ]
    assert misplaced == []
