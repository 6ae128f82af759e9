"""3-vector helpers over the last dim of torch tensors, written element by element:
unlike matmul or a reduction kernel, their rounding does not depend on the batch size, so
a batch of cameras converts exactly like its items do one by one (bitwise, on every
device)."""

from __future__ import annotations

import torch


def dot3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[..., 0] * b[..., 0] + a[..., 1] * b[..., 1] + a[..., 2] * b[..., 2]


def cross3(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.stack(
        [
            a[..., 1] * b[..., 2] - a[..., 2] * b[..., 1],
            a[..., 2] * b[..., 0] - a[..., 0] * b[..., 2],
            a[..., 0] * b[..., 1] - a[..., 1] * b[..., 0],
        ],
        -1,
    )


def normalize3(v: torch.Tensor) -> torch.Tensor:
    return v / dot3(v, v).sqrt()[..., None]


def matvec3(m: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[..., 3, 3] x [..., 3] -> [..., 3]."""
    return torch.stack([dot3(m[..., r, :], v) for r in range(3)], -1)
