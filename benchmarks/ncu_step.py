"""One forward + backward of a workload (default W4), for Nsight Compute (ncu) to profile
the render kernels. Usage: python3 benchmarks/ncu_step.py [W1|W2|W3|W4|W5]"""
import sys

import torch

from profile_kernels import workload_step

_, step = workload_step(sys.argv[1] if len(sys.argv) > 1 else "W4")
step()
torch.cuda.synchronize()
