"""Which GPU a device session runs on, as run_device.sh needs it: the compute capability the extension is built for
and the tag of the folder its results go to (kernel/bench/results/<tag>/, :func:`results_dir`).

    python3 kernel/bench/gpu_tag.py "$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader | head -1)"
    -> "9.0 h200"

The committed figures are the H200's (tag h200, results/h200/). The same stages on the production GPU (RTX PRO 6000
Blackwell, sm_120) build for 12.0 and write results/rtxpro6000/, beside the H200's files instead of over them. A
result's JSON and markdown are committed; a run's logs and profiles are not (kernel/bench/.gitignore). No torch, no
GPU.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# Named GPUs whose files the project keeps; anything else is tagged by its compute capability (sm89, sm120, ...).
KNOWN = (("H200", "h200"), ("H100", "h100"), ("RTX PRO 6000", "rtxpro6000"))
CAPABILITY = re.compile(r"^(\d+)\.(\d+)$")
BENCH = Path(__file__).resolve().parent
COMMITTED_TAG = "h200"  # the GPU whose figures the bench scripts read and write by default
PATCHES = BENCH / "patches"  # the diagnostic kernel patches (run_device.sh trace, phases)


def results_dir(tag: str = COMMITTED_TAG) -> Path:
    """``kernel/bench/results/<tag>/``: one GPU's results (run_device.sh spells the same path in shell)."""
    return BENCH / "results" / tag


def arch_and_tag(smi_line: str) -> tuple[str, str]:
    """'NVIDIA H200, 9.0' (nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader) -> ('9.0', 'h200')."""
    name, sep, capability = smi_line.strip().rpartition(",")
    capability = capability.strip()
    match = CAPABILITY.match(capability)
    if not sep or not name.strip() or match is None:
        raise ValueError(f"not 'NAME, MAJOR.MINOR' (nvidia-smi name,compute_cap): {smi_line.strip()!r}")
    for marker, tag in KNOWN:
        if marker in name:
            return capability, tag
    return capability, f"sm{match.group(1)}{match.group(2)}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: gpu_tag.py 'NAME, MAJOR.MINOR'", file=sys.stderr)
        return 2
    try:
        arch, tag = arch_and_tag(argv[0])
    except ValueError as exc:
        print(f"gpu_tag.py: {exc}", file=sys.stderr)
        return 2
    print(arch, tag)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
