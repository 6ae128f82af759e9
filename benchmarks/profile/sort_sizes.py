#!/usr/bin/env python3
"""Device time of a forward's instance sort as a scene grows: W4's spheres (radius scale
0.038, offset 0.5, opacity) on W4's 1024x1024 image (4096 tiles), fewer of them.

    python benchmarks/profile/sort_sizes.py [--build DIR] [--spheres 60000,150000,300000,500000]

Per scene: the binned instances, the sum of a forward's kernel times (CUPTI through
torch.profiler, device activities only), and the part of it in the instance sort and
the scans (the radix sort, ranges_kernel, maps_kernel, the counting sort's kernels, CUB's
scans and memsets). Which sort a scene takes follows the build's bound on the counting
sort (native/cuda/cuda_scratch.h): run two builds that differ in it to compare the two
sorts on the same scenes.
"""

from __future__ import annotations

import argparse
from typing import Optional, Sequence

import harness
import torch

# Base names (harness.kernel_base_name) of the instance sort's and the scans' activities.
SORT_KERNELS = (
    "DeviceRadixSort",
    "ranges_kernel",
    "maps_kernel",
    "chunk_tile_counts_kernel",
    "scatter_by_tile_kernel",
    "DeviceScan",
    "Memset",
)


def forward_kernel_ms(spheres: int, repeats: int) -> tuple:
    """(instances, forward kernel ms, sort and scan kernel ms) of a W4-like scene."""
    from pulsar_py.tools.bench import binned_instances

    workload = harness.Workload(f"{spheres} spheres", spheres, 1024, 1024, 0.038, 0.5, (0.1, 0.9))
    device = torch.device("cuda")
    case = harness.Case(workload, device)
    for _ in range(5):
        case.forward()
    kernels = harness.kernel_times(case.forward, device, repeats)
    total = sum(ms for ms, _ in kernels.values())
    sort = sum(ms for name, (ms, _) in kernels.items() if name.startswith(SORT_KERNELS))
    return binned_instances(case.renderer, device), total, sort


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/profile/sort_sizes.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=None, help="folder holding the pulsar_py to time (default: installed)")
    parser.add_argument("--spheres", default="60000,150000,300000,500000", help="sphere counts, comma-separated")
    parser.add_argument("--repeats", type=int, default=10, help="profiled forwards per scene (default 10)")
    args = parser.parse_args(argv)
    try:
        counts = [int(s) for s in args.spheres.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--spheres: expected comma-separated integers, got {args.spheres!r}")
    if not counts or min(counts) < 1:
        parser.error(f"--spheres: expected positive counts, got {args.spheres!r}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    harness.use_build(args.build)
    print(f"{'spheres':>9} {'instances':>10} {'forward ms':>11} {'sort+scans ms':>14}")
    for spheres in counts:
        instances, total, sort = forward_kernel_ms(spheres, args.repeats)
        print(f"{spheres:>9,} {instances or 0:>10,} {total:>11.4f} {sort:>14.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
