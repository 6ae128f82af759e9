"""The renderer's outputs: ``RenderResult`` (what ``Renderer.render`` returns), the depth
outputs from the depth statistics, and the sphere ids of forward info."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .cameras.params import NativeCamera
from .cameras.vectors import dot3


@dataclass
class RenderResult:
    """Outputs of one ``Renderer.render`` call; the batch dim B is present when any input
    was batched. All float outputs except ``forward_info`` are differentiable.

    Attributes:
        image: [B?, H, W, C] blended features (model.md section 5).
        depth: [B?, H, W] expected intersection depth ``sum_i a_i z_i / sum_i a_i`` over
            the pixel's hits, with ``a_i`` the normalised blend weights and ``z_i`` the
            distance along the pixel's ray from the eye (world units; orthographic: from
            the film plane). ``min_depth`` where nothing is hit.
        z_depth: [B?, H, W] the same expected depth measured along the optical axis (the
            intersection's z in camera coordinates): what depth cameras (RGB-D sensors,
            OpenCV, gsplat and PyTorch3D depth maps) report. ``depth`` times the cosine
            between the pixel's ray and the axis (orthographic: equal to ``depth``);
            differentiable like ``depth``.
        coverage: [B?, H, W] in [0, 1): the share of the blend that is not background,
            ``1 - a_bg`` (alpha).
        distortion: [B?, H, W] ``sum_ij a_i a_j (z_i - z_j)^2`` over the hits (world
            units squared): the depth-distortion regulariser of 2D Gaussian Splatting.
        hit_count: [B?, H, W] int32 hits processed per pixel (no gradient).
        forward_info: [B?, H, W, 3 + 2K] Pulsar's forward info when requested, else None.
    """

    image: torch.Tensor
    depth: torch.Tensor
    coverage: torch.Tensor
    distortion: torch.Tensor
    hit_count: torch.Tensor
    forward_info: Optional[torch.Tensor] = None
    z_depth: Optional[torch.Tensor] = None


#: Values per pixel of the render operator's depth statistics (include/pulsar/renderer.h,
#: kDepthStats): coverage M_0, mean of n, variance of n, low part of the mean.
DEPTH_STATS = 4


def depth_from_moments(moments: torch.Tensor, min_depth: torch.Tensor, max_depth: torch.Tensor):
    """Expected depth and depth distortion from the depth statistics [..., 4] that the
    render operator outputs (model.md section 7): the coverage M_0, the mean and the
    variance of the hits' normalised depths under their weights b_i = a_i / M_0, and the
    low part of the mean (the mean is moments[..., 1] + moments[..., 3]).

    depth = min + range * mean (world units; min_depth where nothing is hit: the mean is
    0 there); distortion = 2 range^2 M_0^2 variance = sum_ij a_i a_j (z_i - z_j)^2, never
    negative. Neither divides by M_0, so a pixel whose coverage underflows keeps finite
    values and gradients. min_depth, max_depth broadcast against moments[..., 0].
    """
    coverage, mean, variance, mean_low = moments.unbind(-1)
    depth_range = max_depth - min_depth
    depth = min_depth + depth_range * (mean + mean_low)
    spread = depth_range * coverage
    distortion = 2 * (spread * spread) * variance
    return depth, distortion


def ray_axis_cosines(camera: NativeCamera, width: int, height: int) -> torch.Tensor:
    """[B, H, W] cosine between each pixel's ray and the optical axis (1 orthographic).

    A ray's direction is r = p00_rel + i pdx + j pdy (column i, row j); the axis is
    perpendicular to pdx and pdy, so r . axis = p00_rel . axis for every pixel, and
    |r|^2 expands in i and j: no [B, H, W, 3] tensor is made. Differentiable in the camera.
    """
    dtype, device = camera.eye.dtype, camera.eye.device
    if camera.orthographic:
        return torch.ones((camera.batch_size, height, width), dtype=dtype, device=device)
    i = torch.arange(width, dtype=dtype, device=device)[None, None, :]
    j = torch.arange(height, dtype=dtype, device=device)[None, :, None]
    p, dx, dy = camera.p00_rel, camera.pdx, camera.pdy
    term = lambda t: t[:, None, None]  # noqa: E731  [B] -> [B, 1, 1]
    length2 = (
        term(dot3(p, p))
        + 2 * i * term(dot3(p, dx))
        + 2 * j * term(dot3(p, dy))
        + i * i * term(dot3(dx, dx))
        + j * j * term(dot3(dy, dy))
        + 2 * i * j * term(dot3(dx, dy))
    )
    along = term(dot3(p, camera.optical_axis()))
    return along / length2.sqrt()


def ids_of_slots(slots: torch.Tensor) -> torch.Tensor:
    """int32 sphere ids [...] of forward info's id slots [...] (include/pulsar/forward_info.h):
    the bits of an int32 in a float32 slot (Pulsar's layout), the value in a float64 one;
    -1 for an empty slot."""
    if slots.dtype == torch.float32:
        return slots.contiguous().view(torch.int32)
    return slots.round().to(torch.int32)


def slots_of_ids(ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Forward info's id slots of ``dtype`` holding integer ids [...]: ids_of_slots' inverse."""
    ids = ids.to(torch.int32)
    return ids.view(torch.float32) if dtype == torch.float32 else ids.to(dtype)


def forward_info_ids(info: torch.Tensor) -> torch.Tensor:
    """int32 [..., K]: the sphere ids of the K closest hits in forward info [..., 3 + 2K]."""
    return ids_of_slots(info[..., 3::2])
