"""Kernel-level profile of one workload's forward + backward on CUDA (torch.profiler /
CUPTI), plus the split between native time and Python-side overhead.

Usage: python3 benchmarks/profile_kernels.py [W4|W5|W1|W2|W2B|W3]
"""
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from pulsar_py import Renderer

WORKLOADS = {  # n, image side, radius formula scale (None: U(0,1)), opacity range (None: no opacity)
    "W1": (1_000_000, 1000, None, None),
    "W3": (10_000, 512, None, (0.1, 0.9)),
    "W4": (1_000_000, 1024, 0.038, (0.1, 0.9)),
    "W5": (4_000_000, 1024, 0.019, (0.1, 0.9)),
    # W2 with opacity 0.1 + 0.8 U, as the A/B series since the sixth session measured it
    # (19.07 M instances); W2B with the driver's (and performance.md's) U(0.1, 1) (14.13 M).
    "W2": (1_000_000, 1000, None, (0.1, 0.9)),
    "W2B": (1_000_000, 1000, None, (0.1, 1.0)),
}


def make(name, dev):
    n, size, scale, opacity_range = WORKLOADS[name]
    g = torch.Generator().manual_seed(1)
    pos = torch.rand(n, 3, generator=g) * 10
    pos[:, 2] += 25
    pos[:, :2] -= 5
    col = torch.rand(n, 3, generator=g)
    u = torch.rand(n, generator=g)
    rad = (u if scale is None else scale * (0.5 + u)).clamp(min=1e-5)
    opa = None
    if opacity_range is not None:
        low, high = opacity_range
        opa = low + (high - low) * torch.rand(n, generator=g)
    out = [t.to(dev) if t is not None else None for t in (pos, col, rad, opa)]
    return out, size


def workload_step(name, device="cuda", backward_row_budget=0):
    """(renderer, step) for workload `name`: step() runs one forward and the backward of
    image.sum() with every input requiring a gradient (value checks off; set
    renderer.check_values to turn them on). backward_row_budget: the renderer's backward
    window size in bytes of rows (0: default)."""
    (pos, col, rad, opa), size = make(name, device)
    cam = torch.tensor([0, 0, 0, 0, 0, 0, 5.0, 2.0], device=device)
    r = Renderer(size, size, n_channels=3).to(device)
    r.check_values = False
    r._backward_row_budget = backward_row_budget
    kw = dict(gamma=0.1, max_depth=45.0, percent_allowed_difference=0.01)
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (pos, col, rad, opa, cam)]

    def step():
        img = r(leaves[0], leaves[1], leaves[2], leaves[4], opacity=leaves[3], **kw)
        torch.autograd.grad(img.sum(), [t for t in leaves if t is not None])

    return r, step


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "W4"
    r, step = workload_step(name)
    for check in (True, False):
        r.check_values = check
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        print(f"{name} check_values={check}: wall {(time.perf_counter() - t0) / 10 * 1e3:.3f} ms per fwd+bwd")
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
