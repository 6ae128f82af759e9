"""Forward + backward medians of one workload under different backward row budgets
(RendererConfig.backward_row_budget: bytes of instance gradient rows per backward window;
0 = the default), to measure what each extra window costs. CUDA only.

Usage: python3 benchmarks/window_budget.py W5 0 268435456
"""
import sys

import torch

from pulsar_py.tools.bench import time_runs

from profile_kernels import workload_step


def main():
    name, budgets = sys.argv[1], [int(b) for b in sys.argv[2:]] or [0]
    for budget in budgets:
        r, step = workload_step(name, backward_row_budget=budget)
        times = sorted(time_runs(torch.device("cuda"), step, lambda: None, 5, 30, lambda _: None))
        scratch = sum(n.scratch_bytes for n in r._natives.values()) / 2**20
        print(f"{name} budget {budget / 2**20:.0f} MiB: fwd+bwd {times[len(times) // 2]:.3f} ms, "
              f"scratch {scratch:.0f} MiB")


if __name__ == "__main__":
    main()
