#!/usr/bin/env bash
# Nsight Compute's per-instruction counters (executed instructions, active lanes, stall
# samples) of the render kernels, on the GPU machine: which instructions of the forward
# and backward take the issue slots. For each workload in $NCU_WORKLOADS (default W1),
# exports the SASS view of each render kernel as CSV and packs them, with the details
# page, into $OUT/source_<W>.tgz (one file: the device tool brings back few files).
# benchmarks/sass_hotspots.py prints the hot instructions of one CSV.
# Usage (through the device tool): bash benchmarks/device_ncu_source.sh  (SKIP_BUILD=1: no build)
set -uo pipefail
export PULSAR_CUDA_ARCHITECTURES=${PULSAR_CUDA_ARCHITECTURES:-90}
out=${OUT:-/tmp/pulsar_out}
mkdir -p "$out"
[ -n "${SKIP_BUILD:-}" ] || python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -3
cd benchmarks
for w in ${NCU_WORKLOADS:-W1}; do
  work=$(mktemp -d)
  ncu --clock-control none --kernel-name regex:render_ --launch-count 2 --import-source yes \
      --section SourceCounters --section SpeedOfLight --section InstructionStats --section WarpStateStats \
      -o "$work/report" -f python3 ncu_step.py "$w" > "$work/ncu.log" 2>&1
  ncu --import "$work/report.ncu-rep" --page details > "$work/details_$w.txt" 2>&1
  for k in forward backward; do
    ncu --import "$work/report.ncu-rep" --kernel-name "regex:render_${k}" --page source --csv \
        --print-source sass > "$work/sass_${w}_${k}.csv" 2>> "$work/ncu.log"
  done
  tar czf "$out/source_$w.tgz" -C "$work" .
  grep -E "render_|Duration|Executed Instructions  |Avg. Active Threads" "$work/details_$w.txt"
  rm -rf "$work"
done
