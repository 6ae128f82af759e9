"""Pulsar-scaled gradients: ``Renderer(..., gradient_scaling="pulsar")``.

The renderer's gradients are exact (model.md section 8). PyTorch3D's Pulsar scales its
(approximate) gradients in its backward pass, so learning rates tuned for Pulsar are off
by orders of magnitude here. This mode keeps the exact gradient directions and applies
Pulsar's scale on top, per sphere and per camera, so such learning rates carry over.

Let n_s be the number of pixels of a camera where sphere s is among the ``n_track``
closest hits (the forward info's sphere ids), A_s the pixel area of the sphere's screen
bounding box as Pulsar computes it (the tangent cone's extent along image x and y,
floored at its low end, ceiled plus one at its high end, clipped to the image), and a
sphere "large" when that box spans at least 3 pixels along both axes. Pulsar:

* divides the position, colour, radius and opacity gradients of every sphere by n_s
  (spheres with n_s = 0 get none);
* weighs each large sphere's camera gradient by 1e-3 A_s / n_s (small spheres give the
  camera nothing), sums over spheres, and divides the sum by
  M = #(large spheres with n_s > 0) + sum of n_s over small spheres with n_s > 0.
  One factor for all camera vectors (eye, pixel (0, 0), pixel steps), so position,
  rotation, focal length and sensor width share it.

Here: sphere gradients are multiplied by 1 / n_s (0 where n_s = 0); the camera gradient
of each camera by c = 1e-3 * (sum of A_s over large spheres) / (M * sum of n_s over all
spheres with n_s > 0), Pulsar's weights applied to the exact total under the assumption
that each tracked pixel contributes alike (c = 0 where nothing is tracked, where Pulsar
gives NaN). Spheres shared by a batch of cameras are counted over all of them; one
camera shared by a batch of scenes takes the mean of the batch's factors. Depth tensors
that require grad reach the operator inside packed cameras and take the camera factor;
the background keeps its exact gradient (Pulsar gives it none).

The factors come from the same call's forward info (the render operator returns it,
``RenderSettings.want_forward_info``) and the cameras' screen boxes; an identity
autograd function on the render inputs applies them in backward. The native core is
unchanged, and the default mode ("exact") never reaches this module.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Optional, Tuple

import torch

from . import ops
from .camera_layouts import PACKED
from .cameras.vectors import cross3, dot3, normalize3
from .outputs import forward_info_ids

Tensor = torch.Tensor

MODES = ("exact", "pulsar")

# Pulsar's camera weight: 1e-3 per pixel of a sphere's screen box; its box must span
# this many pixels along x and y for the sphere to give camera gradients.
_CAMERA_AREA_FACTOR = 1e-3
_LARGE_SPHERE_PX = 3
# Tangent-cone angles are kept this far inside +-pi/2 so tan() stays monotonic.
_ANGLE_MARGIN = 1e-6


def check_gradient_scaling(value: object) -> str:
    """ "exact" or "pulsar" (ValueError naming ``gradient_scaling`` otherwise)."""
    if not isinstance(value, str) or value not in MODES:
        raise ValueError(f"gradient_scaling: expected one of {MODES}, got {value!r}")
    return value


class _Factors:
    """The factors of one render call, set after its forward, read by its backward."""

    __slots__ = ("sphere", "camera")

    def __init__(self) -> None:
        self.sphere: Optional[Tensor] = None  # [B?, N] like the radii
        self.camera: Optional[Tensor] = None  # [B, 1] per camera row, or [] for one camera vector


class _ScaleGradients(torch.autograd.Function):
    """Identity on (positions, features, radii, opacities, cameras); backward multiplies
    the sphere gradients by ``factors.sphere`` and the camera gradient by
    ``factors.camera``."""

    @staticmethod
    def forward(ctx, factors: _Factors, positions, features, radii, opacities, cameras):
        ctx.factors = factors
        ctx.set_materialize_grads(False)
        return tuple(None if t is None else t.view_as(t) for t in (positions, features, radii, opacities, cameras))

    @staticmethod
    def backward(ctx, g_pos, g_col, g_rad, g_opy, g_cam):
        sphere, camera = ctx.factors.sphere, ctx.factors.camera
        need = ctx.needs_input_grad
        scaled = lambda i, g, f: g * f.to(g.dtype) if need[i] and g is not None else None  # noqa: E731
        per_sphere = sphere[..., None]
        return (
            None,
            scaled(1, g_pos, per_sphere),
            scaled(2, g_col, per_sphere),
            scaled(3, g_rad, sphere),
            scaled(4, g_opy, sphere),
            scaled(5, g_cam, camera),
        )


def _run_eagerly(fn: Callable[..., Tuple[Tensor, ...]]) -> Callable[..., Tuple[Tensor, ...]]:
    """``torch.compiler.disable(fn)`` (torch.compile runs it eagerly, behind a graph
    break: the factors are filled in after the forward), made at the first call rather
    than at import: ``torch.compiler.disable`` imports torch._dynamo, more than a second
    that ``import pulsar_py`` would otherwise pay for a mode most programs never use."""
    disabled: Optional[Callable[..., Tuple[Tensor, ...]]] = None

    @functools.wraps(fn)
    def call(*args):
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args)

    return call


@_run_eagerly
def render_call(
    positions: Tensor,
    features: Tensor,
    radii: Tensor,
    opacities: Optional[Tensor],
    background: Optional[Tensor],
    cameras: Tensor,
    values: Optional[Tensor],
    settings: ops.RenderSettings,
) -> Tuple[Tensor, ...]:
    """``ops.render_call`` with Pulsar-scaled gradients (forward info always computed)."""
    # An eager call: the numbers are read here.
    settings = ops.resolved_settings(settings, values, positions.device, read=True)
    needs = [t is not None and t.requires_grad for t in (positions, features, radii, opacities, cameras)]
    if not (torch.is_grad_enabled() and any(needs)):
        return ops.render_call(positions, features, radii, opacities, background, cameras, None, settings)
    s = settings
    if not s.outputs.want_forward_info:
        settings = s._replace(outputs=s.outputs._replace(want_forward_info=True))
    factors = _Factors()
    positions, features, radii, opacities, cameras = _ScaleGradients.apply(
        factors, positions, features, radii, opacities, cameras
    )
    # Camera vectors are converted once: the render and the camera factors take the packed
    # form (the scaled gradient still reaches the vectors, through pulsar::pack_cameras).
    packed = _packed_cameras(cameras, s)
    rendered_cameras = cameras
    if int(s.camera.camera_length):
        rendered_cameras = packed if cameras.dim() == 2 else packed[0]
        settings = settings._replace(
            camera=settings.camera._replace(camera_length=0, first_R_then_T=False, min_depth=0.0, max_depth=0.0)
        )
    outputs = ops.render_call(positions, features, radii, opacities, background, rendered_cameras, None, settings)
    with torch.no_grad():
        counts = _tracked_pixel_counts(outputs[3], positions.shape[-2])  # [B, N]
        batch = counts.shape[0]
        shared = positions.dim() == 2  # one set of spheres for every camera
        total = counts.sum(0) if shared else counts
        safe = total.clamp_min(1).to(positions.dtype)
        factors.sphere = torch.where(total > 0, 1.0 / safe, torch.zeros_like(safe))
        if needs[4]:
            factors.camera = _camera_factors(
                counts, positions.detach(), radii.detach(), cameras, packed.detach(), s, batch
            )
    return outputs


def _tracked_pixel_counts(info: Tensor, n: int) -> Tensor:
    """int64 [B, N]: per camera, the pixels whose forward info tracks each sphere."""
    ids = forward_info_ids(info).reshape(info.shape[0] if info.dim() == 4 else 1, -1)
    batch = ids.shape[0]
    offset = torch.arange(batch, device=ids.device, dtype=torch.int64)[:, None] * n
    ids = ids.to(torch.int64)
    flat = torch.where(ids >= 0, ids + offset, torch.full_like(ids, batch * n))
    return torch.bincount(flat.reshape(-1), minlength=batch * n + 1)[: batch * n].reshape(batch, n)


def _camera_factors(
    counts: Tensor, positions: Tensor, radii: Tensor, cameras: Tensor, packed: Tensor, s: ops.RenderSettings, batch: int
) -> Tensor:
    """Per camera row of ``cameras`` (the caller's; or [] for one unbatched camera),
    Pulsar's camera-gradient factor; ``packed``: their packed form [B', 15]."""
    if packed.shape[0] != batch:
        packed = packed.expand(batch, -1)
    pos = positions if positions.dim() == 3 else positions[None]
    rad = radii if radii.dim() == 2 else radii[None]
    width_px, height_px = _screen_box(
        pos,
        rad,
        packed,
        int(s.config.width),
        int(s.config.height),
        bool(s.config.orthographic),
        bool(s.camera.right_handed),
    )
    tracked = counts > 0
    large = tracked & (width_px >= _LARGE_SPHERE_PX) & (height_px >= _LARGE_SPHERE_PX)
    dtype = pos.dtype
    counts_f = counts.to(dtype)
    contributions = torch.where(large, torch.ones_like(counts_f), torch.where(tracked, counts_f, 0.0)).sum(-1)
    area = torch.where(large, width_px * height_px, torch.zeros_like(counts_f)).sum(-1)
    pixels = counts_f.sum(-1)
    denominator = contributions * pixels
    factor = torch.where(denominator > 0, _CAMERA_AREA_FACTOR * area / denominator.clamp_min(1), torch.zeros_like(area))
    if cameras.dim() == 2 and cameras.shape[0] == batch:
        return factor[:, None]
    return factor.mean()


def _packed_cameras(cameras: Tensor, s: ops.RenderSettings) -> Tensor:
    """Packed cameras [B, 15] of the operator's camera input (vectors are converted)."""
    cams = cameras if cameras.dim() == 2 else cameras[None]
    if int(s.camera.camera_length) == 0:
        return cams
    pack = ops.PackSettings(
        int(s.config.width),
        int(s.config.height),
        bool(s.config.orthographic),
        bool(s.camera.right_handed),
        bool(s.camera.first_R_then_T),
        s.camera.min_depth,
        s.camera.max_depth or 1.0,
    )
    return ops.pack_cameras(cams.contiguous(), pack.encode())


