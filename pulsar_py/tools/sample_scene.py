"""A built-in, recognisable, deterministic sample scene: a shaded trefoil knot.

Spheres cover the surface of a tube around a trefoil knot, coloured by a rainbow along
the knot and shaded by a fixed light, so a correct render is recognisable at a glance
(and a broken one is not). Everything is generated from a seeded CPU generator, so the
scene is identical on every machine and device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional

import torch

#: Depth of the knot's centre in front of the camera (world units).
KNOT_DEPTH = 20.0
#: Radius of the tube the spheres sit on (world units).
TUBE_RADIUS = 0.55
#: Spheres around the tube per ring.
RING_SIZE = 12


@dataclass
class SampleScene:
    """Spheres, camera and render settings of the sample scene.

    Attributes:
        positions: [N, 3] sphere centres (world units).
        colours: [N, 3] RGB in [0, 1].
        radii: [N] sphere radii (world units).
        opacity: [N] in [0, 1], or None (all opaque).
        cam_params: [8] Pulsar camera vector: position (3), axis-angle rotation (3),
            focal length, sensor width (world units).
        bg_col: [3] background colour.
        width, height: image size in pixels.
        gamma, max_depth, min_depth, percent_allowed_difference: render settings
            (Pulsar's meaning; min_depth 0 means focal length + 2e-6).
    """

    positions: torch.Tensor
    colours: torch.Tensor
    radii: torch.Tensor
    opacity: Optional[torch.Tensor]
    cam_params: torch.Tensor
    bg_col: torch.Tensor
    width: int
    height: int
    gamma: float = 0.01
    max_depth: float = 30.0
    min_depth: float = 0.0
    percent_allowed_difference: float = 0.01

    @property
    def n_spheres(self) -> int:
        return int(self.positions.shape[0])

    def to(self, device: Any = None, dtype: Optional[torch.dtype] = None) -> "SampleScene":
        """A copy with every tensor moved to ``device`` and cast to ``dtype``."""

        def move(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else t.to(device=device, dtype=dtype)

        return replace(
            self,
            positions=move(self.positions),
            colours=move(self.colours),
            radii=move(self.radii),
            opacity=move(self.opacity),
            cam_params=move(self.cam_params),
            bg_col=move(self.bg_col),
        )

    def render_kwargs(self) -> Dict[str, Any]:
        """Keyword arguments of ``Renderer.forward`` for this scene."""
        return dict(
            vert_pos=self.positions,
            vert_col=self.colours,
            vert_rad=self.radii,
            cam_params=self.cam_params,
            gamma=self.gamma,
            max_depth=self.max_depth,
            min_depth=self.min_depth,
            bg_col=self.bg_col,
            opacity=self.opacity,
            percent_allowed_difference=self.percent_allowed_difference,
        )


def _trefoil(t: torch.Tensor) -> torch.Tensor:
    """Points on a trefoil knot, [T] -> [T, 3] (extent about 3 world units)."""
    return torch.stack(
        [torch.sin(t) + 2 * torch.sin(2 * t), torch.cos(t) - 2 * torch.cos(2 * t), -torch.sin(3 * t)], dim=-1
    )


def _trefoil_derivatives(t: torch.Tensor):
    """First and second derivatives of ``_trefoil`` with respect to t, each [T, 3]."""
    d1 = torch.stack(
        [torch.cos(t) + 4 * torch.cos(2 * t), -torch.sin(t) + 4 * torch.sin(2 * t), -3 * torch.cos(3 * t)], dim=-1
    )
    d2 = torch.stack(
        [-torch.sin(t) - 8 * torch.sin(2 * t), -torch.cos(t) + 8 * torch.cos(2 * t), 9 * torch.sin(3 * t)], dim=-1
    )
    return d1, d2


def _hue_to_rgb(hue: torch.Tensor, saturation: float = 0.75) -> torch.Tensor:
    """HSV (value 1) -> RGB for hue in [0, 1). [T] -> [T, 3]."""
    k = torch.stack([(5 + hue * 6) % 6, (3 + hue * 6) % 6, (1 + hue * 6) % 6], dim=-1)
    ramp = torch.clamp(torch.minimum(k, 4 - k), 0, 1)
    return 1 - saturation * ramp


def _rotation_matrix(axis_angle) -> torch.Tensor:
    """Rodrigues' formula for a fixed axis-angle vector (3 floats) -> [3, 3] float64."""
    v = torch.tensor(axis_angle, dtype=torch.float64)
    angle = float(v.norm())
    k = v / angle
    kx = torch.tensor([[0, -k[2], k[1]], [k[2], 0, -k[0]], [-k[1], k[0], 0]], dtype=torch.float64)
    return torch.eye(3, dtype=torch.float64) + math.sin(angle) * kx + (1 - math.cos(angle)) * (kx @ kx)


def make_sample_scene(
    width: int = 512,
    height: int = 384,
    n_spheres: int = 4800,
    seed: int = 0,
    device: Any = "cpu",
    dtype: torch.dtype = torch.float32,
) -> SampleScene:
    """Build the sample scene: a rainbow trefoil knot of ``n_spheres`` shaded spheres.

    The knot is centred ``KNOT_DEPTH`` in front of a camera at the origin looking along
    +z; the sensor width is chosen so that the knot fills the image whatever its aspect
    ratio. Deterministic: the same arguments give the same tensors on every machine.

    Args:
        width, height: image size in pixels (>= 1).
        n_spheres: number of spheres (>= RING_SIZE); rounded down to whole rings.
        seed: seed of the CPU generator for the small jitter of positions and radii.
        device, dtype: where and as what the tensors are returned.
    """
    if not isinstance(width, int) or not isinstance(height, int) or width < 1 or height < 1:
        raise ValueError(f"width, height: expected positive integers, got {width!r}, {height!r}")
    if not isinstance(n_spheres, int) or n_spheres < RING_SIZE:
        raise ValueError(f"n_spheres: expected an integer >= {RING_SIZE}, got {n_spheres!r}")
    gen = torch.Generator().manual_seed(seed)
    rings = n_spheres // RING_SIZE
    f64 = torch.float64
    # Ring k sits at parameter t_k; its spheres at angles phi_j around the tube, every
    # other ring turned by half a step so that the spheres interlock.
    t = torch.arange(rings, dtype=f64) * (2 * math.pi / rings)
    phi = (torch.arange(RING_SIZE, dtype=f64)[None, :] + 0.5 * (torch.arange(rings) % 2)[:, None]) * (
        2 * math.pi / RING_SIZE
    )
    centre = _trefoil(t)
    d1, d2 = _trefoil_derivatives(t)
    tangent = torch.nn.functional.normalize(d1, dim=-1)
    # Frenet normal: the part of the second derivative orthogonal to the tangent (the
    # trefoil's curvature never vanishes), and the binormal completing the frame.
    normal = torch.nn.functional.normalize(d2 - (d2 * tangent).sum(-1, keepdim=True) * tangent, dim=-1)
    binormal = torch.cross(tangent, normal, dim=-1)
    surface_normal = (
        torch.cos(phi)[..., None] * normal[:, None, :] + torch.sin(phi)[..., None] * binormal[:, None, :]
    )  # [rings, RING_SIZE, 3]
    jitter = 0.04 * (torch.rand(rings, RING_SIZE, 3, generator=gen, dtype=f64) - 0.5)
    positions = centre[:, None, :] + TUBE_RADIUS * surface_normal + jitter
    radii = 0.2 * (0.85 + 0.3 * torch.rand(rings, RING_SIZE, generator=gen, dtype=f64))

    # Tilt the knot so that its crossings overlap in depth, then place it in front of
    # the camera; normals turn with it.
    rotation = _rotation_matrix([0.5, -0.35, 0.15])
    positions = positions @ rotation.T + torch.tensor([0.0, 0.5, KNOT_DEPTH], dtype=f64)
    surface_normal = surface_normal @ rotation.T

    # Colour: rainbow along the knot, Lambert-shaded by a light up-left of the camera.
    to_light = torch.nn.functional.normalize(torch.tensor([-0.5, 0.6, -0.65], dtype=f64), dim=0)
    lambert = (surface_normal @ to_light).clamp_min(0.0)
    base = _hue_to_rgb((t / (2 * math.pi))[:, None].expand(rings, RING_SIZE))
    colours = base * (0.3 + 0.7 * lambert)[..., None]

    # Sensor width (world units) so that a square of side 2 * extent at the knot's depth
    # fits into the shorter image side; focal length 1.
    focal, extent = 1.0, 4.4
    sensor_width = 2 * focal * extent / KNOT_DEPTH * max(1.0, width / height)
    cam_params = torch.tensor([0, 0, 0, 0, 0, 0, focal, sensor_width], dtype=f64)
    scene = SampleScene(
        positions=positions.reshape(-1, 3),
        colours=colours.reshape(-1, 3).clamp(0, 1),
        radii=radii.reshape(-1),
        opacity=None,
        cam_params=cam_params,
        bg_col=torch.tensor([0.07, 0.08, 0.11], dtype=f64),
        width=width,
        height=height,
    )
    return scene.to(device=device, dtype=dtype)
