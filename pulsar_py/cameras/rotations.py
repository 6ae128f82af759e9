"""Rotation parametrisations a camera can be optimised in, and every conversion between
them in the package (the camera vectors' axis-angle and 6D rotations, ``Camera``'s
rotations, the tools' and examples' poses).

Every function works on a leading batch shape ``[...]`` and is plain torch code:

* ``"matrix"``     [..., 3, 3]: the rotation matrix itself.
* ``"quaternion"`` [..., 4]: (w, x, y, z); normalised before use, so an optimiser may let
  its length drift (a zero quaternion is invalid).
* ``"axis_angle"`` [..., 3]: rotation axis times angle in radians (Rodrigues).
* ``"6d"``         [..., 6]: the first two rows of the matrix (Zhou et al., "On the
  Continuity of Rotation Representations", CVPR 2019); Gram-Schmidt restores the matrix,
  whose rows are b1, b2, b1 x b2 (the convention of Pulsar's 11/13-value camera vector).

The parametrisation -> matrix direction is differentiable everywhere it is defined (the
axis-angle one at the identity too). The matrix -> parametrisation direction is meant for
converting a given rotation into the form one optimises; it is differentiable away from
its branch switches.
"""

from __future__ import annotations

from typing import Dict, Tuple

import torch

from .vectors import cross3, dot3, normalize3


def axis_angle_to_matrix(rotvec: torch.Tensor) -> torch.Tensor:
    """Rodrigues' formula. rotvec [B, 3] (radians) -> rotation matrices [B, 3, 3].

    Written with the series of sin(a)/a and (1-cos a)/a^2 near a = 0 so that the
    gradient at the identity is finite and exact.
    """
    theta2 = dot3(rotvec, rotvec)
    small = theta2 < 1e-8
    safe2 = torch.where(small, torch.ones_like(theta2), theta2)
    theta = safe2.sqrt()
    a = torch.where(small, 1 - theta2 / 6, torch.sin(theta) / theta)
    b = torch.where(small, 0.5 - theta2 / 24, (1 - torch.cos(theta)) / safe2)
    x, y, z = rotvec.unbind(-1)
    zero = torch.zeros_like(x)
    k = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], -1).reshape(rotvec.shape[:-1] + (3, 3))
    eye = torch.eye(3, dtype=rotvec.dtype, device=rotvec.device).expand_as(k)
    k_squared = rotvec[..., :, None] * rotvec[..., None, :] - theta2[..., None, None] * eye  # K K
    return eye + a[..., None, None] * k + b[..., None, None] * k_squared


def rotation_6d_to_matrix(d6: torch.Tensor) -> torch.Tensor:
    """6D rotation (Zhou et al.): Gram-Schmidt of two 3-vectors; rows are b1, b2, b3.

    d6 [B, 6] -> [B, 3, 3].
    """
    a1, a2 = d6[..., :3], d6[..., 3:]
    b1 = normalize3(a1)
    b2 = normalize3(a2 - dot3(b1, a2)[..., None] * b1)
    b3 = cross3(b1, b2)
    return torch.stack([b1, b2, b3], dim=-2)


def _normalize4(q: torch.Tensor) -> torch.Tensor:
    """q / |q| over the last dim (4), element by element: rounding independent of the
    batch size, like camera_params' 3-vector helpers."""
    squared = q[..., 0] * q[..., 0] + q[..., 1] * q[..., 1] + q[..., 2] * q[..., 2] + q[..., 3] * q[..., 3]
    return q / squared.sqrt()[..., None]


#: Trailing shape of each rotation parametrisation.
ROTATION_SHAPES: Dict[str, Tuple[int, ...]] = {
    "matrix": (3, 3),
    "quaternion": (4,),
    "axis_angle": (3,),
    "6d": (6,),
}


def check_rotation_repr(name: str, rotation_repr: object) -> str:
    """``rotation_repr`` if it names a parametrisation, else ValueError naming ``name``."""
    if not isinstance(rotation_repr, str) or rotation_repr not in ROTATION_SHAPES:
        raise ValueError(f"{name}: expected one of {', '.join(ROTATION_SHAPES)}, got {rotation_repr!r}")
    return rotation_repr


def quaternion_to_matrix(quaternion: torch.Tensor) -> torch.Tensor:
    """(w, x, y, z) [..., 4], any non-zero length -> rotation matrices [..., 3, 3]."""
    w, x, y, z = _normalize4(quaternion).unbind(-1)
    rows = [
        1 - 2 * (y * y + z * z),
        2 * (x * y - w * z),
        2 * (x * z + w * y),
        2 * (x * y + w * z),
        1 - 2 * (x * x + z * z),
        2 * (y * z - w * x),
        2 * (x * z - w * y),
        2 * (y * z + w * x),
        1 - 2 * (x * x + y * y),
    ]
    return torch.stack(rows, -1).reshape(quaternion.shape[:-1] + (3, 3))


