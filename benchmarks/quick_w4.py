"""Quick timing of workload W4 (performance.md) forward and forward+backward on CUDA."""
import sys
import torch
from pulsar_py import Renderer

def workload(n, size, rad_scale, dev):
    g = torch.Generator().manual_seed(1)
    pos = torch.rand(n, 3, generator=g) * 10
    pos[:, 2] += 25; pos[:, :2] -= 5
    col = torch.rand(n, 3, generator=g)
    rad = (rad_scale * (0.5 + torch.rand(n, generator=g))).clamp(min=1e-5)
    opa = 0.1 + 0.8 * torch.rand(n, generator=g)
    return [t.to(dev) for t in (pos, col, rad, opa)]

def timeit(fn, reps=20, warm=3):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    ts.sort(); return ts[len(ts)//2]

dev = "cuda"
for name, n, size, rs in [("W4", 1_000_000, 1024, 0.038), ("W5", 4_000_000, 1024, 0.019)]:
    pos, col, rad, opa = workload(n, size, rs, dev)
    cam = torch.tensor([0, 0, 0, 0, 0, 0, 5.0, 2.0], device=dev)
    r = Renderer(size, size, n_channels=3).to(dev)
    kw = dict(gamma=0.1, max_depth=45.0, percent_allowed_difference=0.01)
    fwd = timeit(lambda: r(pos, col, rad, cam, opacity=opa, **kw))
    leaves = [t.clone().requires_grad_() for t in (pos, col, rad, opa, cam)]
    def fb():
        img = r(leaves[0], leaves[1], leaves[2], leaves[4], opacity=leaves[3], **kw)
        torch.autograd.grad(img.sum(), leaves)
    both = timeit(fb)
    hits = r(pos, col, rad, cam, opacity=opa, mode=1, **kw)
    print(f"{name}: fwd {fwd:.3f} ms  fwd+bwd {both:.3f} ms  mean hits/pixel {hits.float().mean().item():.1f}")