def _screen_box(
    pos: Tensor, rad: Tensor, packed: Tensor, width: int, height: int, orthographic: bool, right_handed: bool
) -> Tuple[Tensor, Tensor]:
    """Pixel width and height [B, N] of each sphere's screen box, as Pulsar bounds it.

    Along each image axis the box spans the tangent planes of the sphere through the eye
    in the plane of that axis and the optical axis (perspective), or centre +- radius
    (orthographic); its low end is floored and its high end ceiled plus one, both clipped
    to the image [0, W] x [0, H] (pixel (0, 0) centred at 0).
    """
    eye, p00_rel, pdx, pdy = PACKED.eye(packed), PACKED.p00_rel(packed), PACKED.pdx(packed), PACKED.pdy(packed)
    focal = PACKED.focal(packed)
    step_x, step_y = dot3(pdx, pdx).sqrt(), dot3(pdy, pdy).sqrt()  # [B]
    right, down = pdx / step_x[:, None], pdy / step_y[:, None]
    axis = normalize3(cross3(pdy, pdx))
    if right_handed:
        axis = -axis
    # Principal point in pixels (pixel (0, 0) at 0): p00_rel = f axis - cx pdx - cy pdy.
    cx, cy = -dot3(p00_rel, right) / step_x, -dot3(p00_rel, down) / step_y
    c = pos - eye[:, None]
    x, y, z = dot3(c, right[:, None]), dot3(c, down[:, None]), dot3(c, axis[:, None])

    def extent(u: Tensor, step: Tensor, centre: Tensor, size: int) -> Tensor:
        if orthographic:
            lo, hi = (u - rad) / step[:, None], (u + rad) / step[:, None]
        else:
            reach = torch.sqrt(u * u + z * z).clamp_min(1e-30)
            alpha = torch.atan2(u, z)
            theta = torch.asin((rad / reach).clamp(-1.0, 1.0))
            limit = math.pi / 2 - _ANGLE_MARGIN
            scale = (focal / step)[:, None]
            lo = torch.tan((alpha - theta).clamp(-limit, limit)) * scale
            hi = torch.tan((alpha + theta).clamp(-limit, limit)) * scale
        lo, hi = lo + centre[:, None], hi + centre[:, None]
        low = torch.floor(lo.clamp(0.0, float(size)))
        high = torch.minimum(torch.ceil(hi.clamp(-1.0, float(size))) + 1, torch.full_like(hi, float(size)))
        return (high - low).clamp_min(0)

    return extent(x, step_x, cx, width), extent(y, step_y, cy, height)
