"""GPU: SGLang 0.5.23's own MLA target-verify test kit runs with backend ``kdtree``, eager and through its CUDA-graph
runner, and the kernel serves every call (no fallback). The seeds' bug, fed through the kit, fails it.

Run on the GPU machine (the device tool; wheels under the git-ignored ``.whl/``, carried):

    bash kernel/bench/run_device.sh build sglang-kit

which unpacks ``.whl/*.whl`` (the sglang 0.5.23 wheel and the light packages the kit imports: see
kernel/bench/README.md) into /tmp/site, builds the extension, and runs this module (``pytest -m gpu``).

The kit runs in a subprocess (tests/backend/sglang_kit.py: SGLang's import has process-wide effects, and it
needs stubs). Cases (``sglang_kit.CASES``):
  * SGLang's own MLA verify cases (its Triton MLA suite's EAGLE_VERIFY_CASES and EAGLE_VERIFY_CUDA_GRAPH_CASES:
    chain and 3-token topk-2 tree, eagle / frozen_kv_mtp / dflash / ngram, 4 heads, prefixes (4, 7)) at page size
    1 with kv_lora_rank 512 + rope 64, bf16: eager; graph as shipped; graph with a consistent fixture layout;
  * ours, production-shaped, built with the kit's MLAAttentionCase: 8 heads, q_len 9 (8 drafts + 1), topk-4 trees
    through our tree-mask builder (``sglang_kit.our_tree_mask``, put where the kit's ``_draft_tree_mask`` stands),
    prefixes 0 to 3500 ragged over batches of 1 to 8, graph cases with a padded replay (capture batch > batch).
Each case is run with ``kdtree`` and with SGLang's ``triton``, and asserts:
  1. the kit's ``assert_close`` passes. Exception, and only for SGLang's graph cases run as shipped: its graph
     runner re-populates the prefix in another layout than its fixture's (``sglang_kit.CONSISTENT_LAYOUT`` says
     how), so the kit fails there for every backend; where Triton fails such a case too, kdtree's output is
     compared with Triton's instead (same inputs, rel <= the gate's pass_rel);
  2. the kernel ran: no ``[kdtree] fallback`` line, and the engine's kernel calls are exactly the expected ones
     (batch and per-request key counts = prefix + drafts, eager leg, capture and padded replay);
  3. every ``[kdtree]`` parity line of the case (kernel vs SGLang's Triton on the same call; eager, and
     ``mode=graph`` from the replay) passes the gate (rel <= pass_rel; ``opsctl.gate``'s own classify).
The seeds' bug (``opsctl testbed variant seed-bug``'s edit of marshal.py: drafts not appended to the keys) run
through the kit (``kit.BUG_CASES``, short prefixes as in the production symptom): the kit's ``assert_close``
fails and every parity line FAILs. At prefixes of thousands (``kit.BUG_LONG_CASES``) the kit's random weights
dilute the bug below its tolerance; there the parity lines must still never pass the gate.

Stubs: ``sglang_kit.STUBS`` (sgl_kernel and its submodules, IPython, fastapi, uvicorn), installed only where the
module is missing; each raises when called, except ``sgl_kernel.utils.is_arch_support_pdl`` (answered False: only
decode launches read it). The test asserts nothing else was called.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.backend import sglang_kit as kit
from tests.backend.helpers import PYTHON, REPO, buggy_release
from tests.gpu_helpers import NEEDS_CUDA, require_kernel

pytestmark = list(NEEDS_CUDA)
RESULTS_ENV = "KDTREE_KIT_RESULTS"  # a folder for the raw results (JSON lines): run_device.sh's $OUT
SGLANG_MISSING = (
    "sglang 0.5.23 is not importable: kernel/bench/run_device.sh unpacks the carried wheels (.whl/) into "
    "/tmp/site and puts it on PYTHONPATH"
)


def _gate() -> tuple[Any, Any, Any]:
    from opsctl.gate.lines import ParityLine, parse_line
    from opsctl.gate.verdicts import LineVerdict, classify
    from opsctl.inventory import GateSettings

    settings = GateSettings()

    def verdict(line: str) -> Any:
        parsed = parse_line(line)
        assert isinstance(parsed, ParityLine), f"not a parity line: {line}"
        return classify(parsed, settings)

    return verdict, LineVerdict, settings.pass_rel


def run_driver(tmp: Path, *, cases: list[str], backends: str, backend_root: Path | None = None) -> dict[str, Any]:
    """The kit in a subprocess; -> {"header": ..., (case, backend): result}."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip(SGLANG_MISSING)
    require_kernel()
    # Straight into run_device.sh's $OUT when it asks (written case by case: a run cut short still brings back
    # what it did), else a temporary folder.
    folder = Path(os.environ.get(RESULTS_ENV) or tmp)
    out = folder / ("sglang-kit-bug.jsonl" if backend_root else "sglang-kit.jsonl")
    cmd = kit.driver_command(PYTHON, device="cuda", cases=cases, backends=backends, out=out)
    env = kit.driver_env(dict(os.environ), device="cuda", backend_root=backend_root)
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    sys.stderr.write(res.stderr[-6000:])
    assert res.returncode == 0, f"the kit driver failed:\n{res.stderr[-4000:]}"
    return kit.read_results(out)


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_driver(tmp_path_factory.mktemp("kit"), cases=[case.name for case in kit.CASES], backends="kdtree,triton")


