#!/usr/bin/env bash
# One GPU-machine session: unpack the sglang wheel, build the extension for the GPU it finds (sm_90 on the H200),
# run the GPU tests and the benchmark. Usage (repo root): bash kernel/bench/run_device.sh [build] [kernel-tests] [bench] [all-tests] [sglang-kit] ...
# Logs land in $OUT (or /tmp/kdtree-out); the bench stage's results in kernel/bench/results/<tag>/ (and $OUT).
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
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 10
else
  echo "no wheels under .whl/: the stages that need SGLang (bench's baseline, sglang-kit) cannot run; the rest can"
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
# The compute capability to build for and the tag of the results folder (kernel/bench/gpu_tag.py: 9.0 h200 on the
# H200, 12.0 rtxpro6000 on the RTX PRO 6000); KDTREE_ARCH and KDTREE_GPU_TAG override them.
# gpu_tag.py prints both words or nothing (its message on stderr), and then read fails.
read -r ARCH TAG < <(python3 kernel/bench/gpu_tag.py "$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader | head -1)") || exit 16
ARCH=${KDTREE_ARCH:-$ARCH}
TAG=${KDTREE_GPU_TAG:-$TAG}
RESULTS="kernel/bench/results/$TAG"  # gpu_tag.results_dir
PATCHES=kernel/bench/patches
echo "building for compute capability $ARCH, results in $RESULTS" | tee -a "$OUT/gpu.txt"

