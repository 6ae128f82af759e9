"""Cameras and scenes for the camera, render-output, SH and visibility tests: random
cameras with OpenCV intrinsics, spheres placed at chosen pixels and depths through a
camera, silhouette margins, and the small scenes of the camera-gradient checks."""

from __future__ import annotations

import torch

from pulsar_py import Camera
from pulsar_py.cameras.params import NativeCamera
from pulsar_py.cameras.rotations import axis_angle_to_matrix, matrix_to_rotation

F64 = torch.float64


def uniform(gen: torch.Generator, low: float, high: float, shape=()) -> torch.Tensor:
    return low + (high - low) * torch.rand(tuple(shape), generator=gen, dtype=F64)


def random_rotation(gen: torch.Generator, scale: float = 0.5) -> torch.Tensor:
    """[3, 3] rotation of a random axis-angle vector with entries in [-scale, scale]."""
    return axis_angle_to_matrix(uniform(gen, -scale, scale, (1, 3)))[0]


def random_intrinsics(gen: torch.Generator, width: int, height: int, orthographic: bool = False):
    """fx != fy and a non-integer principal point near the image centre."""
    scale = 1.0 if orthographic else width
    fx = float(uniform(gen, 0.9, 1.3)) * scale * (8.0 if orthographic else 1.0)
    fy = fx * float(uniform(gen, 0.75, 0.9))
    cx = (width - 1) / 2 + float(uniform(gen, -2.0, 2.0)) + 0.37
    cy = (height - 1) / 2 + float(uniform(gen, -1.5, 1.5)) - 0.29
    return fx, fy, cx, cy


def random_camera(
    seed: int,
    width: int = 20,
    height: int = 15,
    orthographic: bool = False,
    right_handed: bool = True,
    rotation_repr: str = "matrix",
) -> Camera:
    """An unbatched float64 camera with a random pose and intrinsics."""
    gen = torch.Generator().manual_seed(seed)
    fx, fy, cx, cy = random_intrinsics(gen, width, height, orthographic)
    rotation = matrix_to_rotation(random_rotation(gen), rotation_repr)
    translation = uniform(gen, -0.5, 0.5, (3,))
    return Camera(
        rotation,
        translation,
        fx,
        fy,
        cx,
        cy,
        (height, width),
        rotation_repr=rotation_repr,
        orthographic=orthographic,
        right_handed=right_handed,
    )


def unproject(camera: Camera, uv: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """World points [n, 3] at pixel coordinates uv [n, 2] and camera depth z [n] (camera 0)."""
    fx, fy, cx, cy = camera.fx[0], camera.fy[0], camera.cx[0], camera.cy[0]
    x, y = (uv[:, 0] - cx) / fx, (uv[:, 1] - cy) / fy
    if not camera.orthographic:
        x, y = x * z, y * z
    x_cam = torch.stack([x, y, z], -1)
    axes = camera.world_to_camera()[0]
    return (x_cam - camera.translation[0]) @ axes  # A^T (x_cam - t), row vectors


def place_spheres(
    camera: Camera, gen: torch.Generator, n: int, radius_px=(2.0, 5.0), depth=(2.0, 5.0), margin: float = 0.1
):
    """Centres [n, 3] and radii [n] of spheres at random pixels (partly off-screen by
    ``margin`` of the image size) and camera depths, of projected radius ``radius_px``."""
    height, width = camera.image_size
    u = uniform(gen, -margin * width, (1 + margin) * width - 1, (n,))
    v = uniform(gen, -margin * height, (1 + margin) * height - 1, (n,))
    z = uniform(gen, *depth, (n,))
    pos = unproject(camera, torch.stack([u, v], -1), z)
    focal_px = (camera.fx[0] * camera.fy[0]).sqrt()
    r_px = uniform(gen, *radius_px, (n,))
    rad = r_px / focal_px if camera.orthographic else r_px * z / focal_px
    return pos, rad


def sphere_attributes(gen: torch.Generator, n: int, channels: int = 3):
    """Features [n, C], opacities [n] in [0.3, 0.9]."""
    return uniform(gen, 0.0, 1.0, (n, channels)), uniform(gen, 0.3, 0.9, (n,))


def silhouette_margin(native: NativeCamera, pos: torch.Tensor, rad: torch.Tensor, width: int, height: int) -> float:
    """min |delta - r| / r over pixels and spheres (camera 0, unbatched spheres): finite
    differences need silhouettes well away from pixel centres."""
    cols, rows = torch.arange(width, dtype=pos.dtype), torch.arange(height, dtype=pos.dtype)
    jj, ii = torch.meshgrid(rows, cols, indexing="ij")
    film = native.p00_rel[0] + ii.reshape(-1, 1) * native.pdx[0] + jj.reshape(-1, 1) * native.pdy[0]  # [P, 3]
    c = pos.detach() - native.eye[0].detach()
    if native.orthographic:
        axis = native.optical_axis()[0].detach()
        rel = c[:, None, :] - film.detach()[None]
        delta = (rel - (rel @ axis)[..., None] * axis).norm(dim=-1)
    else:
        ray = torch.nn.functional.normalize(film.detach(), dim=-1)
        t = c.norm(dim=-1)
        delta = (c[:, None, :] - t[:, None, None] * ray[None]).norm(dim=-1)
    r = rad.detach()[:, None]
    return float(((delta - r).abs() / r).min())


def fixed_weights(shape, seed: int = 5, dtype=F64, device="cpu") -> torch.Tensor:
    """A fixed random upstream gradient."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(tuple(shape), generator=gen, dtype=F64) * 2 - 1).to(dtype=dtype, device=device)


def assert_nonzero(grads: dict) -> None:
    for name, g in grads.items():
        assert g is not None, f"{name}: no gradient"
        assert bool(torch.isfinite(g).all()), f"{name}: non-finite gradient"
        assert float(g.abs().max()) > 0, f"{name}: zero gradient"


def centroids(image: torch.Tensor) -> torch.Tensor:
    """Intensity centroids (u, v) [B, 2] of channel 0 of images [B, H, W, C]."""
    intensity = image[..., 0].double()
    height, width = intensity.shape[-2:]
    rows = torch.arange(height, dtype=F64, device=image.device)
    cols = torch.arange(width, dtype=F64, device=image.device)
    total = intensity.sum((-1, -2))
    u = (intensity * cols).sum((-1, -2)) / total
    v = (intensity * rows[:, None]).sum((-1, -2)) / total
    return torch.stack([u, v], -1)


GRADIENT_KINDS = {
    "perspective": dict(),
    "orthographic": dict(orthographic=True),
    "left_handed": dict(right_handed=False),
}


def gradient_setup(kind: str, rotation_repr: str, seed: int = 21):
    """A camera of the kind and parametrisation and 6 spheres it sees, on a 16x12 image
    (silhouettes kept away from pixel centres, asserted)."""
    width, height = 16, 12
    camera = random_camera(seed, width, height, rotation_repr=rotation_repr, **GRADIENT_KINDS[kind])
    gen = torch.Generator().manual_seed(seed + 1)
    for _ in range(20):  # the first placement whose silhouettes miss pixel centres
        pos, rad = place_spheres(camera, gen, 6, radius_px=(1.5, 4.0), margin=0.0)
        if silhouette_margin(camera.native(width, height), pos, rad, width, height) > 1e-3:
            break
    else:
        raise AssertionError("no scene with silhouettes away from pixel centres")
    col, opacity = sphere_attributes(gen, 6)
    return camera, pos, rad, col, opacity
