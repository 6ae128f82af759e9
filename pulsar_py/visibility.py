"""Which spheres a camera can see: culling (model.md section 3) plus an image-bounds test.

A sphere is visible when it survives culling and its hit region can reach a pixel centre:

* Perspective: pixel ray d hits sphere (centre c relative to the eye, t = |c|, radius r)
  when ``|c - t d| <= r`` (model.md section 4), i.e. when the angle between d and c is at
  most ``2 asin(r / (2 t))``; the tiny-sphere rule widens that to ``2 asin(0.375 ps / f)``
  (``delta < 0.75 ps t / f``). The hit directions form a circular cone; its exact
  bounding box on the image (the tangent planes through the eye) is tested against the
  rectangle of pixel centres ``[0, W-1] x [0, H-1]``.
* Orthographic: the hit region on the film is an ellipse of half-axes ``r / |pdx|`` and
  ``r / |pdy|`` pixels around the centre's film position (0.5 px for a tiny sphere); its
  bounding box is tested the same way.

The test is conservative: a sphere whose box overlaps the centres' rectangle but misses
every pixel centre (a small sphere between centres, or the box's corner) counts as
visible; a sphere that hits a pixel is never reported invisible.
"""

from __future__ import annotations

import torch

from .cameras.params import NativeCamera
from .cameras.vectors import dot3
from .reference import MIN_FORWARD_COSINE

# Tiny-sphere rule: centre pixel within 0.75 pixel sizes (perspective), 0.5 px (orthographic).
_TINY_CHORD_PX = 0.75
_TINY_ORTHO_PX = 0.5
# Widening of the box test against rounding, in pixels.
_MARGIN_PX = 1e-3


def _unit(v: torch.Tensor) -> torch.Tensor:
    return v / dot3(v, v).sqrt()[..., None]


@torch.no_grad()
def visible_spheres(
    pos: torch.Tensor,
    rad: torch.Tensor,
    camera: NativeCamera,
    width: int,
    height: int,
    near: torch.Tensor,
    far: torch.Tensor,
) -> torch.Tensor:
    """bool [B, N]: spheres that survive culling and may hit a pixel centre.

    Args:
        pos: [N, 3] or [B, N, 3] centres; rad: [N] or [B, N] radii (> 0).
        camera: B cameras (pdx and pdy orthogonal to each other and to the optical axis,
            as every camera this package builds).
        width, height: image size in pixels.
        near, far: [B] depth range (world units); far may be inf.
    """
    # Element-wise vector maths (camera_params' helpers): batches decide like their items.
    right_len, down_len = dot3(camera.pdx, camera.pdx).sqrt(), dot3(camera.pdy, camera.pdy).sqrt()  # pixel sides [B]
    right, down, axis = _unit(camera.pdx), _unit(camera.pdy), camera.optical_axis()
    c = pos - camera.eye[:, None]  # [B, N, 3]
    cam = torch.stack([dot3(c, right[:, None]), dot3(c, down[:, None]), dot3(c, axis[:, None])], -1)
    near, far = near[:, None], far[:, None]
    pixel_size = (right_len * down_len).sqrt()[:, None]  # geometric mean [B, 1]
    if camera.orthographic:
        closest = cam[..., 2] - rad
        survives = (closest >= near) & (closest <= far)
        # Centre's film position in pixels: film origin p00 relative to the eye.
        p00 = torch.stack([dot3(camera.p00_rel, right), dot3(camera.p00_rel, down)], -1)[:, None]
        u = (cam[..., 0] - p00[..., 0]) / right_len[:, None]
        v = (cam[..., 1] - p00[..., 1]) / down_len[:, None]
        tiny = rad / pixel_size < 1
        half_u = torch.where(tiny, torch.clamp_min(rad / right_len[:, None], _TINY_ORTHO_PX), rad / right_len[:, None])
        half_v = torch.where(tiny, torch.clamp_min(rad / down_len[:, None], _TINY_ORTHO_PX), rad / down_len[:, None])
        u_lo, u_hi, v_lo, v_hi = u - half_u, u + half_u, v - half_v, v + half_v
        unbounded = torch.zeros_like(survives)
    else:
        dist = dot3(c, c).sqrt()
        closest = dist - rad
        in_front = cam[..., 2] / dist >= MIN_FORWARD_COSINE
        survives = (closest >= near) & (closest <= far) & in_front
        focal = camera.focal[:, None]
        # Intrinsics in pixels: fx = f / |pdx|, principal point from p00 = f z - cx pdx - cy pdy.
        fx, fy = focal / right_len[:, None], focal / down_len[:, None]
        cx = -dot3(camera.p00_rel, right)[:, None] / right_len[:, None]
        cy = -dot3(camera.p00_rel, down)[:, None] / down_len[:, None]
        tiny = rad * focal / (dist * pixel_size) < 1
        sin_half = rad / (2 * dist)
        sin_half = torch.where(tiny, torch.clamp_min(sin_half, _TINY_CHORD_PX / 2 * pixel_size / focal), sin_half)
        half_angle = 2 * torch.asin(sin_half.clamp(max=1.0))
        # The cone of hit directions is the tangent cone of a sphere of radius sin(angle)
        # around the unit direction a = c / t: bound x/z and y/z by its tangent planes.
        a = cam / dist[..., None]
        rho = torch.sin(half_angle)
        unbounded = (a[..., 2] <= rho) | (half_angle >= torch.pi / 2)
        az = a[..., 2]
        denom = torch.where(unbounded, torch.ones_like(az), az * az - rho * rho)

        def bounds(a_k: torch.Tensor, f_k: torch.Tensor, c_k: torch.Tensor):
            root = (a_k * a_k + az * az - rho * rho).clamp_min(0).sqrt()
            lo = (a_k * az - rho * root) / denom
            hi = (a_k * az + rho * root) / denom
            return f_k * lo + c_k, f_k * hi + c_k

        u_lo, u_hi = bounds(a[..., 0], fx, cx)
        v_lo, v_hi = bounds(a[..., 1], fy, cy)
    overlaps = (
        (u_hi >= -_MARGIN_PX)
        & (u_lo <= width - 1 + _MARGIN_PX)
        & (v_hi >= -_MARGIN_PX)
        & (v_lo <= height - 1 + _MARGIN_PX)
    )
    return survives & (overlaps | unbounded)
