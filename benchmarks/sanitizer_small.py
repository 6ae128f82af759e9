"""A small CUDA forward + backward (every output and gradient, two batch layouts, float32
and float64), to run under compute-sanitizer (memcheck, racecheck)."""
import torch

from pulsar_py import Renderer

g = torch.Generator().manual_seed(0)
for dtype in (torch.float32, torch.float64):
    for batch in (None, 2):
        shape = (batch, 80) if batch else (80,)
        pos = torch.rand(shape + (3,), generator=g, dtype=dtype) * torch.tensor([4.0, 3.0, 4.0], dtype=dtype) + torch.tensor([-2.0, -1.5, 10.0], dtype=dtype)
        col = torch.rand(shape + (5,), generator=g, dtype=dtype)
        rad = 0.1 + 0.4 * torch.rand(shape, generator=g, dtype=dtype)
        opa = 0.2 + 0.8 * torch.rand(shape, generator=g, dtype=dtype)
        cam = torch.tensor([0.0, 0.0, 0.0, 0.01, -0.02, 0.0, 4.0, 2.0], dtype=dtype)
        leaves = [t.cuda().requires_grad_() for t in (pos, col, rad, opa, cam)]
        r = Renderer(40, 30, n_channels=5, n_track=3).cuda()
        img, info = r(leaves[0], leaves[1], leaves[2], leaves[4], opacity=leaves[3], gamma=0.2,
                      max_depth=20.0, return_forward_info=True, percent_allowed_difference=0.01)
        grads = torch.autograd.grad(img.sum(), leaves)
        r3 = Renderer(40, 30, n_channels=3).cuda()
        img3 = r3(leaves[0], leaves[1][..., :3].contiguous(), leaves[2], leaves[4], gamma=0.2, max_depth=20.0)
        grads3 = torch.autograd.grad(img3.sum(), leaves[:3] + [leaves[4]], allow_unused=True)
        # Boxes of about 5x5 pixels above take the backward's lane groups of 8; five times
        # the radius takes whole warps per entry (render_backward.cu).
        img3 = r3(leaves[0], leaves[1][..., :3].contiguous(), leaves[2] * 5, leaves[4], gamma=0.2, max_depth=20.0)
        grads3 = torch.autograd.grad(img3.sum(), leaves[:3] + [leaves[4]], allow_unused=True)
        # A row budget of 5 rows: the backward in many windows of slots (RowWindows).
        rw = Renderer(40, 30, n_channels=3).cuda()
        rw._backward_row_budget = 5 * 8 * col.element_size()
        imgw = rw(leaves[0], leaves[1][..., :3].contiguous(), leaves[2] * 2, leaves[4], opacity=leaves[3],
                  gamma=0.2, max_depth=20.0)
        gradsw = torch.autograd.grad(imgw.sum(), leaves[:3] + [leaves[4]], allow_unused=True)
torch.cuda.synchronize()
print("sanitizer workload done")
