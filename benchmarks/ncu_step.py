"""One forward + backward of a workload (default W4), for Nsight Compute (ncu) to profile
the render kernels. Usage: python3 benchmarks/ncu_step.py [W1|W2|W3|W4|W5]"""
import sys

import torch

from pulsar_py import Renderer

from profile_kernels import make

(pos, col, rad, opa), size = make(sys.argv[1] if len(sys.argv) > 1 else "W4", "cuda")
cam = torch.tensor([0, 0, 0, 0, 0, 0, 5.0, 2.0], device="cuda")
r = Renderer(size, size, n_channels=3).cuda()
leaves = [t.clone().requires_grad_() if t is not None else None for t in (pos, col, rad, opa, cam)]
img = r(leaves[0], leaves[1], leaves[2], leaves[4], opacity=leaves[3], gamma=0.1, max_depth=45.0,
        percent_allowed_difference=0.01)
torch.autograd.grad(img.sum(), [t for t in leaves if t is not None])
torch.cuda.synchronize()
