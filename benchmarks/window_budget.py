"""Forward + backward medians of one workload under different backward row budgets
(RendererConfig.backward_row_budget: bytes of instance gradient rows per backward window;
0 = the default), to measure what each extra window costs. CUDA only.

Usage: python3 benchmarks/window_budget.py W5 0 268435456
"""
import sys

import torch

from pulsar_py import Renderer

from profile_kernels import make


def median_ms(fn, repeats=30, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main():
    name, budgets = sys.argv[1], [int(b) for b in sys.argv[2:]] or [0]
    (pos, col, rad, opa), size = make(name, "cuda")
    cam = torch.tensor([0, 0, 0, 0, 0, 0, 5.0, 2.0], device="cuda")
    leaves = [t.clone().requires_grad_() if t is not None else None for t in (pos, col, rad, opa, cam)]
    kw = dict(gamma=0.1, max_depth=45.0, percent_allowed_difference=0.01)
    for budget in budgets:
        r = Renderer(size, size, n_channels=3).cuda()
        r.check_values = False
        r._backward_row_budget = budget

        def step():
            img = r(leaves[0], leaves[1], leaves[2], leaves[4], opacity=leaves[3], **kw)
            torch.autograd.grad(img.sum(), [t for t in leaves if t is not None])

        ms = median_ms(step)
        scratch = sum(n.scratch_bytes for n in r._natives.values()) / 2**20
        print(f"{name} budget {budget / 2**20:.0f} MiB: fwd+bwd {ms:.3f} ms, scratch {scratch:.0f} MiB")


if __name__ == "__main__":
    main()
