#!/usr/bin/env bash
# One development iteration on the GPU machine: build for sm_90, the CUDA parity and
# golden tests, the benchmark (workloads in $WORKLOADS, default all) and kernel profiles
# of the workloads in $PROFILE (default W4). Usage: bash benchmarks/device_iter.sh
set -uo pipefail
export PULSAR_CUDA_ARCHITECTURES=${PULSAR_CUDA_ARCHITECTURES:-90}
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/pulsar_out}
mkdir -p "$out"
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -3
echo "build: $(( $(date +%s) - start )) s"
# TESTS: pytest arguments (default: the CUDA parity and golden tests; "." for all).
(cd tests && python3 -m pytest -q -p no:cacheprovider ${TESTS:-test_cuda_parity.py test_golden.py} 2>&1 | tail -15) > "$out/tests.txt"
cat "$out/tests.txt"
python3 benchmarks/run.py --device cuda --json "$out/bench.json" --quiet --repeats 40 ${WORKLOADS:+--workloads $WORKLOADS} 2>&1 | tail -12
for w in ${PROFILE:-W4}; do python3 benchmarks/profile_kernels.py "$w" 2>&1 | grep -v "^-" | head -45 > "$out/profile_$w.txt"; done
grep -h "wall" "$out"/profile_*.txt
