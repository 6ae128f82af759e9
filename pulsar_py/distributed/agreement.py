"""The check that every rank of a sharded call makes the same call (ShardedRenderer).

The ranks must pass the same cameras, background and settings, and the same
``requires_grad`` for the cameras and the background: different cameras merge partial
images of different views into a wrong image, and a camera gradient requested on some
ranks only would leave the others waiting in the backward's all-reduce. One collective
(a maximum over a few numbers per call) and one read on the host; it runs with the
renderer's value checks (``check_values``), which read the host anyway.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.distributed as dist

Tensor = torch.Tensor

_FIELDS = (
    "camera count",
    "camera values",
    "background",
    "background values",
    "settings or sphere batch shape",
    "cameras.requires_grad",
    "background.requires_grad",
)


def _checksums(t: Optional[Tensor], device: torch.device) -> Tensor:
    """Three float64 sums of a tensor's values (sum, of squares, weighted by position):
    equal bits for equal tensors on every rank (the same values, order and kernels).
    Non-finite values count as 0 here: the value checks report them."""
    if t is None:
        return torch.zeros(3, dtype=torch.float64, device=device)
    x = torch.nan_to_num(t.detach().reshape(-1).to(torch.float64), nan=0.0, posinf=0.0, neginf=0.0)
    weights = torch.arange(1, x.numel() + 1, dtype=torch.float64, device=x.device)
    return torch.stack((x.sum(), x.square().sum(), (weights * x).sum()))


def check_ranks_agree(
    cameras: Tensor, background: Optional[Tensor], settings: Sequence[float], group: Optional[dist.ProcessGroup]
) -> None:
    """Raises ValueError, on every rank alike, when the ranks' calls differ in what
    ShardedRenderer requires to be equal (module docstring). ``settings``: the call's
    non-tensor settings and the spheres' batch shape, as numbers."""
    device = cameras.device
    number = lambda value: torch.tensor([float(value)], dtype=torch.float64, device=device)  # noqa: E731
    parts = [
        number(cameras.numel()),
        _checksums(cameras, device),
        number(-1 if background is None else background.numel()),
        _checksums(background, device),
        torch.tensor([float(v) for v in settings], dtype=torch.float64, device=device),
        number(cameras.requires_grad),
        number(background is not None and background.requires_grad),
    ]
    mine = torch.cat(parts)
    both = torch.cat((mine, -mine))
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    highest, lowest = both.cpu().split(mine.numel())
    differ = highest != -lowest
    if bool(differ.any()):
        sizes = [p.numel() for p in parts]
        names = [name for name, flags in zip(_FIELDS, differ.split(sizes)) if bool(flags.any())]
        raise ValueError(
            "ShardedRenderer: the ranks' calls differ in "
            + ", ".join(names)
            + "; every rank must pass the same cameras, background, settings, sphere batch "
            "shape and requires_grad of the cameras and the background (docs/distributed.md)"
        )
