"""run_device.sh builds for the GPU it finds and tags its result files by it (kernel/bench/gpu_tag.py), and the sm_120
projection starts only from an H200 run (kernel/bench/project_sm120.py). CPU only: nvidia-smi's line is the input."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "kernel" / "bench"


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
    committed = json.loads((BENCH / "results-h200.json").read_text())
    assert project.project_all(committed)  # the committed run predates the field: an H200 run
    measured = {**committed, "device": "NVIDIA RTX PRO 6000 Blackwell", "compute_capability": "12.0"}
    with pytest.raises(ValueError, match=r"compute capability 12\.0.*not an H200"):
        project.project_all(measured)
    path = tmp_path / "results-rtxpro6000.json"
    path.write_text(json.dumps(measured))
    assert project.main(["--results", str(path), "--out", str(tmp_path / "p.json")]) == 2
    assert not (tmp_path / "p.json").exists()


def test_the_benchmark_table_projects_only_an_h200_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # bench_verify imports its neighbours by name
    bench = load("bench_verify")
    committed = json.loads((BENCH / "results-h200.json").read_text())
    extras = json.loads((BENCH / "results-h200.extra.json").read_text())["cases"]
    h200, sm120 = tmp_path / "h200.md", tmp_path / "sm120.md"
    bench.write_markdown(h200, committed, extras, 0.0)
    measured = {**committed, "device": "NVIDIA RTX PRO 6000 Blackwell", "compute_capability": "12.0"}
    bench.write_markdown(sm120, measured, extras, 0.0)
    assert "sm_120 floor us" in h200.read_text()
    assert "sm_120 floor us" not in sm120.read_text()
    assert "(compute capability 12.0): no sm_120 projection from this run" in sm120.read_text()
