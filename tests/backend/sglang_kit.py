"""SGLang 0.5.23's own MLA target-verify test kit (``sglang/test/kits/attention_unittest/``), driven with the
``kdtree`` backend (and SGLang's ``triton`` for comparison), in a process of its own: importing SGLang has
process-wide effects, and the kit needs stubs for modules that cannot load on a bare machine.

    python tests/backend/sglang_kit.py --device cuda --out results.jsonl [--backends kdtree,triton] [--cases A,B]

One JSON object per (case, runner, backend) in ``--out``; tests/backend/test_sglang_kit_gpu.py (CUDA) and
tests/backend/test_sglang_plugin.py (CPU) run it and assert on them.

What the kit does, all with SGLang's own code: builds a ``MockMLAModelRunner``, the backend through SGLang's
attention registry, a real ``ForwardBatch`` with an EAGLE verify ``spec_info`` (custom mask, ``topk``), writes the
prefix and draft K/V into a real ``MLATokenToKVPool`` (``TinyDeepseekMLAAttention`` writes the drafts itself and
calls attention with ``k = v = None, save_kv_cache=False``), runs ``init_forward_metadata`` (eager) or
``init_cuda_graph_state`` + ``init_forward_metadata_out_graph`` capture and padded replay (the CUDA-graph runner;
it runs the captured forward eagerly, no ``torch.cuda.CUDAGraph``: tests/backend/test_gpu.py replays real
graphs), and compares the output with its dense reference (``torch.testing.assert_close``, atol = rtol = 3e-2).
The replay metadata also goes through the kit's ``runner_modes/metadata_invariants.py`` (monotonic indptrs,
non-negative lengths).

What this driver adds, without changing any of that:
  * ``our_tree_mask``: a tree-mask builder of ours (any EAGLE-format tree given as parent indices) put where the
    kit's ``_draft_tree_mask`` stands (that one hard-codes 3 draft tokens for ``topk > 1``);
  * counters: the kernel's calls (``kdtree_kernel.verify_attention``, wrapped, with the shapes it was given),
    the ``[kdtree]`` lines the backend printed during the case, every forward output and every kit reference;
  * on CPU (``--device cpu``): SGLang's Triton metadata kernels run in Triton's interpreter
    (``TRITON_INTERPRET=1``, set by the caller) and the backend's verify path is its torch reference (the
    marshaling, then ``kdtree_kernel.verify_attention_reference``): the kit then checks our marshaling of SGLang's
    metadata, with no GPU. Parity is off there (its reference would be interpreted Triton).

Stubs (:data:`STUBS`): modules that are imported at the top of SGLang modules the kit loads, but that the verify
path never calls. A stub is installed only where the real module is not importable; every attribute of it
raises when called, except :data:`ANSWERS` (capability queries with a fixed answer). The calls are recorded and
reported (``stub_calls``); the tests assert that nothing but an answered query was called.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.machinery
import importlib.util
import io
import json
import os
import random
import re
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Module -> why it is stubbed (where it is not installed). None of them is called on the verify path.
STUBS: dict[str, str] = {
    "sgl_kernel": "SGLang's CUDA kernel wheel (~370 MB, built for another torch); imported at module top",
    "sgl_kernel.utils": "imported by the Triton backend for is_arch_support_pdl (answered, see ANSWERS)",
    "sgl_kernel.quantization": "quantized GEMMs; imported at module top by quantization layers",
    "sgl_kernel.kvcacheio": "host<->device KV transfer (hierarchical cache); imported at module top",
    "IPython": "notebook display helpers; imported at module top by sglang.utils",
    "IPython.display": "as IPython",
    "fastapi": "the HTTP server; imported at module top by model_runner's launch gating",
    "fastapi.responses": "as fastapi",
    "uvicorn": "the HTTP server; imported at module top by model_runner's launch gating",
}
# Stubbed capability queries and their fixed answer. is_arch_support_pdl sets TritonAttnBackend.use_pdl, which
# only the decode kernels read (programmatic dependent launch off: plain launches); verify never reads it.
ANSWERS: dict[str, Any] = {"sgl_kernel.utils.is_arch_support_pdl": False}

KIT = "sglang.test.kits.attention_unittest"
MLA_SHAPE = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "hidden_size": 1024}  # DeepSeek/Kimi absorbed MLA
RUNNERS = ("eager", "graph")  # run_mla_eagle_verify_case, run_mla_eagle_verify_cuda_graph_case


@dataclass(frozen=True)
class KitCase:
    """One verify case for the kit's MLA runners. ``parents``: the draft tree (EAGLE format, node 0 the root,
    parents before children) for our tree-mask builder; empty: the kit's own ``_draft_tree_mask`` (a chain for
    ``topk`` 1, its 3-token tree for ``topk`` 2)."""

    name: str
    prefix_lens: tuple[int, ...]
    q_len: int
    topk: int
    heads: int
    runner: str  # eager | graph
    spec_kind: str = "eagle"
    parents: tuple[int, ...] = ()
    capture_bs: int = 0  # graph runner: the captured batch (> bs: the replay is padded)
    # graph runner: "kit" as SGLang ships it, or "contiguous": its fixture built in the contiguous layout that its
    # own graph runner re-populates the prefix in (see CONSISTENT_LAYOUT)
    layout: str = "kit"
    ours: bool = False  # a case of ours (production shape) rather than one of SGLang's own

    @property
    def bs(self) -> int:
        return len(self.prefix_lens)

    @property
    def max_context_len(self) -> int:
        """Rows per request in the kit's pools: the longest prefix and its drafts, rounded up to 64."""
        return max(64, -(-(max(self.prefix_lens) + self.q_len + 1) // 64) * 64)


def tree_parents(q_len: int, topk: int, shape: str, seed: int = 0) -> tuple[int, ...]:
    """An EAGLE-format draft tree of ``q_len`` nodes (the root and ``q_len - 1`` drafts), no node with more than
    ``topk`` children, parents before children. ``wide``: the root's ``topk`` children, then the first child's,
    and so on breadth-first; ``deep``: the root's ``topk`` children, then a chain under the first one;
    ``random``: each node hangs under a random earlier node that has room (seeded)."""
    parents = [-1]
    children = [0] * q_len
    rng = random.Random(seed)
    for node in range(1, q_len):
        if shape == "wide":
            parent = next(p for p in range(node) if children[p] < topk)
        elif shape == "deep":
            parent = 0 if node <= topk else (1 if node == topk + 1 else node - 1)
        elif shape == "random":
            parent = rng.choice([p for p in range(node) if children[p] < topk])
        else:
            raise ValueError(f"unknown tree shape {shape!r} (wide, deep or random)")
        children[parent] += 1
        parents.append(parent)
    return tuple(parents)


def ancestor_mask(parents: tuple[int, ...], device: Any = "cpu") -> Any:
    """bool ``[n, n]``: row i is true at i and at each of its ancestors (what a draft token may attend to)."""
    import torch

    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool, device=device)
    for node in range(n):
        at = node
        while at >= 0:
            mask[node, at] = True
            at = parents[at]
    return mask


# SGLang's graph runner re-populates the prefix K/V in the contiguous layout (prepare_mla_runner_inputs ->
# _populate_prefix_kv without the fixture's loc_fn) over a fixture whose req_to_token maps shuffled pages: in its
# first (eager) leg the pool then holds other rows than the reference assumes, for every backend (SGLang's Triton
# fails SGLang's chain graph cases so), and the capture and padded replay are never reached. Our graph cases build
# the fixture in the contiguous layout that the runner's capture and replay batches use anyway.
CONSISTENT_LAYOUT = "contiguous"


def _ours(name: str, prefixes: tuple[int, ...], runner: str, shape: str, seed: int, capture_bs: int = 0) -> KitCase:
    q_len, topk = 9, 4  # 8 drafts + the root, topk 4: a DDTree-sized verify
    return KitCase(
        name=name,
        prefix_lens=prefixes,
        q_len=q_len,
        topk=topk,
        heads=8,
        runner=runner,
        parents=tree_parents(q_len, topk, shape, seed),
        capture_bs=capture_bs,
        layout=CONSISTENT_LAYOUT if runner == "graph" else "kit",
        ours=True,
    )


def _sglang_own() -> list[KitCase]:
    """SGLang's own MLA verify cases (its test_triton MLA suite: EAGLE_VERIFY_CASES and the CUDA-graph ones:
    prefixes (4, 7), 3 tokens per request, 4 heads, chain or its 3-token topk-2 tree, four spec kinds), at page
    size 1 (the kernel's; SGLang's file uses 16) with the absorbed-MLA shapes and bf16 (the kernel's pool)."""
    kinds = (("chain", 1, "eagle"), ("tree", 2, "eagle"), ("chain", 1, "frozen_kv_mtp"), ("chain", 1, "dflash"),
             ("chain", 1, "ngram"))  # fmt: skip
    variants = (("eager", "kit"), ("graph", "kit"), ("graph", CONSISTENT_LAYOUT))
    return [
        KitCase(
            name=f"sglang_{runner}_{kind}_{spec}" + ("" if layout == "kit" else f"_{layout}"),
            prefix_lens=(4, 7),
            q_len=3,
            topk=topk,
            heads=4,
            runner=runner,
            spec_kind=spec,
            capture_bs=4 if runner == "graph" else 0,  # the kit's default capture batch
            layout=layout,
        )
        for runner, layout in variants
        for kind, topk, spec in kinds
    ]


CASES: list[KitCase] = [
    *_sglang_own(),
    _ours("ours_eager_bs1_p0_wide", (0,), "eager", "wide", 0),
    _ours("ours_eager_bs3_deep", (0, 17, 300), "eager", "deep", 0),
    _ours("ours_eager_bs8_ragged", (5, 1200, 0, 3000, 64, 777, 2048, 9), "eager", "random", 1),
    _ours("ours_eager_bs2_long", (2500, 3500), "eager", "random", 2),
    _ours("ours_eager_bs4_short", (9, 40, 130, 21), "eager", "random", 5),
    _ours("ours_graph_bs1_pad4", (1000,), "graph", "wide", 0, capture_bs=4),
    _ours("ours_graph_bs2_short_pad4", (12, 90), "graph", "deep", 0, capture_bs=4),
    _ours("ours_graph_bs3_pad8", (0, 513, 2900), "graph", "random", 3, capture_bs=8),
    _ours("ours_graph_bs5_pad8", (31, 2222, 0, 64, 1500), "graph", "deep", 0, capture_bs=8),
    _ours("ours_graph_bs8_full", (3000, 1, 640, 0, 2047, 128, 999, 2600), "graph", "random", 4, capture_bs=8),
]
CASES_BY_NAME = {case.name: case for case in CASES}
# The classic bug's run, eager and graph: each must fail the kit, and its parity lines must FAIL. Every prefix
# holds at least q_len rows (with fewer, the bug's key lists are shorter than the drafts and the kernel's input
# check refuses the batch instead of computing the wrong attention the bug computes in production), and the
# prefixes are short, as in the production symptom (prefix 21): see BUG_LONG_CASES.
BUG_CASES = (
    "sglang_eager_tree_eagle",
    "sglang_graph_chain_eagle_contiguous",
    "ours_eager_bs4_short",
    "ours_graph_bs2_short_pad4",
)
# The bug at long prefixes: the kit's random weights make its scores nearly flat, so the 9 draft keys swapped for
# 9 prefix rows move the output little among thousands of keys (seen on the H200: prefixes 2500/3500, rel 3.3e-2;
# the kit's assert_close, atol 3e-2, passed it). The gate must still never pass it (rel > pass_rel).
BUG_LONG_CASES = ("ours_eager_bs2_long", "ours_graph_bs1_pad4")
# Small enough for CI's CPU (Triton's interpreter builds the metadata there).
CPU_CASES = (
    "sglang_eager_chain_eagle",
    "sglang_eager_tree_eagle",
    "sglang_eager_chain_dflash",
    "sglang_graph_chain_eagle_contiguous",
    "sglang_graph_tree_eagle_contiguous",
    "ours_eager_bs3_deep",
    "ours_graph_bs1_pad4",
)
CPU_BUG_CASES = ("sglang_eager_tree_eagle", "sglang_graph_tree_eagle_contiguous")


PAD_PREFIX = 1  # TritonAttnBackend.get_cuda_graph_seq_len_fill_value(): the prefix of capture and padding requests


def expected_kernel_calls(case: KitCase, *, replayed: bool) -> list[dict[str, Any]]:
    """The kernel calls a served case makes, by batch and per-request key counts (prefix + drafts): the eager
    runner's one; the graph runner's eager leg, then (``replayed``: its eager leg passed) the capture batch of
    ``capture_bs`` fill-value requests and the padded replay (the real requests, then padding ones)."""
    real = {"bs": case.bs, "key_lens": [p + case.q_len for p in case.prefix_lens]}
    if case.runner == "eager" or not replayed:
        return [real]
    pad = case.capture_bs - case.bs
    capture = {"bs": case.capture_bs, "key_lens": [PAD_PREFIX + case.q_len] * case.capture_bs}
    replay = {"bs": case.capture_bs, "key_lens": real["key_lens"] + [PAD_PREFIX + case.q_len] * pad}
    return [real, capture, replay]


# ---- how the tests run this driver --------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]


def driver_command(python: str, *, device: str, cases: list[str], backends: str, out: Path) -> list[str]:
    return [python, str(Path(__file__).resolve()), "--device", device, "--backends", backends, "--cases",
            ",".join(cases), "--out", str(out)]  # fmt: skip


def driver_env(base: dict[str, str], *, device: str, backend_root: Path | None = None) -> dict[str, str]:
    """The driver's environment: this checkout's packages (a release-like copy's first, e.g. one with the
    classic bug), parity on layer 0 (the kit's one layer) on GPU; on CPU Triton's interpreter and no parity."""
    env = dict(base)
    roots = [f"{backend_root}/kernel", f"{backend_root}/backend"] if backend_root else []
    paths = [*roots, f"{REPO}/kernel", f"{REPO}/backend", str(REPO), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.pop("KDTREE_CONFIG", None)
    env["PYTHONUNBUFFERED"] = "1"
    if device == "cpu":
        env.update(TRITON_INTERPRET="1", KDTREE_PARITY="0")
    else:
        env.update(KDTREE_PARITY="1", KDTREE_PARITY_LAYERS="0", KDTREE_PARITY_BURST="8")
    return env


def read_results(path: Path) -> dict[Any, Any]:
    """The driver's records -> ``{"header": {...}, (case, backend): result}``: JSON lines as a run writes them under
    ``$OUT``, or one JSON array as committed under ``kernel/bench/results/`` (results there are JSON and markdown)."""
    results: dict[Any, Any] = {}
    text = path.read_text()
    records = json.loads(text) if path.suffix == ".json" else [json.loads(line) for line in text.splitlines()]
    for record in records:
        if record.get("header"):
            results["header"] = record
        else:
            results[(record["case"], record["backend"])] = record
    return results


# ---- stubs --------------------------------------------------------------------------------------------------
@dataclass
class StubLog:
    installed: list[str] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)


def install_stubs(log: StubLog) -> None:
    """Put a stub in ``sys.modules`` for each :data:`STUBS` module whose top-level package is not importable."""
    for name in STUBS:
        top = name.split(".")[0]
        if top not in log.installed and importlib.util.find_spec(top) is not None:
            continue  # the real package is here: use it
        module = types.ModuleType(name)
        module.__path__ = []
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

        def attribute(attr: str, _module: str = name) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            qualified = f"{_module}.{attr}"

            def call(*_args: Any, **_kwargs: Any) -> Any:
                log.calls.append(qualified)
                if qualified in ANSWERS:
                    return ANSWERS[qualified]
                raise RuntimeError(f"stub {qualified} called: the verify path was not expected to need {_module}")

            return call

        module.__getattr__ = attribute  # type: ignore[method-assign]
        sys.modules[name] = module
        log.installed.append(name)


# ---- counters -----------------------------------------------------------------------------------------------
@dataclass
class Record:
    kernel_calls: list[dict[str, Any]] = field(default_factory=list)
    forwards: list[Any] = field(default_factory=list)
    expected: list[Any] = field(default_factory=list)


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def counting(fn: Callable[..., Any], calls: list[dict[str, Any]]) -> Callable[..., Any]:
    """``kdtree_kernel.verify_attention`` (or its reference) that records each call's shapes."""

    def wrapper(q: Any, kv_buffer: Any, key_indptr: Any, keys: Any, qo_indptr: Any, *args: Any, **kw: Any) -> Any:
        calls.append(
            {
                "q": list(q.shape),
                "kv_buffer": list(kv_buffer.shape),
                "keys_used": int(key_indptr[-1]),  # host read: fine outside a graph, and the kit captures none
                "key_lens": (key_indptr[1:] - key_indptr[:-1]).tolist(),
                "bs": int(key_indptr.numel() - 1),
            }
        )
        return fn(q, kv_buffer, key_indptr, keys, qo_indptr, *args, **kw)

    return wrapper


def recording(fn: Callable[..., Any], into: list[Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kw: Any) -> Any:
        out = fn(*args, **kw)
        into.append(out.detach().float().cpu())
        return out

    return wrapper


# ---- one case -----------------------------------------------------------------------------------------------
def our_tree_mask(parents: tuple[int, ...]) -> Callable[..., Any]:
    """A drop-in for the kit's ``_draft_tree_mask(draft_token_num=, topk=, device=)`` that builds our tree."""

    def build(*, draft_token_num: int, topk: int, device: str) -> Any:
        if draft_token_num != len(parents):
            raise ValueError(f"tree of {len(parents)} nodes asked for {draft_token_num} draft tokens")
        return ancestor_mask(parents, device)

    return build


def kit_case(case: KitCase, backend: str) -> Any:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.test.kits.attention_unittest.attention_methods.mla_attention import MLAAttentionCase

    return MLAAttentionCase(
        name=case.name,
        backend=backend,
        forward_mode=ForwardMode.TARGET_VERIFY,
        num_heads=case.heads,
        page_size=1,
        prefix_lens=case.prefix_lens,
        extend_lens=(case.q_len,) * case.bs,
    )


def run_case(case: KitCase, backend: str, device: str) -> dict[str, Any]:
    import unittest

    import kdtree_kernel
    import torch
    from sglang.test.kits.attention_unittest.runner_modes import speculative_target_verify_runner as runner

    record = Record()
    _last_backend.clear()
    kernel_name = "verify_attention" if device == "cuda" else "verify_attention_reference"
    stdout = io.StringIO()
    result: dict[str, Any] = {"case": case.name, "runner": case.runner, "backend": backend, "device": device}
    kwargs: dict[str, Any] = dict(
        topk=case.topk,
        spec_kind=case.spec_kind,
        dtype=torch.bfloat16,
        device=device,
        max_context_len=case.max_context_len,
        **MLA_SHAPE,
    )
    if case.runner == "graph":
        kwargs["cuda_graph_capture_batch_size"] = case.capture_bs
    run = runner.run_mla_eagle_verify_case if case.runner == "eager" else runner.run_mla_eagle_verify_cuda_graph_case
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            patched(kdtree_kernel, kernel_name, counting(getattr(kdtree_kernel, kernel_name), record.kernel_calls))
        )
        stack.enter_context(patched(runner, "run_mla_forward", recording(runner.run_mla_forward, record.forwards)))
        reference = runner.mla_attention_reference_with_custom_mask
        stack.enter_context(patched(runner, "mla_attention_reference_with_custom_mask", recording(reference, record.expected)))  # fmt: skip
        if case.parents:
            stack.enter_context(patched(runner, "_draft_tree_mask", our_tree_mask(case.parents)))
        if case.layout == "contiguous":
            build = functools.partial(runner.build_mla_attention_fixture, loc_layout="contiguous")
            stack.enter_context(patched(runner, "build_mla_attention_fixture", build))
        stack.enter_context(contextlib.redirect_stdout(stdout))
        try:
            _run_kit(run, case, backend, kwargs)
            result["kit"] = "pass"
        except unittest.SkipTest as exc:
            result["kit"] = f"skip: {exc}"
        except AssertionError as exc:  # the kit's verdict (assert_close, metadata invariants)
            result["kit"] = "fail: " + " ".join(str(exc).split())[:600]
        except Exception as exc:
            result["kit"] = f"error: {type(exc).__name__}: {exc}"[:600]
            result["traceback"] = traceback.format_exc(limit=-8)[-3000:]
        flush = getattr(_last_backend.get("backend"), "kdtree_engine", None)
        if flush is not None:
            flush.flush()  # graph-mode parity lines are printed one step late; print what is pending
    result["seconds"] = round(time.perf_counter() - started, 2)
    result["lines"] = [line for line in stdout.getvalue().splitlines() if line.startswith("[kdtree]")]
    result["kernel_calls"] = record.kernel_calls
    final, expected = (
        (record.forwards[-1], record.expected[-1]) if record.forwards and record.expected else (None, None)
    )
    if final is not None and expected is not None and final.shape == expected.shape:
        tokens = case.bs * case.q_len  # the real requests' rows (a padded replay has more)
        diff = (final[:tokens] - expected[:tokens]).abs()
        result["vs_kit_reference"] = {
            "max_abs": float(diff.max()),
            "rel": float(diff.norm() / expected[:tokens].norm()),
        }
    result["_final"] = final[: case.bs * case.q_len] if final is not None else None
    result["_expected"] = expected[: case.bs * case.q_len] if expected is not None else None
    return result


def _run_kit(run: Callable[..., None], case: KitCase, backend: str, kwargs: dict[str, Any]) -> None:
    import unittest

    try:
        run(unittest.TestCase(), kit_case(case, backend), **kwargs)
    except AssertionError as exc:
        if "not close" in str(exc) or "invariants violated" in str(exc):
            raise
        raise RuntimeError(f"AssertionError on the way: {exc}") from exc


# The backend the kit built last (its factory runs inside the kit): flushed after each case.
_last_backend: dict[str, Any] = {}


def register_backends(device: str) -> None:
    """``kdtree`` through the plugin's own register(); on CPU its verify path is forced to the torch reference."""
    import kdtree_backend.plugin as plugin
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    plugin.register()
    factory = ATTENTION_BACKENDS["kdtree"]

    def kdtree(runner: Any) -> Any:
        if device == "cpu":
            import kdtree_backend.routing as routing

            with patched(routing, "kernel_usable", lambda _device: (True, "")):
                backend = factory(runner)
            if backend.kdtree_engine is not None:
                backend.kdtree_engine.use_kernel = False  # the marshaling, then the torch reference
        else:
            backend = factory(runner)
        _last_backend["backend"] = backend
        return backend

    ATTENTION_BACKENDS["kdtree"] = kdtree


def _verdict(kit: str) -> str:
    """``pass``, or ``fail (N / M off)`` from assert_close's message, or the first words of an error."""
    found = re.search(r"Mismatched elements: (\d+) / (\d+)", kit)
    return "pass" if kit == "pass" else (f"fail ({found[1]} / {found[2]} off)" if found else kit[:48])


def _rels(result: dict[str, Any]) -> str:
    rels = [line.split(" rel=")[1].split()[0] for line in result["lines"] if line.startswith("[kdtree] L")]
    modes = [line.split(" mode=")[1].split()[0] for line in result["lines"] if line.startswith("[kdtree] L")]
    return ", ".join(f"{rel} ({mode})" for rel, mode in zip(rels, modes, strict=True)) or "-"


def summary_markdown(results: dict[Any, Any], bug: dict[Any, Any] | None = None) -> str:
    """The runs' results as the markdown committed under kernel/bench/results/<gpu>/sglang-kit.md."""
    header = results["header"]
    out = [
        "# SGLang 0.5.23's MLA target-verify kit with backend kdtree",
        "",
        f"{header['device_name']}, torch {header['torch']}; stubs installed: {', '.join(header['stubs_installed'])}.",
        "Made by `bash kernel/bench/run_device.sh build sglang-kit` (tests/backend/test_sglang_kit_gpu.py);",
        "`python tests/backend/sglang_kit.py --summarize sglang-kit.json sglang-kit-bug.json` writes this table.",
        "kit: the kit's own assert_close; calls: the kernel's calls (eager leg, capture, padded replay); parity: the",
        "`[kdtree]` lines' rel (kernel vs SGLang's Triton on the same call); vs triton: kdtree's final output",
        "against SGLang's Triton backend run on the same case; vs kit ref: against the kit's dense reference.",
        "",
        "| case | bs | prefixes | q_len / topk | heads | kdtree: kit | calls | parity rel | vs triton rel | "
        "vs kit ref rel | triton: kit |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    names = [key[0] for key in results if key != "header" and key[1] == "kdtree"]
    for name in names:
        ours = results[(name, "kdtree")]
        spec = ours["case_spec"]
        triton = results.get((name, "triton"), {})
        versus = triton.get("kdtree_vs_this", {}).get("rel")
        bs = f"{len(spec['prefix_lens'])}" + (f" (graph {spec['capture_bs']})" if spec["runner"] == "graph" else "")
        layout = f", {spec['layout']} layout" if spec["runner"] == "graph" else ""
        out.append(
            f"| {name}{layout} | {bs} | {', '.join(map(str, spec['prefix_lens']))} | {spec['q_len']} / {spec['topk']} "
            f"| {spec['heads']} | {_verdict(ours['kit'])} | {len(ours['kernel_calls'])} | {_rels(ours)} | "
            f"{'-' if versus is None else f'{versus:.2e}'} | {ours.get('vs_kit_reference', {}).get('rel', 0):.2e} | "
            f"{_verdict(triton.get('kit', '-'))} |"
        )
    if bug:
        out += [
            "",
            "The classic bug (marshal.py's drafts-appended line made `pass`), through the kit:",
            "",
            "| case | prefixes | kit | keys per request (kernel's first call) | parity rel |",
            "|---|---|---|---|---|",
        ]
        for key, result in bug.items():
            if key == "header":
                continue
            spec = result["case_spec"]
            keys = result["kernel_calls"][0]["key_lens"] if result["kernel_calls"] else "-"
            out.append(
                f"| {key[0]} | {', '.join(map(str, spec['prefix_lens']))} | {_verdict(result['kit'])} | {keys} | "
                f"{_rels(result)} |"
            )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summarize", nargs="+", type=Path, help="results [bug results] -> markdown on stdout")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--backends", default="kdtree,triton", help="comma-separated: kdtree, triton")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    parser.add_argument("--out", type=Path, help="JSON lines, one per case and backend")
    args = parser.parse_args(argv)
    if args.summarize:
        bug = read_results(args.summarize[1]) if len(args.summarize) > 1 else None
        print(summary_markdown(read_results(args.summarize[0]), bug), end="")
        return 0
    if args.out is None:
        parser.error("--out is required")
    names = [n for n in args.cases.split(",") if n] or [case.name for case in CASES]
    unknown = [n for n in names if n not in CASES_BY_NAME]
    if unknown:
        parser.error(f"unknown case(s): {', '.join(unknown)}")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torchvision_shim

    torchvision_shim.install_if_needed()
    log = StubLog()
    install_stubs(log)
    started = time.perf_counter()
    import torch
    from sglang.test.kits.attention_unittest.runner_modes import speculative_target_verify_runner  # noqa: F401

    register_backends(args.device)
    header = {
        "header": True,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "import_seconds": round(time.perf_counter() - started, 1),
        "stubs_installed": log.installed,
        "kdtree_backend": str(Path(sys.modules["kdtree_backend"].__file__ or "").parent),
    }
    with args.out.open("w") as out:
        out.write(json.dumps(header) + "\n")
        for name in names:
            case = CASES_BY_NAME[name]
            outputs = {}
            for backend in [b for b in args.backends.split(",") if b]:
                result = run_case(case, backend, args.device)
                outputs[backend] = (result.pop("_final"), result.pop("_expected"))
                result["stub_calls"] = sorted(set(log.calls))
                result["case_spec"] = asdict(case)
                if backend != "kdtree" and "kdtree" in outputs and outputs["kdtree"][0] is not None:
                    ours, ours_expected = outputs["kdtree"]
                    theirs, theirs_expected = outputs[backend]
                    if theirs is not None and ours.shape == theirs.shape:
                        diff = (ours - theirs).abs()
                        result["kdtree_vs_this"] = {
                            "max_abs": float(diff.max()),
                            "rel": float(diff.norm() / theirs.norm()),
                            "same_inputs": bool(torch.equal(ours_expected, theirs_expected)),
                        }
                out.write(json.dumps(result) + "\n")
                out.flush()
                print(f"{name} {backend}: {result['kit'][:120]} ({result['seconds']} s)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
