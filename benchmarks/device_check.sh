#!/usr/bin/env bash
# One call on the GPU machine: build for sm_90, run the tests (CUDA included), optional
# extra commands. Usage (through the device tool): bash benchmarks/device_check.sh [pytest args]
set -uo pipefail
export PULSAR_CUDA_ARCHITECTURES=${PULSAR_CUDA_ARCHITECTURES:-90}
export PYTHONUNBUFFERED=1
start=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -q . 2>&1 | tail -5 || exit 1
echo "build: $(( $(date +%s) - start )) s"
(cd /tmp && python3 -c "import pulsar_py, torch; print(pulsar_py.build_info(), torch.cuda.get_device_name())")
cd tests && python3 -m pytest -q -x -p no:cacheprovider "$@" 2>&1 | tail -30
