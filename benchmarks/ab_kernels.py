"""A/B of builds on the GPU machine: CUPTI kernel times (torch.profiler) of one forward +
backward of each workload, for two or more copies of the package (each a folder holding
pulsar_py with its built _native module), alternating between them so that all see the
same machine. Usage: python3 benchmarks/ab_kernels.py A_DIR B_DIR [C_DIR ...] -- W4 W5 ...

Each (build, workload) runs in a fresh interpreter (the packages share a name).
"""
import subprocess
import sys

from ab_builds import builds_and_rest

CHILD = r'''
import sys, torch
sys.path.insert(0, sys.argv[1])
sys.path.insert(1, sys.argv[3])
from torch.profiler import ProfilerActivity, profile
from profile_kernels import workload_step
r, step = workload_step(sys.argv[2])
for _ in range(5):
    step()
torch.cuda.synchronize()
reps = 10
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(reps):
        step()
    torch.cuda.synchronize()
totals = {}
for e in prof.key_averages():
    t = getattr(e, "self_device_time_total", None)
    t = getattr(e, "self_cuda_time_total", 0) if t is None else t
    key = e.key.lower()
    # Device work only: kernels and memsets (the Python-level ops report their kernels' time too).
    if t > 0 and ("kernel" in key or "memset (device)" in key) and not key.startswith("cuda"):
        totals[e.key] = t / reps / 1000.0
for k, v in totals.items():
    print(f"{v:.4f}\t{k}")
'''


def run(pkg: str, workload: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, pkg, workload, sys.path[0]], capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr[-2000:])
        return {}
    times = {}
    for line in out.stdout.splitlines():
        ms, name = line.split("\t", 1)
        times[name] = float(ms)
    return times


def short(name: str) -> str:
    for key in ("render_backward", "render_forward", "setup_spheres", "reduce_sphere_rows", "sum_rank_rows", "duplicate", "count_kernel",
                "item_slots", "cover_kernel", "maps_kernel", "ranges_kernel", "radix_sort", "DeviceScan", "Memset",
                "tile_bound", "reduce_camera", "camera_"):
        if key in name:
            return key
    return name[:24]


def main():
    packages, labels, workloads = builds_and_rest(sys.argv[1:])
    workloads = workloads or ["W4"]
    for w in workloads:
        merged = {}
        for _ in range(2):
            for label, pkg in zip(labels, packages):
                per_kind = {}  # kernels of one kind (e.g. a sort's passes) summed within the run
                for name, ms in run(pkg, w).items():
                    per_kind[short(name)] = per_kind.get(short(name), 0.0) + ms
                for kind, ms in per_kind.items():
                    merged.setdefault(kind, {}).setdefault(label, []).append(ms)
        print(f"{w}: kernel ms per forward + backward ({' / '.join(labels)}, two runs each)")
        totals = dict.fromkeys(labels, 0.0)
        for name, d in sorted(merged.items(), key=lambda kv: -max(sum(kv[1].values(), []))):
            means = []
            for label in labels:
                runs = d.get(label, [0.0])
                means.append(sum(runs) / len(runs))
                totals[label] += means[-1]
            print(f"  {name:22s} " + " ".join(f"{m:7.3f}" for m in means))
        print(f"  {'sum':22s} " + " ".join(f"{totals[label]:7.3f}" for label in labels))


if __name__ == "__main__":
    main()
