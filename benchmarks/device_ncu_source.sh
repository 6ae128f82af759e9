#!/usr/bin/env bash
# Nsight Compute's per-instruction counters (executed instructions, stall samples) of the
# render kernels, exported per source line, on the GPU machine: which lines of the
# forward and backward cost the issue slots. Writes $OUT/src_<W>_<kernel>_<view>.csv for
# each workload in $NCU_WORKLOADS (default W1); benchmarks/source_lines.py sums them.
# Usage (through the device tool): bash benchmarks/device_ncu_source.sh
set -uo pipefail
export PULSAR_CUDA_ARCHITECTURES=${PULSAR_CUDA_ARCHITECTURES:-90}
out=${OUT:-/tmp/pulsar_out}
mkdir -p "$out"
[ -n "${SKIP_BUILD:-}" ] || python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -3
cd benchmarks
for w in ${NCU_WORKLOADS:-W1}; do
  rep="/tmp/src_$w"
  ncu --clock-control none --kernel-name regex:render_ --launch-count 2 --import-source yes \
      --section SourceCounters --section SpeedOfLight --section InstructionStats --section WarpStateStats \
      -o "$rep" -f python3 ncu_step.py "$w" > "$out/ncu_src_$w.log" 2>&1
  ncu --import "$rep.ncu-rep" --page details > "$out/details_$w.txt" 2>&1
  for k in forward backward; do
    for view in cuda sass; do
      ncu --import "$rep.ncu-rep" --kernel-name "regex:render_${k}" --page source --csv \
          --print-source "$view" > "$out/src_${w}_${k}_${view}.csv" 2> "$out/src_${w}_${k}_${view}.err"
    done
  done
  ls -la "$out" | head -30
done
