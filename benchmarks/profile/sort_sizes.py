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
    from pulsar_py import Renderer
    from pulsar_py.tools.bench import binned_instances

    workload = harness.Workload(f"{spheres} spheres", spheres, 1024, 1024, 0.038, 0.5, (0.1, 0.9))
    device = torch.device("cuda")
    pos, col, rad, opacity, cam = harness.make_inputs(workload, device)
    renderer = Renderer(workload.width, workload.height, n_channels=3, n_track=harness.N_TRACK).to(device)
    if hasattr(renderer, "check_values"):
        renderer.check_values = False
    call = harness.RenderCall(renderer)
    with torch.no_grad():
        for _ in range(5):
            call(pos, col, rad, cam, opacity)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                call(pos, col, rad, cam, opacity)
            torch.cuda.synchronize()
    total = sort = 0.0
    for event in prof.key_averages():
        ms = event.self_device_time_total / repeats / 1e3
        total += ms
        if any(name in event.key for name in SORT_KERNELS):
            sort += ms
    return binned_instances(renderer, device), total, sort


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
