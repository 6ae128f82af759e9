"""Look-at cameras as Pulsar camera vectors, and rotation helpers for pose errors.

Pulsar's camera vector stores a rotation matrix M whose columns are the camera's image x
axis (right), image "up" axis and the third axis z; the optical axis is ``+z`` in the
default left-handed system and ``-z`` in a right-handed one (model.md section 2). The
functions here build M from an eye, a target and an up direction, turn it into the
axis-angle (8-value vector) or 6D (11-value vector) form (conversions of
``pulsar_py.rotations``), and measure the angle between two rotations, the pose error
the demo and the examples report.
"""

from __future__ import annotations

import math
from typing import Sequence, Union

import torch

from .rotations import matrix_to_rotation, matrix_to_rotation_6d, rotation_to_matrix

VectorLike = Union[torch.Tensor, Sequence[float]]

#: up is parallel to the viewing direction where |up x view| < this * |up| (view a unit vector).
PARALLEL_TOLERANCE = 1e-9


def side_of_view(up: torch.Tensor) -> torch.Tensor:
    """The side a default camera sees an object from, for ``up`` [..., 3]: world +z, or -y
    for an up within 25 degrees of the z axis; made perpendicular to ``up`` (unit)."""
    up = torch.nn.functional.normalize(up, dim=-1)
    plus_z = torch.tensor([0.0, 0.0, 1.0], dtype=up.dtype, device=up.device)
    minus_y = torch.tensor([0.0, -1.0, 0.0], dtype=up.dtype, device=up.device)
    base = torch.where((up[..., 2:3].abs() > 0.9), minus_y, plus_z)
    return torch.nn.functional.normalize(base - (base * up).sum(-1, keepdim=True) * up, dim=-1)


def up_for_view(up: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """``up`` [..., 3], or where it is parallel to the viewing direction ``view`` [..., 3]
    (a camera straight above or below its target), the fallback up: ``-side`` looking
    down along -up, ``+side`` looking up along +up, with ``side = side_of_view(up)``
    (for up = +y: world -z, resp. +z). That is the limit of the camera's up as it rises
    over the target from that side, so the view turns smoothly through the pole.

    Raises ValueError for a zero ``up``. Not differentiable where the fallback applies
    (the fallback is a constant direction)."""
    up_norm = up.norm(dim=-1)
    if bool((up_norm == 0).any()):
        raise ValueError(f"up: expected a non-zero direction, got {up.tolist()}")
    up_b, unit_view = torch.broadcast_tensors(up, torch.nn.functional.normalize(view, dim=-1))
    across = torch.linalg.cross(unit_view, up_b, dim=-1).norm(dim=-1)
    parallel = across < PARALLEL_TOLERANCE * up_b.norm(dim=-1)
    if not bool(parallel.any()):
        return up
    along = torch.sign((unit_view * up_b).sum(-1, keepdim=True))  # -1 looking down, +1 looking up
    fallback = (along * side_of_view(up_b.detach())).to(up.dtype)
    return torch.where(parallel[..., None], fallback, up_b)


def _as_vector(name: str, value: VectorLike, dtype: torch.dtype) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=dtype)
    if t.shape[-1:] != (3,):
        raise ValueError(f"{name}: expected 3 values (x, y, z) in the last dimension, got shape {tuple(t.shape)}")
    return t


