"""The plugin against the real SGLang 0.5.23 installed here (CPU): loading through SGLang's own plugin loader,
``kdtree`` as a valid backend choice, upstream signatures, and upstream's forward_extend around our hooks.

The checks run in one subprocess (tests/backend/sglang_probe.py): importing SGLang has process-wide effects.
Install for these tests (CI does):
    pip install --no-deps sglang==0.5.23 apache-tvm-ffi==0.1.11 compressed-tensors==0.18.0 gguf openai==2.8.0
    pip install -e '.[dev,backend-cpu]'
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.backend.helpers import PYTHON, REPO

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


def test_mla_target_verify_kit_needs_cuda() -> None:
    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    assert spec is not None and spec.submodule_search_locations
    kit = Path(next(iter(spec.submodule_search_locations))) / "test/kits/attention_unittest/attention_methods"
    source = (kit / "mla_attention.py").read_text()
    assert re.search(r'^DEFAULT_DEVICE = "cuda"', source, re.M), "the kit grew a CPU default: run it here"
    pytest.skip(
        "SGLang's MLA target-verify kit (run_mla_eagle_verify_case) builds TritonAttnBackend on a CUDA "
        "MockMLAModelRunner and runs SGLang's Triton prefix kernels: it needs CUDA and the full SGLang runtime"
    )
