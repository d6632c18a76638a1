#!/usr/bin/env python3
"""Build the kdtree verify-attention CUDA extension on the host it will run on.

    python deploy/build_extension.py --arch 12.0 --out <release>/kernel/build --log build.log --timeout 900

Compiles kernel/csrc/{verify_attention.cu,binding.cpp} with torch.utils.cpp_extension for one compute
capability into --out, where kdtree_kernel.load_extension() (or $KDTREE_EXT_DIR) finds it; importing it later
needs no compiler. The compile runs in a child process under --timeout with all its output in --log.

Exit codes: 0 built; 2 bad arguments; 3 no CUDA toolchain here (torch without CUDA or no nvcc): the release
runs the reference path; 4 the compile failed (see the log); 5 the compile timed out.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_NO_CUDA = 3
EXIT_BUILD_FAILED = 4
EXIT_TIMEOUT = 5
EXT_NAME = "kdtree_verify_ext"
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SOURCE_DIR = REPO_ROOT / "kernel" / "csrc"
SOURCES = (
    "binding.cpp",
    "verify_attention.cu",
    "verify_attention_i32.cu",
    "verify_attention_i64.cu",
)
ARCH_RE = re.compile(r"^\d{1,2}\.\d$")
AUTO_ARCHES = ("auto", "0.0")  # opsctl passes 0.0 for a host whose inventory names no GPU arch


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--arch",
        required=True,
        help="compute capability, e.g. 12.0 (RTX PRO 6000) or 9.0 (H200); 'auto' or 0.0: the visible GPU's",
    )
    parser.add_argument("--out", required=True, type=Path, help="directory that receives the built module")
    parser.add_argument("--log", type=Path, default=None, help="build log (default: <out>/build.log)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds before the compile is killed")
    parser.add_argument("--source-dir", type=Path, default=DEFAULT_SOURCE_DIR, help="kernel/csrc to compile")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel compile jobs")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def torch_without_cuda_libraries() -> str | None:
    """A CPU-only torch seen from its files, without importing it (2 s of a CPU host's deploy): the reason, or
    None when torch is absent or ships CUDA libraries (then the full check below decides)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return None
    torch_lib = Path(spec.origin).resolve().parent / "lib"
    if torch_lib.is_dir() and not any(torch_lib.glob("libc10_cuda.*")):
        return f"torch ships no CUDA libraries (no libc10_cuda in {torch_lib})"
    return None


def cuda_toolchain_problem() -> str | None:
    """Why this host cannot build the extension, or None if it can (torch with CUDA plus an nvcc)."""
    quick = torch_without_cuda_libraries()
    if quick is not None:
        return quick
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError as exc:
        return f"torch is not importable ({exc})"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    torch_lib = Path(torch.__file__).resolve().parent / "lib"
    if not any(torch_lib.glob("libc10_cuda.*")):
        return f"torch {torch.__version__} ships no CUDA libraries (no libc10_cuda in {torch_lib})"
    cuda_home = cpp_extension.CUDA_HOME
    nvcc = Path(cuda_home, "bin", "nvcc") if cuda_home else None
    if nvcc is None or not nvcc.exists():
        if shutil.which("nvcc") is None:
            return "nvcc was not found (set CUDA_HOME or put nvcc on PATH)"
    return None


def detect_arch() -> str | None:
    """Compute capability of GPU 0 as 'major.minor', or None when no GPU is visible."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}"


def arch_flags(arch: str) -> list[str]:
    """nvcc flags for one compute capability: SASS for it plus PTX for forward compatibility."""
    major, minor = arch.split(".")
    cc = f"{major}{minor}"
    return [f"-gencode=arch=compute_{cc},code=sm_{cc}", f"-gencode=arch=compute_{cc},code=compute_{cc}"]


def build_in_this_process(args: argparse.Namespace) -> int:
    """The child: setuptools + torch's BuildExtension, writing <out>/kdtree_verify_ext*.so."""
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CUDAExtension

    os.environ["TORCH_CUDA_ARCH_LIST"] = args.arch
    os.environ["MAX_JOBS"] = str(max(1, args.jobs))
    source_dir = args.source_dir.resolve()
    ext = CUDAExtension(
        name=EXT_NAME,
        sources=[str(source_dir / s) for s in SOURCES],
        include_dirs=[str(source_dir)],
        extra_compile_args={
            "cxx": ["-O3"],
            "nvcc": ["-O3", "-Xptxas=-v", *arch_flags(args.arch)],
        },
    )
    use_ninja = shutil.which("ninja") is not None
    with tempfile.TemporaryDirectory(prefix="kdtree-build-") as temp:
        setup(
            name=EXT_NAME,
            ext_modules=[ext],
            cmdclass={"build_ext": BuildExtension.with_options(use_ninja=use_ninja)},
            script_args=["build_ext", "--build-lib", str(args.out.resolve()), "--build-temp", temp],
        )
    built = sorted(args.out.glob(f"{EXT_NAME}*.so"))
    if not built:
        print(f"build finished but no {EXT_NAME}*.so landed in {args.out}", file=sys.stderr)
        return EXIT_BUILD_FAILED
    print(f"built {built[0]}")
    return EXIT_OK


def run_child(args: argparse.Namespace, log_path: Path) -> int:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        "--arch",
        args.arch,
        "--out",
        str(args.out.resolve()),
        "--source-dir",
        str(args.source_dir.resolve()),
        "--jobs",
        str(args.jobs),
    ]
    started = time.monotonic()
    with log_path.open("w") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        # cwd: the out dir, so setuptools does not pick up the repository's pyproject.toml
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=args.out.resolve(), start_new_session=True
        )
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the compiler processes are in the child's own session
            proc.wait()
            log.write(f"\nkilled after {args.timeout:.0f} s\n")
            return EXIT_TIMEOUT
        log.write(f"\nexit {rc} after {time.monotonic() - started:.1f} s\n")
    return EXIT_OK if rc == 0 else EXIT_BUILD_FAILED


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.arch not in AUTO_ARCHES and not ARCH_RE.match(args.arch):
        print(f"--arch must look like 12.0 or 9.0 (or 'auto'), got {args.arch!r}", file=sys.stderr)
        return EXIT_USAGE
    missing = [s for s in SOURCES if not (args.source_dir / s).is_file()]
    if missing:
        print(f"kernel sources missing in {args.source_dir}: {', '.join(missing)}", file=sys.stderr)
        return EXIT_USAGE
    if args.child:
        return build_in_this_process(args)
    problem = cuda_toolchain_problem()
    if problem is None and args.arch in AUTO_ARCHES:
        detected = detect_arch()
        if detected is None:
            problem = "no GPU visible to pick the arch from"
        else:
            args.arch = detected
    if problem is not None:
        print(f"no CUDA toolchain: {problem}; the release runs the reference path", file=sys.stderr)
        return EXIT_NO_CUDA
    args.out.mkdir(parents=True, exist_ok=True)
    log_path = args.log or args.out / "build.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    rc = run_child(args, log_path)
    messages = {
        EXIT_OK: f"built {EXT_NAME} for sm_{args.arch.replace('.', '')} into {args.out} (log {log_path})",
        EXIT_BUILD_FAILED: f"compile failed; see {log_path}",
        EXIT_TIMEOUT: f"compile timed out after {args.timeout:.0f} s; see {log_path}",
    }
    print(messages[rc], file=sys.stderr if rc else sys.stdout)
    return rc


if __name__ == "__main__":
    sys.exit(main())