@pytest.fixture(scope="module")
def bug_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("kit-bug")
    root = buggy_release("drafts", tmp)
    found = run_driver(tmp, cases=[*kit.BUG_CASES, *kit.BUG_LONG_CASES], backends="kdtree", backend_root=root)
    assert found["header"]["kdtree_backend"] == str(root / "backend" / "kdtree_backend")  # the buggy copy ran
    return found


def parity_rels(result: dict[str, Any]) -> list[str]:
    return [line for line in result["lines"] if line.startswith("[kdtree] L")]


def test_stubs_are_listed_and_only_the_capability_query_is_called(results: dict[str, Any]) -> None:
    header = results["header"]
    print("stubs installed:", header["stubs_installed"], "torch", header["torch"], header["device_name"])
    assert set(header["stubs_installed"]) <= set(kit.STUBS)
    called = {call for key, r in results.items() if key != "header" for call in r["stub_calls"]}
    assert called <= set(kit.ANSWERS), f"stubs called on the verify path: {sorted(called - set(kit.ANSWERS))}"


@pytest.mark.parametrize("name", [case.name for case in kit.CASES])
def test_kit_case_served_by_the_kernel(results: dict[str, Any], name: str) -> None:
    case = kit.CASES_BY_NAME[name]
    ours, triton = results[(name, "kdtree")], results[(name, "triton")]
    verdict, line_verdict, pass_rel = _gate()
    print(f"{name}: kdtree {ours['kit'][:160]} | triton {triton['kit'][:160]} | {ours.get('kdtree_vs_this')}")
    assert "traceback" not in ours, ours.get("traceback")
    # 2. the kernel ran, and nothing fell back
    assert [line for line in ours["lines"] if line.startswith("[kdtree] fallback")] == []
    replayed = ours["kit"] == "pass"
    calls = [{"bs": c["bs"], "key_lens": c["key_lens"]} for c in ours["kernel_calls"]]
    assert calls == kit.expected_kernel_calls(case, replayed=replayed)
    assert ours["kernel_calls"][0]["q"] == [case.bs * case.q_len, case.heads, 576]
    # 1. SGLang's kit passes (or, for its graph cases as shipped, kdtree matches Triton where Triton fails too)
    if ours["kit"] != "pass":
        assert case.runner == "graph" and case.layout == "kit", f"the kit fails kdtree: {ours['kit']}"
        assert triton["kit"].startswith("fail"), f"the kit passes triton but fails kdtree: {ours['kit']}"
        versus = triton["kdtree_vs_this"]
        assert versus["same_inputs"] and versus["rel"] <= pass_rel, versus
    # 3. our parity lines for the call (eager leg; the replay's graph line when the replay ran) pass the gate
    lines = parity_rels(ours)
    assert len(lines) == (2 if case.runner == "graph" and replayed else 1), lines
    assert any("mode=graph" in line for line in lines) == (case.runner == "graph" and replayed)
    assert [verdict(line) for line in lines] == [line_verdict.PASS] * len(lines), lines


@pytest.mark.parametrize("name", kit.BUG_CASES)
def test_classic_bug_fails_the_kit_and_its_parity(bug_results: dict[str, Any], name: str) -> None:
    case = kit.CASES_BY_NAME[name]
    buggy = bug_results[(name, "kdtree")]
    verdict, line_verdict, _ = _gate()
    print(f"{name} with the classic bug: {buggy['kit'][:200]}")
    assert buggy["kit"].startswith("fail: Tensor-likes are not close"), buggy["kit"]
    assert buggy["kernel_calls"], "the kernel did not run"
    assert buggy["kernel_calls"][0]["key_lens"] == list(case.prefix_lens)  # the drafts left out of the keys
    lines = parity_rels(buggy)
    assert lines and [verdict(line) for line in lines] == [line_verdict.FAIL] * len(lines), lines


@pytest.mark.parametrize("name", kit.BUG_LONG_CASES)
def test_classic_bug_at_long_prefixes_never_passes_the_gate(bug_results: dict[str, Any], name: str) -> None:
    """Thousands of prefix keys with the kit's random weights dilute the bug (``kit.BUG_LONG_CASES``): the kit may
    miss it there, the gate must not pass it."""
    buggy = bug_results[(name, "kdtree")]
    verdict, line_verdict, _ = _gate()
    lines = parity_rels(buggy)
    print(f"{name} with the classic bug: kit {buggy['kit'][:120]}; {lines}")
    assert buggy["kernel_calls"][0]["key_lens"] == list(kit.CASES_BY_NAME[name].prefix_lens)
    assert lines and line_verdict.PASS not in [verdict(line) for line in lines], lines
