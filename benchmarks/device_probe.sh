#!/usr/bin/env bash
# A first look on the GPU machine, in one call: build for sm_90, the CUDA parity tests,
# the benchmark W1-W6 (20 timed runs), CUPTI kernel times of W4 and W5, W5 under one
# and under the default number of backward windows, and Nsight Compute's warp states of
# the W5 render kernels. Writes its logs to $OUT. Usage: bash benchmarks/device_probe.sh
set -uo pipefail
export PULSAR_CUDA_ARCHITECTURES=${PULSAR_CUDA_ARCHITECTURES:-90}
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/pulsar_out}
mkdir -p "$out"
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -3
echo "build: $(( $(date +%s) - start )) s"
(cd tests && python3 -m pytest -q -x -p no:cacheprovider ${TESTS:-test_cuda_parity.py} 2>&1 | tail -5)
python3 benchmarks/run.py --device cuda --json "$out/bench.json" --quiet ${BENCH_ARGS:-} 2>&1 | tail -10
cd benchmarks
for w in ${PROFILE:-W4 W5}; do python3 profile_kernels.py "$w" 2>&1 | grep -v "^-" | head -32 > "$out/profile_$w.txt"; done
grep -h "wall" "$out"/profile_*.txt
python3 window_budget.py W5 0 268435456 2>&1 | tail -2
for w in ${NCU_WORKLOADS:-W5}; do
  ncu --clock-control none --kernel-name regex:render_ --launch-count 2 \
      --section SpeedOfLight --section WarpStateStats --section InstructionStats \
      --section Occupancy --section SchedulerStats --section LaunchStats \
      python3 ncu_step.py "$w" > "$out/ncu_$w.txt" 2>&1
  grep -E "render_|Duration|Issue Slots Busy|No Eligible|Achieved Occ|Avg. Active Threads|Stall" "$out/ncu_$w.txt" | head -40
done
echo "total: $(( $(date +%s) - start )) s"