for stage in $stages; do
  stamp "$stage"
  case $stage in
    build)
      python3 deploy/build_extension.py --arch "$ARCH" --out kernel/build --log "$OUT/build.log" --timeout 420 --jobs 16 || { tail -50 "$OUT/build.log"; exit 11; }
      grep -E "Used|spill" "$OUT/build.log" | sort | uniq -c | head -20 ;;
    kernel-tests)
      timeout 300 python3 -m pytest -m gpu tests/kernel -q -x --noconftest -p no:cacheprovider --timeout 120 2>&1 | tee "$OUT/kernel-tests.log" | tail -15
      [ "${PIPESTATUS[0]}" = 0 ] || exit 13 ;;
    bench)
      python3 kernel/bench/bench_verify.py --sglang-site /tmp/site --out "$RESULTS/results.json" 2> "$OUT/bench.log"
      cp "$RESULTS/results.json" "$RESULTS/results.md" "$RESULTS/results.extra.json" "$OUT/" ;;
    probe)
      python3 kernel/bench/probe_memory.py 2>&1 | tee "$OUT/probe.log" ;;
    splits)
      # SPLIT_CASES: the cases to sweep (BSxPREFIXxQLENxHEADS, comma-separated) instead of probe_splits.CASES.
      python3 kernel/bench/probe_splits.py --cases "${SPLIT_CASES:-}" --out "$OUT/splits.jsonl" > "$OUT/splits.log" 2>&1; tail -3 "$OUT/splits.log" ;;
    steps)
      python3 kernel/bench/probe_steps.py --out "$OUT/steps.jsonl" 2>&1 | tail -12 ;;
    trace)
      # Per-warp clock trace of one block's steps: kernel/csrc with patches/trace-kernel.diff applied, built aside.
      rm -rf /tmp/trace-src && cp -r kernel/csrc /tmp/trace-src && patch -s -d /tmp/trace-src -p1 < "$PATCHES/trace-kernel.diff" || exit 14
      python3 deploy/build_extension.py --arch "$ARCH" --source-dir /tmp/trace-src --out /tmp/trace-build --log "$OUT/build-trace.log" --timeout 420 --jobs 16 || exit 14
      # TRACE_CASES: space-separated BSxPREFIXxQLENxHEADS, each planned with one KV chunk per request (default 64x8192x9x8).
      for c in ${TRACE_CASES:-64x8192x9x8}; do
        KDTREE_EXT_DIR=/tmp/trace-build python3 kernel/bench/trace_steps.py --case "$c" --out "$OUT/trace-$c.json"
      done ;;
    phases)
      # Phase timeline of bs 1 calls (globaltimer per block event): kernel/csrc with patches/phases-kernel.diff, built aside.
      rm -rf /tmp/phase-src && cp -r kernel/csrc /tmp/phase-src && patch -s -d /tmp/phase-src -p1 < "$PATCHES/phases-kernel.diff" || exit 14
      python3 deploy/build_extension.py --arch "$ARCH" --source-dir /tmp/phase-src --out /tmp/phase-build --log "$OUT/build-phases.log" --timeout 420 --jobs 16 || { tail -30 "$OUT/build-phases.log"; exit 14; }
      KDTREE_EXT_DIR=/tmp/phase-build python3 kernel/bench/trace_phases.py --out "$OUT/phases.json" 2>&1 | tee "$OUT/phases.log" ;;
    row-groups)
      # Small batches with blocks of 16, 32 and 48 rows at chunk sizes around each one's plan (SPLIT_CASES: other cases).
      python3 kernel/bench/probe_splits.py --row-groups --cases "${SPLIT_CASES:-}" --out "$OUT/row-groups.jsonl" > "$OUT/row-groups.log" 2>&1; tail -3 "$OUT/row-groups.log" ;;
    partial-bytes)
      # Plans that the cost model's count of partial bytes (fp32 before, bf16 now) changes, timed both ways.
      python3 kernel/bench/probe_splits.py --partial-bytes --out "$OUT/partial-bytes.jsonl" > "$OUT/partial-bytes.log" 2>&1; tail -3 "$OUT/partial-bytes.log" ;;
    kernel-times)
      python3 kernel/bench/probe_splits.py --kernel-times --out "$OUT/kernel-times.jsonl" 2>&1 | tail -6 ;;
    speed-ab)
      # The pre-restart speed check's host program and judge on two builds: base, and a copy ~3% slower (issue 48).
      # SPEED_AB_ARGS: more of speed_ab.py's options (--slow, --max-slowdown, --samples ...).
      python3 kernel/bench/speed_ab.py --out "$RESULTS" ${SPEED_AB_ARGS:-} 2> "$OUT/speed-ab.log"; rc=$?
      cp "$RESULTS/speed-ab.json" "$RESULTS/speed-ab.md" "$OUT/" 2>/dev/null; tail -5 "$OUT/speed-ab.log"
      [ "$rc" = 0 ] || exit 17 ;;
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
    profile-source)
      # Per-SASS-instruction stall samples of the bs 64 x 8192 q 9 case (where the warps wait, by instruction).
      ncu --clock-control none -k regex:verify_attention_kernel -s 1 -c 1 --import-source no --set full \
        -o /tmp/ncu-source python3 kernel/bench/profile_case.py --bs 64 --prefix 8192 --q-len 9 > "$OUT/ncu-source.log" 2>&1
      ncu -i /tmp/ncu-source.ncu-rep --page source --csv --print-source sass > "$OUT/ncu-sass.csv" 2>&1
      ncu -i /tmp/ncu-source.ncu-rep --page details > "$OUT/ncu-details.txt" 2>&1
      head -3 "$OUT/ncu-sass.csv"; wc -l "$OUT/ncu-sass.csv"; grep -E "Duration|SM Frequency|Issue Slots|Eligible" "$OUT/ncu-details.txt" ;;
    ab)
      # Kernel-only A/B: every source tree under .ab/ (saved kernel/csrc copies) against the working tree,
      # built side by side, then timed alternately (two rounds) by ab_kernel.py.
      # The case lists first: a bad item stops here, not after the builds.
      python3 kernel/bench/ab_kernel.py --check-args --cases "${AB_CASES:-}" --shapes "${AB_SHAPES:-}" || exit 15
      pids=()
      # The build stage may have made it already; a build older than any source (kept from an earlier call on a
      # warm machine) is stale and is rebuilt.
      so=$(ls kernel/build/*.so 2> /dev/null | head -1)
      if [ -z "$so" ] || [ -n "$(find kernel/csrc -newer "$so" -print -quit)" ]; then
        python3 deploy/build_extension.py --arch "$ARCH" --out kernel/build --log /tmp/build-new.log --timeout 420 --jobs 4 &
        pids+=($!)
      fi
      for d in .ab/*/; do
        [ -d "$d" ] || continue  # no saved variants: the working tree alone (with AB_ENVS)
        python3 deploy/build_extension.py --arch "$ARCH" --source-dir "$d" --out "${d}build" --log "/tmp/build-$(basename "$d").log" --timeout 420 --jobs 4 &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid" || { tail -30 /tmp/build-*.log; exit 12; }; done
      grep -H -E "spill" /tmp/build-*.log | sort | uniq -c | head -20
      stamp "ab built"
      # AB_CASES: indices into bench_verify.TREE_CASES; AB_SHAPES: more cases (BSxPREFIXxQLENxHEADS[:fp8]);
      # AB_ENVS: space-separated VAR=value settings, each timing the working tree's build once more under it
      # (label new+VAR=value); AB_INTERLEAVE=1: also time every build with a foreign kernel before each call;
      # AB_ROUNDS=1: the checked round only.
      rounds=("" --no-check)
      [ "${AB_ROUNDS:-2}" = 1 ] && rounds=("")
      modes=("")
      [ "${AB_INTERLEAVE:-0}" = 1 ] && modes+=(--interleave)
      for check in "${rounds[@]}"; do
        for mode in "${modes[@]}"; do
          for d in kernel/build .ab/*/build; do
            [ -d "$d" ] || continue
            label=$( [ "$d" = kernel/build ] && echo new || basename "$(dirname "$d")" )
            KDTREE_EXT_DIR="$PWD/$d" timeout 300 python3 kernel/bench/ab_kernel.py --label "$label" --out "$OUT/ab.jsonl" --cases "${AB_CASES:-}" --shapes "${AB_SHAPES:-}" $check $mode > /dev/null 2>> "$OUT/ab.log" || tail -20 "$OUT/ab.log"
            [ "$d" = kernel/build ] || continue
            for setting in ${AB_ENVS:-}; do
              env "$setting" KDTREE_EXT_DIR="$PWD/$d" timeout 300 python3 kernel/bench/ab_kernel.py --label "new+$setting" --out "$OUT/ab.jsonl" --cases "${AB_CASES:-}" --shapes "${AB_SHAPES:-}" $check $mode > /dev/null 2>> "$OUT/ab.log" || tail -20 "$OUT/ab.log"
            done
          done
        done
      done
      python3 kernel/bench/ab_kernel.py --summarize "$OUT/ab.jsonl" | tee "$OUT/ab.md"
      ;;
    sglang-kit)
      # SGLang 0.5.23's own MLA target-verify kit with backend kdtree, eager and through its CUDA-graph runner, and
      # the classic bug fed through it (tests/backend/test_sglang_kit_gpu.py). Needs the build stage's extension
      # and .whl/ (the sglang wheel and the kit's light wheels: README.md). Per-case results, written case by case:
      # $OUT/sglang-kit.jsonl (kdtree and triton) and $OUT/sglang-kit-bug.jsonl (the classic bug).
      rm -f "$OUT"/sglang-kit*.jsonl
      KDTREE_KIT_RESULTS="$OUT" timeout "${KIT_TIMEOUT:-570}" python3 -m pytest -m gpu tests/backend/test_sglang_kit_gpu.py \
        -v -rA --noconftest -p no:cacheprovider --timeout 560 2>&1 | tee "$OUT/sglang-kit.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|stubs installed|Error" | tail -80
      status=${PIPESTATUS[0]}
      [ -s "$OUT/sglang-kit.jsonl" ] && python3 tests/backend/sglang_kit.py --summarize "$OUT"/sglang-kit.jsonl \
        $( [ -s "$OUT/sglang-kit-bug.jsonl" ] && echo "$OUT/sglang-kit-bug.jsonl" ) > "$OUT/sglang-kit.md"
      [ "$status" = 0 ] || exit 17 ;;
    all-tests)
      python3 -m pytest -m gpu tests/ -v -rs --timeout 300 2>&1 | tee "$OUT/gpu-tests-$TAG.log" | tail -25 ;;
  esac
done
# The device tool brings back at most 8 files from $OUT: past that, the logs travel packed in one archive, so that the
# results (results.*, ab.*) are never the files left behind.
if [ "$(find "$OUT" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  (cd "$OUT" && tar czf logs.tar.gz ./*.log && rm -f ./*.log)
fi
stamp done
