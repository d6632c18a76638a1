"""The unit's program on GPU hosts: preflight, then exec SGLang's server with the kdtree backend.

    PYTHONPATH=<release>/kernel:<release>/backend python3 -m kdtree_backend.launch --model-path ... [sglang args]

Preflight fails fast, with one message and a non-zero exit, when
  * SGLang is missing or not the supported version (exit 4);
  * the kdtree CUDA extension is missing, does not import with this host's torch, or does not run on this GPU
    (a tiny verify call checked against the reference; exit 5);
  * SGLang could not discover the plugin entry point (exit 6): the release ships
    ``backend/kdtree_backend_plugin-*.dist-info`` so that ``PYTHONPATH=<release>/backend`` is enough.
Then it adds ``--attention-backend kdtree`` (or ``--prefill-attention-backend kdtree
--decode-attention-backend triton`` with ``backend.attention_mode = "prefill"``) and
``--speculative-draft-attention-backend triton`` unless the arguments already choose, and execs
``python -m sglang.launch_server``. ``--kdtree-dry-run`` prints the command instead.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Sequence
from importlib import metadata

from . import BACKEND_NAME, SUPPORTED_SGLANG_VERSION
from .config import ConfigError, load_config

EXIT_USAGE = 2
EXIT_SGLANG = 4
EXIT_EXTENSION = 5
EXIT_PLUGIN = 6
DRY_RUN_FLAG = "--kdtree-dry-run"
PLUGIN_GROUP = "sglang.srt.plugins"
ATTENTION_FLAGS = ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend")
DRAFT_FLAG = "--speculative-draft-attention-backend"


class PreflightError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def server_argv(args: Sequence[str], attention_mode: str) -> list[str]:
    """SGLang's arguments: the caller's, plus the kdtree/triton backend choices it did not make itself."""
    out = list(args)
    if not any(_has_flag(out, flag) for flag in ATTENTION_FLAGS):
        if attention_mode == "prefill":
            out += ["--prefill-attention-backend", BACKEND_NAME, "--decode-attention-backend", "triton"]
        else:
            out += ["--attention-backend", BACKEND_NAME]
    if not _has_flag(out, DRAFT_FLAG):
        out += [DRAFT_FLAG, "triton"]
    return out


def check_sglang_version(installed: str | None) -> None:
    if installed is None:
        raise PreflightError(
            EXIT_SGLANG, f"SGLang is not installed for {sys.executable}; install sglang=={SUPPORTED_SGLANG_VERSION}"
        )
    if installed != SUPPORTED_SGLANG_VERSION:
        raise PreflightError(
            EXIT_SGLANG,
            f"SGLang {installed} is installed but the kdtree backend supports {SUPPORTED_SGLANG_VERSION} only; "
            f"install sglang=={SUPPORTED_SGLANG_VERSION} or deploy a release built for {installed}",
        )


def check_plugin_discoverable(entry_points: Sequence[metadata.EntryPoint]) -> None:
    if not any(ep.name == BACKEND_NAME and ep.value.startswith("kdtree_backend.plugin") for ep in entry_points):
        raise PreflightError(
            EXIT_PLUGIN,
            f"SGLang will not find the '{BACKEND_NAME}' plugin: no '{PLUGIN_GROUP}' entry point on sys.path; put "
            "<release>/backend on PYTHONPATH (it ships the plugin's dist-info) or pip install the release",
        )


def check_extension() -> None:
    """The built extension imports with this torch and computes a tiny verify right on this GPU."""
    import kdtree_kernel
    import torch

    if not torch.cuda.is_available():
        raise PreflightError(EXIT_EXTENSION, f"no CUDA device visible to torch {torch.__version__}")
    available = getattr(kdtree_kernel, "extension_available", None)
    load = getattr(kdtree_kernel, "load_extension", None)
    if available is None or load is None or not hasattr(kdtree_kernel, "verify_attention"):
        raise PreflightError(EXIT_EXTENSION, "this release's kdtree_kernel has no CUDA op (kernel/ incomplete)")
    try:
        load()
    except Exception as exc:  # ExtensionNotBuilt, with the reason: not built, or built for another torch
        raise PreflightError(
            EXIT_EXTENSION, f"kdtree extension does not load with torch {torch.__version__}: {exc}"
        ) from exc
    from .batch import make_verify_batch
    from .verify import attend, marshal_verify, parity_stats

    batch = make_verify_batch(bs=2, prefix=40, q_len=9, heads=8, device="cuda", seed=0)
    meta = marshal_verify(
        batch.kv_indptr, batch.kv_indices, batch.out_cache_loc, batch.custom_mask, batch.mask_indptr, 9
    )
    try:
        out = attend(batch.q[0], batch.kv_buffers[0], meta, batch.qo_indptr, batch.sm_scale, use_kernel=True)
        ref = attend(batch.q[0], batch.kv_buffers[0], meta, batch.qo_indptr, batch.sm_scale, use_kernel=False)
        rel = parity_stats(out, ref)[2]
    except Exception as exc:  # e.g. "no kernel image is available for execution on the device"
        cap = torch.cuda.get_device_capability()
        raise PreflightError(
            EXIT_EXTENSION, f"kdtree extension fails on this GPU (sm_{cap[0]}{cap[1]}): {exc}; rebuild it on this host"
        ) from exc
    if not rel <= 1e-2:
        raise PreflightError(EXIT_EXTENSION, f"kdtree extension computes wrong results here (rel={rel:.3g})")


def installed_sglang_version() -> str | None:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def preflight(
    *,
    sglang_version: Callable[[], str | None] = installed_sglang_version,
    plugin_entry_points: Callable[[], Sequence[metadata.EntryPoint]] = lambda: list(
        metadata.entry_points(group=PLUGIN_GROUP)
    ),
    extension: Callable[[], None] = check_extension,
) -> None:
    check_sglang_version(sglang_version())
    check_plugin_discoverable(plugin_entry_points())
    extension()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    dry_run = DRY_RUN_FLAG in args
    args = [arg for arg in args if arg != DRY_RUN_FLAG]
    try:
        config = load_config()
        preflight()
    except ConfigError as exc:
        print(f"kdtree-launch: bad configuration: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except PreflightError as exc:
        print(f"kdtree-launch: {exc}", file=sys.stderr, flush=True)
        return exc.code
    command = [sys.executable, "-m", "sglang.launch_server", *server_argv(args, config.attention_mode)]
    print(f"kdtree-launch: preflight ok (sglang {SUPPORTED_SGLANG_VERSION}, extension ok); exec {shlex.join(command)}")
    sys.stdout.flush()
    if dry_run:
        return 0
    os.execv(sys.executable, command)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
