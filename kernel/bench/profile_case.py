"""Runs one verify case a few times so that ncu can profile the kernel (see run_device.sh stage `profile`).

    ncu --clock-control none -k regex:verify_attention_kernel -c 1 --section ... \\
        python3 kernel/bench/profile_case.py --bs 64 --prefix 8192 --q-len 9 --heads 8
"""

from __future__ import annotations

import argparse

import torch
from kdtree_kernel.testing import make_case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--prefix", type=int, default=8192)
    parser.add_argument("--q-len", type=int, default=9)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--fp8", action="store_true", help="an fp8 e4m3 pool (scale 1/32) instead of bf16")
    args = parser.parse_args()
    fp8 = {"kv_dtype": torch.float8_e4m3fn, "kv_scale": 1 / 32} if args.fp8 else {}
    case = make_case(args.bs, args.prefix, args.q_len, args.heads, **fp8)
    for _ in range(args.calls):
        case.run_kernel(0.14468)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
