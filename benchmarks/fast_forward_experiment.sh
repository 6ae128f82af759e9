#!/usr/bin/env bash
# Experiment: how much does the exact (no-FMA, IEEE div/sqrt) forward cost? Rebuilds
# with the forward compiled like the backward and times W4 with profile_kernels.py.
set -uo pipefail
sed -i 's|PROPERTIES COMPILE_OPTIONS "--fmad=false")|PROPERTIES COMPILE_OPTIONS "--fmad=true;-prec-div=false;-prec-sqrt=false")|' CMakeLists.txt
PULSAR_CUDA_ARCHITECTURES=90 python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -3
python3 benchmarks/profile_kernels.py W4 2>&1 | grep -E "wall|render_"  | cut -c1-60,100-200
git checkout CMakeLists.txt 2>/dev/null || true
