#!/usr/bin/env bash
# The whole check on the GPU machine, in one call: build for sm_90, the full test suite
# (CUDA included), the demo and selftest on CUDA, compute-sanitizer memcheck and racecheck
# on a small forward + backward, the benchmark W1-W6, and the backward-routing figure.
set -uo pipefail
export PULSAR_CUDA_ARCHITECTURES=${PULSAR_CUDA_ARCHITECTURES:-90}
export PYTHONUNBUFFERED=1
root=$(pwd)
out=${OUT:-/tmp/pulsar_out}
mkdir -p "$out"
python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -3
echo "== tests"; (cd tests && python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -15) > "$out/tests.txt"; tail -4 "$out/tests.txt"
echo "== demo (cuda)"; (cd /tmp && python3 -m pulsar_py demo --device cuda --out "$out/demo" 2>&1 | tail -4; cat "$out/demo/summary.json")
echo; echo "== selftest"; (cd /tmp && python3 -m pulsar_py selftest 2>&1 | tail -6)
echo "== sanitizer"; (cd /tmp && compute-sanitizer --tool memcheck python3 "$root/benchmarks/sanitizer_small.py" 2>&1 | tail -2;
  compute-sanitizer --tool racecheck python3 "$root/benchmarks/sanitizer_small.py" 2>&1 | tail -2)
echo "== backward routing"; python3 benchmarks/backward_routing.py --device cuda --repeats 20
echo "== bench"; python3 benchmarks/run.py --device cuda --json "$out/bench.json" --quiet ${BENCH_ARGS:-} 2>&1 | tail -12
echo "== profile W4"; python3 benchmarks/profile_kernels.py W4 2>&1 | grep -v "^-" | head -30 > "$out/profile_W4.txt"; grep wall "$out/profile_W4.txt"
