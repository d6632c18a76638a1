"""Which failed argument checks of the extension's binding raise a Python error and which kill the process.

Each case calls the raw binding (``ext.verify_attention``, past kdtree_kernel.ops's own checks) in a fresh
interpreter with faulthandler on, and reports its exit status and last stderr line. Usage (GPU machine, extension
built): python3 kernel/bench/probe_binding_checks.py [--out FILE.json]"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CASES = {
    "ok": "",
    "workspace_too_small": "ws = ws[: need - 1024]",
    "workspace_missing": "ws = None",
    "workspace_misaligned": "ws = torch.empty(need + 64, dtype=torch.uint8, device='cuda')[8:]",
    "q_on_cpu": "q = q.cpu()",
    "out_wrong_dtype": "out = out.float()",
    # the same integer formatting in other checks: q_len out of range, and a token count that does not match
    "q_len_out_of_range": "Q_LEN = 4096",
    "tokens_mismatch": "Q_LEN = 8",
    "sm_scale_negative": "SM_SCALE = -1.0",
}

CHILD = """
import faulthandler, sys, torch
faulthandler.enable()
from kdtree_kernel.extension import load_extension
from kdtree_kernel.ops import launch_plan
from kdtree_kernel.testing import make_case
ext = load_extension()
case = make_case(1, 8192, 9, 8)
plan = launch_plan(1, 9, 8, 8192, torch.device('cuda'))
need = plan.workspace_bytes
assert plan.splits > 1 and need > 0, plan
q = case.q
out = torch.empty(q.shape[0], 8, 512, dtype=q.dtype, device='cuda')
ws = torch.empty(need, dtype=torch.uint8, device='cuda')
Q_LEN = 9
SM_SCALE = 0.1
{mutation}
try:
    ext.verify_attention(q, case.kv_buffer, case.kv_indptr, case.kv_indices, case.qo_indptr, case.draft_mask, out,
                         None, ws, SM_SCALE, Q_LEN, plan.row_groups, plan.row_blocks, plan.splits, plan.chunk_keys,
                         plan.split_schedulers, 1.0, 1.0)
    torch.cuda.synchronize()
    print("RESULT returned")
except Exception as exc:
    print("RESULT raised", type(exc).__name__, str(exc).splitlines()[0][:200])
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = {}
    for name, mutation in CASES.items():
        proc = subprocess.run([sys.executable, "-c", CHILD.format(mutation=mutation)], capture_output=True, text=True)
        result = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT")), "no result")
        err = proc.stderr.strip().splitlines()
        results[name] = {"rc": proc.returncode, "result": result, "stderr_tail": err[-6:]}
        print(f"{name}: rc={proc.returncode} {result}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
