"""(tile, sphere) instances the CUDA binning stores per workload: a check that two builds
cut the tile lists alike (the tile depth bound is exact either way; only the count
shows its tightness). Usage: python3 benchmarks/instance_counts.py W1 W2 W4"""
import sys

import torch

from profile_kernels import workload_step
from pulsar_py.tools.bench import binned_instances

for w in sys.argv[1:] or ["W1"]:
    renderer, step = workload_step(w)
    step()
    torch.cuda.synchronize()
    print(f"{w}: {binned_instances(renderer, torch.device('cuda'))} instances")
