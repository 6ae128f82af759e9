"""View-dependent colour from real spherical harmonics (3D Gaussian Splatting convention).

Each sphere carries coefficients ``[(degree + 1)^2, C]`` (degree 0..3). Its colour seen
from a camera is

    colour = max(sum_k Y_k(d) * coeffs[k] + 0.5, 0)        (per channel)

with ``d`` the unit view direction from the camera centre to the sphere centre (world
coordinates) and ``Y_k`` the real spherical harmonics in the order and with the signs of
3D Gaussian Splatting (Kerbl et al. 2023), so coefficients trained there render the same
colours here. Degree 0 is a constant: ``colour = C0 * coeffs[0] + 0.5``
(``rgb_to_sh_dc`` inverts it).

Everything is torch code: gradients reach the coefficients and, through ``d``, the sphere
positions and the camera centre (zero where the clamp at 0 is active).
"""

from __future__ import annotations

import math

import torch

SH_C0 = 0.28209479177387814
SH_C1 = 0.4886025119029199
SH_C2 = (1.0925484305920792, -1.0925484305920792, 0.31539156525252005, -1.0925484305920792, 0.5462742152960396)
SH_C3 = (
    -0.5900435899266435,
    2.890611442640554,
    -0.4570457994644658,
    0.3731763325901154,
    -0.4570457994644658,
    1.445305721320277,
    -0.5900435899266435,
)
MAX_SH_DEGREE = 3


def sh_n_coefficients(degree: int) -> int:
    """Coefficients per channel of degree ``degree``: (degree + 1)^2."""
    return (degree + 1) ** 2


def sh_degree_of(n_coefficients: int) -> int:
    """The degree whose coefficients per channel number ``n_coefficients`` (1, 4, 9, 16)."""
    return int(round(math.sqrt(n_coefficients))) - 1


def check_sh_degree(degree: object) -> int:
    """``degree`` as an int in [0, 3], else TypeError/ValueError naming ``sh_degree``."""
    if isinstance(degree, bool) or not isinstance(degree, int):
        raise TypeError(f"sh_degree: expected an int in [0, {MAX_SH_DEGREE}] or None, got {degree!r}")
    if not 0 <= degree <= MAX_SH_DEGREE:
        raise ValueError(f"sh_degree: expected an int in [0, {MAX_SH_DEGREE}] or None, got {degree}")
    return degree


def sh_basis(directions: torch.Tensor, degree: int) -> torch.Tensor:
    """Real SH basis of unit directions [..., 3] -> [..., (degree + 1)^2]."""
    degree = check_sh_degree(degree)
    x, y, z = directions.unbind(-1)
    basis = [torch.full_like(x, SH_C0)]
    if degree >= 1:
        basis += [-SH_C1 * y, SH_C1 * z, -SH_C1 * x]
    if degree >= 2:
        xx, yy, zz = x * x, y * y, z * z
        basis += [
            SH_C2[0] * x * y,
            SH_C2[1] * y * z,
            SH_C2[2] * (2 * zz - xx - yy),
            SH_C2[3] * x * z,
            SH_C2[4] * (xx - yy),
        ]
    if degree >= 3:
        basis += [
            SH_C3[0] * y * (3 * xx - yy),
            SH_C3[1] * x * y * z,
            SH_C3[2] * y * (4 * zz - xx - yy),
            SH_C3[3] * z * (2 * zz - 3 * xx - 3 * yy),
            SH_C3[4] * x * (4 * zz - xx - yy),
            SH_C3[5] * z * (xx - yy),
            SH_C3[6] * x * (xx - 3 * yy),
        ]
    return torch.stack(basis, -1)


def sh_to_color(coefficients: torch.Tensor, directions: torch.Tensor, degree: int) -> torch.Tensor:
    """Colours of SH coefficients seen along view directions.

    Args:
        coefficients: [..., (degree + 1)^2, C].
        directions: [..., 3] view directions (normalised here); broadcast against
            ``coefficients[..., 0, :]``'s leading dims.
        degree: 0..3.

    Returns:
        [..., C] = max(sum_k Y_k(d) coefficients[k] + 0.5, 0).
    """
    degree = check_sh_degree(degree)
    n_coeffs = sh_n_coefficients(degree)
    if coefficients.dim() < 2 or coefficients.shape[-2] != n_coeffs:
        raise ValueError(
            f"coefficients: expected [..., {n_coeffs}, C] for sh_degree {degree}, got shape {tuple(coefficients.shape)}"
        )
    # Element-wise sums (no reduction kernels): a batch rounds exactly like its items.
    length = (
        directions[..., 0] * directions[..., 0]
        + directions[..., 1] * directions[..., 1]
        + directions[..., 2] * directions[..., 2]
    ).sqrt()
    unit = directions / length.clamp_min(1e-30)[..., None]  # a zero direction gives colour C0 c0 + 0.5
    basis = sh_basis(unit, degree)  # [..., K]
    colour = basis[..., 0, None] * coefficients[..., 0, :]
    for k in range(1, n_coeffs):
        colour = colour + basis[..., k, None] * coefficients[..., k, :]
    return (colour + 0.5).clamp_min(0.0)


def sh_dc_to_rgb(dc: torch.Tensor) -> torch.Tensor:
    """The colour [..., C] that the degree-0 coefficients ``dc`` [..., C] render from every
    direction (negative values clamped to 0, as ``sh_to_color`` does)."""
    return (SH_C0 * dc + 0.5).clamp_min(0.0)


def rgb_to_sh_dc(colour: torch.Tensor) -> torch.Tensor:
    """The degree-0 coefficient that renders ``colour`` [..., C] from every direction."""
    return (colour - 0.5) / SH_C0
