#!/usr/bin/env bash
# The GPU check of a checkout, run by hand from the repository root on a machine with an
# NVIDIA GPU, the CUDA toolkit (nvcc, compute-sanitizer) and torch with CUDA installed:
#
#     bash benchmarks/gpu_check.sh [LOG_DIR]      (default: $OUT, else ./gpu_check_logs)
#
# Steps, each logging to LOG_DIR/<step>.txt (the last lines are echoed):
#   build       pip install --no-build-isolation --no-deps . for one GPU architecture,
#               PULSAR_CUDA_ARCHITECTURES (default 90, the H100); SKIP_BUILD=1 keeps the
#               installed package
#   info        the installed package must carry the CUDA backend
#   tests       the full test suite, CUDA tests included (PYTEST_ARGS adds arguments)
#   selftest    pulsar-py selftest (stored reference images and gradients, every backend)
#   memcheck    compute-sanitizer memcheck on a small forward+backward (LOG_DIR/small_scene.py)
#               and on one forward+backward of W3 (harness.py --step W3)
#   racecheck   compute-sanitizer racecheck on the same two
#   chord_sqrt  benchmarks/check_chord_sqrt.cu, built with the render kernels' flags
#   bench       the benchmark driver on W1-W6, JSON in LOG_DIR/bench.json (BENCH_ARGS adds
#               options, e.g. BENCH_ARGS="--repeats 40")
# STEPS="tests bench" runs only the steps named (default: all, in the order above).
# Everything that imports pulsar_py runs outside the checkout's root, so that the installed
# package, not the source folder, is the one tested. Prints a summary line per step; the
# exit status is 1 when any step failed.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
logs=${1:-${OUT:-$root/gpu_check_logs}}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)
python=${PYTHON:-python3}
export PULSAR_CUDA_ARCHITECTURES=${PULSAR_CUDA_ARCHITECTURES:-90}
export PYTHONUNBUFFERED=1
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
summary=()
failed=0
all_steps="build info tests selftest memcheck racecheck chord_sqrt bench"

step() {  # step NAME COMMAND...: run COMMAND, log it, record its status and time
  local name=$1 start rc
  shift
  case " ${STEPS:-$all_steps} " in *" $name "*) ;; *) return 0 ;; esac
  echo "== $name"
  start=$(date +%s)
  "$@" > "$logs/$name.txt" 2>&1
  rc=$?
  tail -n "${TAIL:-5}" "$logs/$name.txt"
  summary+=("$(printf '%-10s %-9s %5d s' "$name" "$([ $rc -eq 0 ] && echo pass || echo "FAIL ($rc)")" \
                                       $(( $(date +%s) - start )))")
  [ $rc -eq 0 ] || failed=1
}

build() {
  if [ -n "${SKIP_BUILD:-}" ]; then echo "SKIP_BUILD set: the installed package is kept"; return 0; fi
  (cd "$root" && "$python" -m pip install --no-build-isolation --no-deps -v .)
}

info() {
  (cd "$scratch" && "$python" - <<'EOF'
import torch, pulsar_py
info = pulsar_py.build_info()
print(pulsar_py.__file__, info, torch.__version__, torch.cuda.get_device_name())
raise SystemExit(0 if "cuda" in info["backends"] and torch.cuda.is_available() else 1)
EOF
  )
}

tests() {
  # From tests/: the folder Python puts first on its path holds no pulsar_py.
  (cd "$root/tests" && "$python" -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-})
}

selftest() {
  (cd "$scratch" && "$python" -m pulsar_py selftest)
}

small_scene() {
  # A small forward+backward on CUDA: every output and gradient, float32 and float64,
  # unbatched and batched, 5 and 3 channels, large spheres, and (when the renderer has the
  # setting) a backward split into many row windows.
  cat > "$logs/small_scene.py" <<'EOF'
import torch

from pulsar_py import Renderer

g = torch.Generator().manual_seed(0)
for dtype in (torch.float32, torch.float64):
    for batch in (None, 2):
        shape = (batch, 80) if batch else (80,)
        like = dict(generator=g, dtype=dtype)
        pos = torch.rand(shape + (3,), **like) * torch.tensor([4.0, 3.0, 4.0], dtype=dtype) \
            + torch.tensor([-2.0, -1.5, 10.0], dtype=dtype)
        col = torch.rand(shape + (5,), **like)
        rad = 0.1 + 0.4 * torch.rand(shape, **like)
        opa = 0.2 + 0.8 * torch.rand(shape, **like)
        cam = torch.tensor([0.0, 0.0, 0.0, 0.01, -0.02, 0.0, 4.0, 2.0], dtype=dtype)
        pos, col, rad, opa, cam = (t.cuda().requires_grad_() for t in (pos, col, rad, opa, cam))
        r5 = Renderer(40, 30, n_channels=5, n_track=3).cuda()
        img, info = r5(pos, col, rad, cam, 0.2, 20.0, opacity=opa, return_forward_info=True)
        torch.autograd.grad(img.sum(), [pos, col, rad, opa, cam])
        col3 = col[..., :3].contiguous()
        r3 = Renderer(40, 30, n_channels=3).cuda()
        for scale in (1.0, 5.0):  # boxes of a few pixels, then spheres spanning whole tiles
            img = r3(pos, col3, rad * scale, cam, 0.2, 20.0)
            torch.autograd.grad(img.sum(), [pos, col, rad, cam])
        rw = Renderer(40, 30, n_channels=3).cuda()
        if hasattr(rw, "_backward_row_budget"):
            rw._backward_row_budget = 5 * 8 * col.element_size()  # five rows per window
        img = rw(pos, col3, rad * 2, cam, 0.2, 20.0, opacity=opa)
        torch.autograd.grad(img.sum(), [pos, col, rad, opa, cam])
torch.cuda.synchronize()
print("small scene done")
EOF
}

sanitizer() {  # sanitizer TOOL: the small scene, then one forward+backward of W3
  (cd "$scratch" && compute-sanitizer --tool "$1" --error-exitcode 1 "$python" "$logs/small_scene.py") &&
    (cd "$scratch" && compute-sanitizer --tool "$1" --error-exitcode 1 "$python" "$root/benchmarks/profile/harness.py" \
      --step W3)
}

chord_sqrt() {
  local nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  "$nvcc" -std=c++17 -arch="sm_${PULSAR_CUDA_ARCHITECTURES%%[;,]*}" --fmad=true -prec-div=false \
      -prec-sqrt=false -ftz=true --expt-relaxed-constexpr -I"$root/include" \
      "$root/benchmarks/check_chord_sqrt.cu" -o "$scratch/check_chord_sqrt" && "$scratch/check_chord_sqrt"
}

bench() {
  (cd "$root" && "$python" benchmarks/run.py --device cuda --quiet --json "$logs/bench.json" ${BENCH_ARGS:-})
}

step build build
step info info
step tests tests
step selftest selftest
small_scene
step memcheck sanitizer memcheck
step racecheck sanitizer racecheck
step chord_sqrt chord_sqrt
TAIL=12 step bench bench

echo "== summary (logs in $logs)"
printf '%s\n' "${summary[@]}" | tee "$logs/summary.txt"
exit $failed