def look_at_matrix(
    eye: VectorLike,
    target: VectorLike,
    up: VectorLike = (0.0, 1.0, 0.0),
    right_handed: bool = False,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """The rotation M of a camera at ``eye`` looking at ``target``. [..., 3] -> [..., 3, 3].

    ``up`` is the world direction that appears upwards in the image; where it is parallel
    to the viewing direction (a camera straight above or below the target) the image's
    up is ``up_for_view``'s fallback (world -z looking down, +z looking up, for up = +y).
    With ``right_handed`` the optical axis is ``-z``
    (OpenGL style, the image is not mirrored for scenes in a right-handed world);
    otherwise ``+z`` (Pulsar's default, left-handed).
    """
    eye_t, target_t = _as_vector("eye", eye, dtype), _as_vector("target", target, dtype)
    up_t = _as_vector("up", up, dtype)
    forward = target_t - eye_t
    if bool((forward.norm(dim=-1) == 0).any()):
        raise ValueError(f"eye, target: expected different points, got eye == target == {eye_t.tolist()}")
    forward = torch.nn.functional.normalize(forward, dim=-1)
    z = -forward if right_handed else forward
    up_t = up_for_view(up_t, forward)
    # Up without its component along the viewing direction.
    up_ortho = up_t - (up_t * forward).sum(-1, keepdim=True) * forward
    y = torch.nn.functional.normalize(up_ortho, dim=-1)
    x = torch.cross(y, z, dim=-1)  # columns of a rotation: x = y cross z
    return torch.stack([x, y, z], dim=-1)


def matrix_to_axis_angle(matrix: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [..., 3, 3] -> axis-angle vectors [..., 3] (radians, angle in [0, pi])."""
    return matrix_to_rotation(matrix, "axis_angle")


def rotation_from_params(cam_params: torch.Tensor) -> torch.Tensor:
    """The rotation matrix [..., 3, 3] of Pulsar camera vectors [..., L], L in {8, 10, 11, 13}."""
    length = cam_params.shape[-1]
    if length in (8, 10):
        return rotation_to_matrix(cam_params[..., 3:6], "axis_angle")
    if length in (11, 13):
        return rotation_to_matrix(cam_params[..., 3:9], "6d")
    raise ValueError(f"cam_params: expected a last dimension of 8, 10, 11 or 13 values, got {length}")


def rotation_angle_deg(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Angle (degrees) of the rotation taking ``b`` to ``a``; [..., 3, 3] twice -> [...]."""
    relative = a.transpose(-1, -2) @ b
    cos = ((relative[..., 0, 0] + relative[..., 1, 1] + relative[..., 2, 2] - 1) / 2).clamp(-1.0, 1.0)
    # acos loses precision near 0: use atan2 of the skew part's norm and the cosine.
    skew = torch.stack(
        [
            relative[..., 2, 1] - relative[..., 1, 2],
            relative[..., 0, 2] - relative[..., 2, 0],
            relative[..., 1, 0] - relative[..., 0, 1],
        ],
        -1,
    )
    return torch.rad2deg(torch.atan2(skew.norm(dim=-1) / 2, cos))


def look_at_params(
    eye: VectorLike,
    target: VectorLike,
    up: VectorLike = (0.0, 1.0, 0.0),
    focal_length: float = 1.0,
    sensor_width: float = 1.0,
    right_handed: bool = False,
    rotation: str = "axis_angle",
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """A Pulsar camera vector for a camera at ``eye`` looking at ``target``.

    Args:
        eye, target, up: [..., 3] world positions / direction (see ``look_at_matrix``).
        focal_length, sensor_width: world units; the horizontal field of view is
            ``2 * atan(sensor_width / (2 * focal_length))``.
        right_handed: build it for ``Renderer(..., right_handed_system=True)``.
        rotation: "axis_angle" ([..., 8] vectors) or "6d" ([..., 11] vectors).
    Returns:
        [..., 8] or [..., 11]: position, rotation, focal length, sensor width.
    """
    if rotation not in ("axis_angle", "6d"):
        raise ValueError(f"rotation: expected 'axis_angle' or '6d', got {rotation!r}")
    if not focal_length > 0 or not sensor_width > 0:
        raise ValueError(f"focal_length, sensor_width: expected > 0, got {focal_length!r}, {sensor_width!r}")
    matrix = look_at_matrix(eye, target, up, right_handed, dtype)
    rot = matrix_to_axis_angle(matrix) if rotation == "axis_angle" else matrix_to_rotation_6d(matrix)
    eye_t = _as_vector("eye", eye, dtype).expand(matrix.shape[:-2] + (3,))
    intrinsics = torch.tensor([focal_length, sensor_width], dtype=dtype).expand(matrix.shape[:-2] + (2,))
    return torch.cat([eye_t, rot, intrinsics], dim=-1)


def sensor_width_for_fov(horizontal_fov_deg: float, focal_length: float = 1.0) -> float:
    """Sensor width (world units) giving a horizontal field of view (degrees) at a focal length."""
    if not 0 < horizontal_fov_deg < 180:
        raise ValueError(f"horizontal_fov_deg: expected in (0, 180), got {horizontal_fov_deg!r}")
    return 2 * focal_length * math.tan(math.radians(horizontal_fov_deg) / 2)