def matrix_to_quaternion(matrix: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [..., 3, 3] -> unit quaternions (w, x, y, z) [..., 4] with w >= 0.

    Each of the four algebraically equivalent extraction formulas divides by one of
    4w, 4x, 4y, 4z; the one with the largest denominator is used (numerically safe for
    every rotation, including 180 degrees).
    """
    m = matrix
    m00, m11, m22 = m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]
    # 4 q_k^2 for k = w, x, y, z; clamped: rounding may make them slightly negative.
    four_sq = torch.stack(
        [1 + m00 + m11 + m22, 1 + m00 - m11 - m22, 1 - m00 + m11 - m22, 1 - m00 - m11 + m22], -1
    ).clamp_min(1e-12)
    # Row k: 4 q_k * (w, x, y, z), from the symmetric and antisymmetric parts of m.
    d21, d02, d10 = m[..., 2, 1] - m[..., 1, 2], m[..., 0, 2] - m[..., 2, 0], m[..., 1, 0] - m[..., 0, 1]
    s10, s02, s21 = m[..., 1, 0] + m[..., 0, 1], m[..., 0, 2] + m[..., 2, 0], m[..., 2, 1] + m[..., 1, 2]
    candidates = torch.stack(
        [
            torch.stack([four_sq[..., 0], d21, d02, d10], -1),
            torch.stack([d21, four_sq[..., 1], s10, s02], -1),
            torch.stack([d02, s10, four_sq[..., 2], s21], -1),
            torch.stack([d10, s02, s21, four_sq[..., 3]], -1),
        ],
        -2,
    )  # [..., 4, 4]
    candidates = candidates / (2 * four_sq.sqrt())[..., None]
    best = four_sq.argmax(-1)
    q = torch.gather(candidates, -2, best[..., None, None].expand(best.shape + (1, 4)))[..., 0, :]
    q = _normalize4(q)
    return torch.where(q[..., :1] < 0, -q, q)


def quaternion_to_axis_angle(quaternion: torch.Tensor) -> torch.Tensor:
    """(w, x, y, z) [..., 4] -> axis-angle [..., 3] with angle in [0, pi]."""
    q = _normalize4(quaternion)
    q = torch.where(q[..., :1] < 0, -q, q)
    w, v = q[..., 0], q[..., 1:]
    sin_half = dot3(v, v).sqrt()
    angle = 2 * torch.atan2(sin_half, w)
    small = sin_half < 1e-8
    # angle / sin(angle/2) -> 2 as the angle -> 0.
    scale = torch.where(small, 2 / w.clamp_min(1e-12), angle / torch.where(small, torch.ones_like(sin_half), sin_half))
    return v * scale[..., None]


def axis_angle_to_quaternion(rotvec: torch.Tensor) -> torch.Tensor:
    """Axis-angle [..., 3] -> (w, x, y, z) [..., 4]."""
    angle2 = dot3(rotvec, rotvec)
    small = angle2 < 1e-8
    angle = torch.where(small, torch.ones_like(angle2), angle2).sqrt()
    # sin(a/2)/a with its series near 0.
    sinc_half = torch.where(small, 0.5 - angle2 / 48, torch.sin(angle / 2) / angle)
    w = torch.where(small, 1 - angle2 / 8, torch.cos(angle / 2))
    return torch.cat([w[..., None], rotvec * sinc_half[..., None]], -1)


def matrix_to_rotation_6d(matrix: torch.Tensor) -> torch.Tensor:
    """Rotation matrices [..., 3, 3] -> 6D [..., 6] (the first two rows)."""
    return matrix[..., :2, :].reshape(matrix.shape[:-2] + (6,))


def rotation_to_matrix(rotation: torch.Tensor, rotation_repr: str) -> torch.Tensor:
    """Any parametrisation (``ROTATION_SHAPES``) -> rotation matrices [..., 3, 3]."""
    check_rotation_repr("rotation_repr", rotation_repr)
    if rotation_repr == "matrix":
        return rotation
    if rotation_repr == "quaternion":
        return quaternion_to_matrix(rotation)
    if rotation_repr == "axis_angle":
        return axis_angle_to_matrix(rotation)
    return rotation_6d_to_matrix(rotation)


def matrix_to_rotation(matrix: torch.Tensor, rotation_repr: str) -> torch.Tensor:
    """Rotation matrices [..., 3, 3] -> the parametrisation ``rotation_repr``."""
    check_rotation_repr("rotation_repr", rotation_repr)
    if rotation_repr == "matrix":
        return matrix
    if rotation_repr == "6d":
        return matrix_to_rotation_6d(matrix)
    quaternion = matrix_to_quaternion(matrix)
    if rotation_repr == "quaternion":
        return quaternion
    return quaternion_to_axis_angle(quaternion)
