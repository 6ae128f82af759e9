#!/usr/bin/env bash
# Nsight Compute on the render kernels, plus their SASS, on the GPU machine. Writes
# $OUT/ncu_<W>.txt per workload in $NCU_WORKLOADS (default W4) and $OUT/sass_<kernel>.txt.
# Usage (through the device tool): bash benchmarks/device_ncu.sh
set -uo pipefail
export PULSAR_CUDA_ARCHITECTURES=${PULSAR_CUDA_ARCHITECTURES:-90}
out=${OUT:-/tmp/pulsar_out}
mkdir -p "$out"
python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -3
so=$(python3 -c "import pulsar_py._native as m; print(m.__file__)" 2>/dev/null || find / -name "_native*.so" -path "*pulsar_py*" 2>/dev/null | head -1)
for k in render_forward_kernelIfLi3ELb0ELb0 render_backward_kernelIfLi3ELb0ELb1; do
  name=$(cuobjdump -symbols "$so" 2>/dev/null | grep -o "_Z[A-Za-z0-9_]*${k}[A-Za-z0-9_]*" | head -1)
  cuobjdump -sass -fun "$name" "$so" > "$out/sass_${k%%I*}.txt" 2>&1
done
cd benchmarks
for w in ${NCU_WORKLOADS:-W4}; do
  ncu --clock-control none --kernel-name regex:render_ --launch-count 2 \
      --section SpeedOfLight --section WarpStateStats --section InstructionStats \
      --section Occupancy --section SchedulerStats --section LaunchStats \
      python3 ncu_step.py "$w" > "$out/ncu_$w.txt" 2>&1
  grep -E "render_|Duration|Issued Ipc|Issue Slots Busy|Active Warps|No Eligible|Executed Instructions  |Registers|Achieved Occ|Avg. Active Threads|Avg. Not Predicated" "$out/ncu_$w.txt" | head -60
done
