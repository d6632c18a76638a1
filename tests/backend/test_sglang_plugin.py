"""The plugin against the real SGLang 0.5.23 installed here (CPU): loading through SGLang's own plugin loader,
``kdtree`` as a valid backend choice, upstream signatures, upstream's forward_extend around our hooks, and SGLang's
own MLA target-verify test kit run with backend kdtree (its metadata and invariants, our marshaling, the kernel's
torch reference; tests/backend/sglang_kit.py).

The checks run in one subprocess (tests/backend/sglang_probe.py): importing SGLang has process-wide effects.
Install for these tests (CI does):
    pip install --no-deps sglang==0.5.23 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 gguf openai==2.8.0
    pip install -e '.[dev,backend-cpu]'
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.backend import sglang_kit as kit
from tests.backend.helpers import PYTHON, REPO, buggy_release

PROBE = Path(__file__).resolve().parent / "sglang_probe.py"
INSTALL_HINT = (
    "sglang is not installed: pip install --no-deps sglang==0.5.23 apache-tvm-ffi==0.1.11 "
    "compressed-tensors==0.18.0 gguf openai==2.8.0 && pip install -e '.[dev,backend-cpu]'"
)
# slow: the probe imports the real SGLang in a fresh interpreter (~15 s).
pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason=INSTALL_HINT)]


@pytest.fixture(scope="module")
def probe() -> dict[str, Any]:
    res = subprocess.run([PYTHON, str(PROBE)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"SGLang probe failed (a missing light dependency?):\n{res.stderr[-4000:]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_supported_sglang_version(probe: dict[str, Any]) -> None:
    assert probe["sglang_version"] == "0.5.23"


def test_kdtree_is_not_a_choice_before_the_plugin_loads(probe: dict[str, Any]) -> None:
    assert (
        str(probe["before_plugins"]).startswith("rejected: ") and "invalid choice: 'kdtree'" in probe["before_plugins"]
    )


def test_sglang_plugin_loader_registers_kdtree(probe: dict[str, Any]) -> None:
    assert probe["choice_count"] == 1  # appended once, even when register() runs again
    assert probe["registry_factory"] is True
    assert probe["args_kdtree"]["attention_backend"] == "kdtree"
    assert probe["args_kdtree"]["speculative_draft_attention_backend"] == "triton"
    assert probe["args_split"]["prefill_attention_backend"] == "kdtree"
    assert probe["args_split"]["decode_attention_backend"] == "triton"


def test_backend_subclasses_triton_and_overrides_match_upstream_signatures(probe: dict[str, Any]) -> None:
    assert probe["subclass"] is True
    assert probe["overrides"] == sorted(
        [
            "__init__",
            "_forward_extend_kernel",
            "forward_extend",
            "init_cuda_graph_state",
            "init_forward_metadata",
            "init_forward_metadata_out_graph",
        ]
    )
    assert probe["signature_mismatches"] == []


def test_verify_through_upstream_forward_extend(probe: dict[str, Any]) -> None:
    forward = probe["forward"]
    assert forward["drafts_saved"] is True and forward["kv_writes"] == 4  # upstream saved the drafts' K/V first
    assert all(rel < 1e-2 for rel in forward["rel_by_layer"].values())
    lines = forward["lines"]
    assert sum(line.startswith("[kdtree] shapes ") for line in lines) == 1
    parity = [line for line in lines if re.match(r"^\[kdtree\] L1 max_abs_diff=\S+ mean=\S+ rel=(\S+) ", line)]
    assert len(parity) == 1 and float(parity[0].split("rel=")[1].split()[0]) < 1e-2
    assert lines.count("[kdtree] fallback reason=logit_cap path=triton") == 1
    assert forward["capped_rel"] < 1e-2


@pytest.fixture(scope="module")
def kit_cpu(tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Any]:
    return _run_kit_on_cpu(tmp_path_factory.mktemp("kit"), list(kit.CPU_CASES))


@pytest.fixture(scope="module")
def kit_cpu_bug(tmp_path_factory: pytest.TempPathFactory) -> dict[Any, Any]:
    tmp = tmp_path_factory.mktemp("kit-bug")
    root = buggy_release("drafts", tmp)
    results = _run_kit_on_cpu(tmp, list(kit.CPU_BUG_CASES), backend_root=root)
    assert results["header"]["kdtree_backend"] == str(root / "backend" / "kdtree_backend")  # the buggy copy ran
    return results


def _run_kit_on_cpu(tmp: Path, cases: list[str], backend_root: Path | None = None) -> dict[Any, Any]:
    if importlib.util.find_spec("triton") is None:
        pytest.fail("triton is missing (the backend-cpu extra): the kit's metadata kernels run in its interpreter")
    out = tmp / "kit.jsonl"
    cmd = kit.driver_command(PYTHON, device="cpu", cases=cases, backends="kdtree", out=out)
    env = kit.driver_env(dict(os.environ), device="cpu", backend_root=backend_root)
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, f"the kit driver failed:\n{res.stderr[-4000:]}"
    return kit.read_results(out)


@pytest.mark.parametrize("name", kit.CPU_CASES)
def test_mla_target_verify_kit_passes_through_our_marshaling_on_cpu(kit_cpu: dict[Any, Any], name: str) -> None:
    """SGLang's own MLA verify kit (tests/backend/sglang_kit.py) with backend kdtree on CPU: SGLang's metadata
    (its Triton index kernels, in Triton's interpreter), the kit's k = v = None call served (no fallback),
    our marshaling, and the kernel's torch reference in the kernel's place; the kit's assert_close and, for the
    CUDA-graph runner, its metadata invariants after the padded replay init. The CUDA kernel itself, parity and
    the rest of the cases: tests/backend/test_sglang_kit_gpu.py on the GPU machine."""
    case = kit.CASES_BY_NAME[name]
    result = kit_cpu[(name, "kdtree")]
    assert result["kit"] == "pass", result.get("traceback") or result["kit"]
    assert [line for line in result["lines"] if "fallback" in line] == []
    calls = [{"bs": call["bs"], "key_lens": call["key_lens"]} for call in result["kernel_calls"]]
    assert calls == kit.expected_kernel_calls(case, replayed=True)
    assert set(result["stub_calls"]) <= set(kit.ANSWERS)
    assert set(kit_cpu["header"]["stubs_installed"]) <= set(kit.STUBS)


@pytest.mark.parametrize("name", kit.CPU_BUG_CASES)
def test_mla_target_verify_kit_catches_the_classic_bug_on_cpu(kit_cpu_bug: dict[Any, Any], name: str) -> None:
    """The seeds' bug (drafts left out of the keys: marshal.py's tagged line made ``pass``, as ``opsctl testbed
    variant seed-bug`` does) fails SGLang's own kit, not only our harness."""
    result = kit_cpu_bug[(name, "kdtree")]
    assert result["kit"].startswith("fail: Tensor-likes are not close"), result.get("traceback") or result["kit"]
    assert result["kernel_calls"][0]["key_lens"] == list(kit.CASES_BY_NAME[name].prefix_lens)  # no drafts
