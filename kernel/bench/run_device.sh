#!/usr/bin/env bash
# One GPU-machine session: unpack the sglang wheel, build the extension for sm_90, run the GPU tests and the
# benchmark. Usage (repo root): bash kernel/bench/run_device.sh [build] [kernel-tests] [bench] [all-tests]
# Logs land in $OUT (or /tmp/kdtree-out).
set -uo pipefail
OUT=${OUT:-/tmp/kdtree-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export KDTREE_EXT_DIR="$PWD/kernel/build"
export PYTHONPATH="$PWD/kernel:$PWD/backend:$PWD:/tmp/site"
stages=${*:-build kernel-tests bench all-tests}
t0=$(date +%s)
stamp() { echo "== $1 at +$(( $(date +%s) - t0 )) s"; }

stamp wheel
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 10
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"

for stage in $stages; do
  stamp "$stage"
  case $stage in
    build)
      python3 deploy/build_extension.py --arch 9.0 --out kernel/build --log "$OUT/build.log" --timeout 420 --jobs 16 || { tail -50 "$OUT/build.log"; exit 11; }
      grep -E "Used|spill" "$OUT/build.log" | sort | uniq -c | head -20 ;;
    kernel-tests)
      python3 -m pytest -m gpu tests/kernel -q -x --noconftest -p no:cacheprovider --timeout 300 2>&1 | tee "$OUT/kernel-tests.log" | tail -15 ;;
    bench)
      python3 kernel/bench/bench_verify.py --sglang-site /tmp/site --out kernel/bench/results-h200.json 2> "$OUT/bench.log"
      cp kernel/bench/results-h200.json kernel/bench/results-h200.md kernel/bench/results-h200.extra.json "$OUT/" ;;
    probe)
      python3 kernel/bench/probe_memory.py 2>&1 | tee "$OUT/probe.log" ;;
    quick-bench)
      python3 kernel/bench/bench_verify.py --quick --sglang-site /tmp/site --out "$OUT/quick.json" 2> "$OUT/bench.log"; tail -5 "$OUT/bench.log" ;;
    profile)
      for shape in "64 8192 9" "64 8192 1"; do
        set -- $shape
        ncu --clock-control none -k regex:verify_attention_kernel -s 1 -c 1 --import-source no \
          --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters \
          --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
          python3 kernel/bench/profile_case.py --bs $1 --prefix $2 --q-len $3 > "$OUT/ncu-bs$1-q$3.txt" 2>&1
        grep -E "Duration|issue_stalled|Throughput" "$OUT/ncu-bs$1-q$3.txt" | sort -k3 -n -r | head -40
      done ;;
    all-tests)
      python3 -m pytest -m gpu tests/ -v --timeout 300 2>&1 | tee "$OUT/gpu-tests-h200.log" | tail -25 ;;
  esac
done
stamp done
