"""Pulsar's camera vector (``cam_params``) -> the general native camera.

The native core sees one general camera per image (model.md section 2): the eye, the
world position of the centre of film pixel (0, 0) (``p00``), the world steps between
pixel centres along image x and y (``pdx``, ``pdy``) and the focal length. Everything
here is plain differentiable torch code, so gradients of those vectors reach position,
rotation, focal length, sensor width and the (real-valued) principal-point offsets.

``camera_from_params`` is the reference implementation. The renderer converts camera
vectors natively instead (include/pulsar/camera_params.h: inside the render operator, or
``pulsar::pack_cameras``), one operation each way where this takes about 60 small torch
operations; tests/cameras/test_camera_native.py holds the two to the same values and
gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..camera_layouts import PACKED, CameraVectorLayout
from .rotations import axis_angle_to_matrix, rotation_6d_to_matrix
from .vectors import cross3, matvec3, normalize3


@dataclass
class NativeCamera:
    """A batch of B general cameras, the native core's view of a camera.

    Attributes (all world units, dtype of the scene):
        eye: [B, 3] camera centre.
        p00_rel: [B, 3] centre of film pixel (0, 0) minus the eye, principal-point shift
            included (the film is kept relative to the eye for float32 precision).
        pdx: [B, 3] step from one pixel centre to the next along image x (columns).
        pdy: [B, 3] step along image y (rows, downwards).
        focal: [B] distance from the eye to the sensor plane; exactly 0 if orthographic.
        right_handed: the optical axis is ``-normalize(pdy x pdx)`` instead of ``+``.
        orthographic: rays are parallel to the optical axis.
    """

    eye: torch.Tensor
    p00_rel: torch.Tensor
    pdx: torch.Tensor
    pdy: torch.Tensor
    focal: torch.Tensor
    right_handed: bool
    orthographic: bool

    @classmethod
    def from_packed(cls, packed: torch.Tensor, right_handed: bool, orthographic: bool) -> "NativeCamera":
        """The cameras of packed cameras [B, 15] (include/pulsar/camera.h), as views."""
        return cls(
            eye=PACKED.eye(packed),
            p00_rel=PACKED.p00_rel(packed),
            pdx=PACKED.pdx(packed),
            pdy=PACKED.pdy(packed),
            focal=PACKED.focal(packed),
            right_handed=right_handed,
            orthographic=orthographic,
        )

    def pack(self, near: torch.Tensor, far: torch.Tensor) -> torch.Tensor:
        """Packed cameras [B, 15]: eye, p00_rel, pdx, pdy, focal, near [B], far [B]: the
        layout the native core reads (include/pulsar/camera.h), differentiable."""
        return torch.cat(
            [self.eye, self.p00_rel, self.pdx, self.pdy, self.focal[:, None], near[:, None], far[:, None]], dim=-1
        )

    def expand(self, batch: int) -> "NativeCamera":
        """The cameras repeated to a batch of ``batch`` (from 1 camera; views)."""
        if self.batch_size == batch:
            return self
        grow = lambda t: t.expand((batch,) + tuple(t.shape[1:]))  # noqa: E731
        return NativeCamera(
            eye=grow(self.eye),
            p00_rel=grow(self.p00_rel),
            pdx=grow(self.pdx),
            pdy=grow(self.pdy),
            focal=grow(self.focal),
            right_handed=self.right_handed,
            orthographic=self.orthographic,
        )

    @property
    def batch_size(self) -> int:
        return int(self.eye.shape[0])

    @property
    def p00(self) -> torch.Tensor:
        """[B, 3] world position of the centre of film pixel (0, 0)."""
        return self.eye + self.p00_rel

    def optical_axis(self) -> torch.Tensor:
        """[B, 3] unit optical axis (model.md section 2), differentiable."""
        z = normalize3(cross3(self.pdy, self.pdx))
        return -z if self.right_handed else z


def camera_from_params(
    cam_params: torch.Tensor,
    width: int,
    height: int,
    orthographic: bool = False,
    right_handed: bool = False,
    first_R_then_T: bool = False,
) -> NativeCamera:
    """Convert Pulsar camera vectors to the general camera (model.md section 2).

    Args:
        cam_params: [B, L], L in {8, 10, 11, 13}: position (3); rotation as axis-angle (3)
            or 6D (6); focal length; sensor width; optionally principal-point offsets
            (ox, oy) in pixels (real-valued, differentiable).
        width, height: image size in pixels.
        orthographic: orthographic projection (focal length must then be 0).
        right_handed: negate the optical axis.
        first_R_then_T: replace the position by ``M @ position``.
    """
    layout = CameraVectorLayout.of(cam_params.shape[-1])
    pos = layout.position(cam_params)
    rot = layout.rotation(cam_params)
    focal = layout.focal(cam_params)
    sensor_width = layout.sensor_width(cam_params)
    matrix = rotation_6d_to_matrix(rot) if layout.rotation_size == 6 else axis_angle_to_matrix(rot)
    if first_R_then_T:
        pos = matvec3(matrix, pos)
    x_axis = matrix[..., :, 0]
    y_axis = -matrix[..., :, 1]
    z_axis = -matrix[..., :, 2] if right_handed else matrix[..., :, 2]
    pixel_size = sensor_width / width
    pdx = x_axis * pixel_size[..., None]
    pdy = y_axis * pixel_size[..., None]
    # Sensor centre relative to the eye: f z (perspective) or the eye itself.
    centre = torch.zeros_like(pos) if orthographic else focal[..., None] * z_axis
    p00_rel = centre - (width - 1) / 2 * pdx - (height - 1) / 2 * pdy
    if layout.has_offsets:
        offset_x, offset_y = layout.offsets(cam_params)
        p00_rel = p00_rel + offset_x[..., None] * pdx + offset_y[..., None] * pdy
    return NativeCamera(
        eye=pos,
        p00_rel=p00_rel,
        pdx=pdx,
        pdy=pdy,
        focal=torch.zeros_like(focal) if orthographic else focal,
        right_handed=right_handed,
        orthographic=orthographic,
    )
