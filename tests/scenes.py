"""Random small scenes shared by the reference, batch, API and gradient tests.

A scene is placed through its own camera: sphere centres are drawn at random film
positions (partly off-screen) and depths inside the depth range, and radii are chosen in
pixels, so every scene draws something whatever the camera's pose, projection,
handedness or principal point. Everything is generated in float64 on the CPU from a
seeded generator; ``Scene.call_kwargs`` converts to the dtype and device under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import torch

import pulsar_py
from pulsar_py.cameras.params import NativeCamera, camera_from_params
from pulsar_py.cameras.rotations import axis_angle_to_matrix
from pulsar_py.reference import ReferenceResult, render_reference

F64 = torch.float64


@dataclass
class Scene:
    """One Renderer configuration plus the arguments of one forward call.

    Tensors are float64 on the CPU. Spheres are [N, ...] (shared) or [B, N, ...]
    (batched); ``cam_params`` is [L] or [B, L].
    """

    width: int
    height: int
    n_channels: int
    orthographic: bool
    right_handed: bool
    n_track: int
    beta: float
    vert_pos: torch.Tensor
    vert_col: torch.Tensor
    vert_rad: torch.Tensor
    opacity: Optional[torch.Tensor]
    bg_col: Optional[torch.Tensor]
    cam_params: torch.Tensor
    gamma: float
    max_depth: float
    min_depth: float
    percent_allowed_difference: float = 0.0
    max_n_hits: Optional[int] = None
    first_R_then_T: bool = False
    description: str = field(default="", compare=False)

    TENSOR_NAMES = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")

    @property
    def batch_size(self) -> Optional[int]:
        """B when spheres or cameras are batched, else None."""
        if self.vert_pos.dim() == 3:
            return self.vert_pos.shape[0]
        if self.cam_params.dim() == 2:
            return self.cam_params.shape[0]
        return None

    def renderer(self, device: str = "cpu", **overrides) -> pulsar_py.Renderer:
        kwargs = dict(
            width=self.width,
            height=self.height,
            orthogonal_projection=self.orthographic,
            right_handed_system=self.right_handed,
            background_normalized_depth=self.beta,
            n_channels=self.n_channels,
            n_track=self.n_track,
        )
        kwargs.update(overrides)
        return pulsar_py.Renderer(**kwargs).to(device)

    def tensors(self, dtype: torch.dtype = F64, device: str = "cpu") -> dict:
        """The tensor arguments (None where absent), converted, fresh leaves."""
        out = {}
        for name in self.TENSOR_NAMES:
            t = getattr(self, name)
            out[name] = None if t is None else t.detach().to(dtype=dtype, device=device).clone()
        return out

    def settings(self) -> dict:
        """The non-tensor arguments of Renderer.forward."""
        return dict(
            gamma=self.gamma,
            max_depth=self.max_depth,
            min_depth=self.min_depth,
            percent_allowed_difference=self.percent_allowed_difference,
            max_n_hits=self.max_n_hits,
            first_R_then_T=self.first_R_then_T,
        )

    def call_kwargs(self, dtype: torch.dtype = F64, device: str = "cpu", tensors: Optional[dict] = None) -> dict:
        """Keyword arguments of Renderer.forward; ``tensors`` overrides the tensors."""
        kwargs = self.tensors(dtype, device) if tensors is None else dict(tensors)
        kwargs.update(self.settings())
        return kwargs

    def item(self, b: int) -> "Scene":
        """Batch item b as an unbatched scene."""
        pick = lambda t, dims: t[b] if (t is not None and t.dim() == dims) else t  # noqa: E731
        return replace(
            self,
            vert_pos=pick(self.vert_pos, 3),
            vert_col=pick(self.vert_col, 3),
            vert_rad=pick(self.vert_rad, 2),
            opacity=pick(self.opacity, 2),
            cam_params=pick(self.cam_params, 2),
        )

    def camera(self, cam_params: Optional[torch.Tensor] = None) -> NativeCamera:
        """The native camera of one (unbatched) cam_params vector."""
        cam = self.cam_params if cam_params is None else cam_params
        assert cam.dim() == 1, "camera() takes one camera; use item(b) for batches"
        return camera_from_params(
            cam[None], self.width, self.height, self.orthographic, self.right_handed, self.first_R_then_T
        )

    def reference(self, tensors: Optional[dict] = None) -> ReferenceResult:
        """Reference render of an unbatched scene (differentiable in ``tensors``)."""
        t = self.tensors() if tensors is None else tensors
        return render_reference(
            t["vert_pos"],
            t["vert_col"],
            t["vert_rad"],
            self.camera(t["cam_params"]),
            self.width,
            self.height,
            self.gamma,
            self.max_depth,
            self.min_depth,
            bg_col=t["bg_col"],
            opacity=t["opacity"],
            background_normalized_depth=self.beta,
            percent_allowed_difference=self.percent_allowed_difference,
            max_n_hits=self.max_n_hits,
            n_track=self.n_track,
        )


def _uniform(gen: torch.Generator, low: float, high: float, shape: Sequence[int] = ()) -> torch.Tensor:
    return low + (high - low) * torch.rand(tuple(shape), generator=gen, dtype=F64)


def _random_cam_params(gen: torch.Generator, cam_length: int, orthographic: bool, width: int) -> torch.Tensor:
    """[L] a random Pulsar camera vector with a moderate rotation."""
    position = _uniform(gen, -0.5, 0.5, (3,))
    axis_angle = _uniform(gen, -0.5, 0.5, (3,))
    if cam_length in (11, 13):
        # 6D: two non-orthonormal rows whose Gram-Schmidt is a random rotation.
        rows = camera_params_rotation(axis_angle)
        rotation = torch.cat([rows[0] * _uniform(gen, 0.7, 1.5), rows[1] * _uniform(gen, 0.7, 1.5) + 0.2 * rows[0]])
    else:
        rotation = axis_angle
    if orthographic:
        focal, sensor = torch.zeros(()), _uniform(gen, 2.0, 4.0)
    else:
        focal = _uniform(gen, 0.1, 0.5)
        sensor = focal * _uniform(gen, 0.7, 1.4)  # horizontal field of view ~40-70 degrees
    parts = [position, rotation, focal.reshape(1).to(F64), sensor.reshape(1)]
    if cam_length in (10, 13):
        # Non-integer principal-point offsets in pixels.
        parts.append(_uniform(gen, -0.15, 0.15, (2,)) * width + 0.37)
    return torch.cat(parts)


def camera_params_rotation(axis_angle: torch.Tensor) -> torch.Tensor:
    """[3, 3] rotation matrix of an axis-angle vector [3]."""
    return axis_angle_to_matrix(axis_angle[None])[0]


def place_spheres(
    gen: torch.Generator,
    camera: NativeCamera,
    width: int,
    height: int,
    near: float,
    far: float,
    n: int,
    radius_px: tuple,
    film_margin: float = 0.15,
) -> tuple:
    """Centres [n, 3] and radii [n] of spheres seen by ``camera`` (batch size 1).

    Film positions are uniform over the image widened by ``film_margin`` on every side
    (some spheres are partly off-screen); the projected radius is uniform in
    ``radius_px`` pixels; the closest depth lies inside (near, far).
    """
    eye, p00, pdx, pdy = camera.eye[0], camera.p00[0], camera.pdx[0], camera.pdy[0]
    axis = camera.optical_axis()[0]
    u = _uniform(gen, -film_margin * width, (1 + film_margin) * width - 1, (n,))
    v = _uniform(gen, -film_margin * height, (1 + film_margin) * height - 1, (n,))
    sensor = p00 + u[:, None] * pdx + v[:, None] * pdy  # [n, 3]
    r_px = _uniform(gen, radius_px[0], radius_px[1], (n,))
    pixel = float(pdx.norm())
    span = far - near
    if camera.orthographic:
        radius = r_px * pixel
        depth = _uniform(gen, near + 0.05 * span, far - 0.1 * span, (n,)) + radius
        centres = sensor + depth[:, None] * axis
    else:
        focal = float(camera.focal[0])
        ray = torch.nn.functional.normalize(sensor - eye, dim=-1)
        dist = _uniform(gen, near + 0.05 * span, far - 0.1 * span, (n,))
        radius = r_px * pixel * dist / focal
        centres = eye + (dist + radius)[:, None] * ray
    return centres, radius


def random_scene(
    seed: int,
    *,
    width: int = 24,
    height: int = 18,
    n_spheres: int = 12,
    n_channels: int = 3,
    orthographic: bool = False,
    right_handed: bool = False,
    cam_length: int = 8,
    first_R_then_T: bool = False,
    with_opacity: bool = True,
    opacity_range: tuple = (0.2, 1.0),
    with_bg: bool = True,
    gamma: float = 0.1,
    min_depth: Optional[float] = None,
    percent_allowed_difference: float = 0.0,
    max_n_hits: Optional[int] = None,
    n_track: int = 5,
    beta: float = 1e-6,
    radius_px: tuple = (2.0, 6.0),
    n_tiny: int = 0,
    n_culled: int = 0,
    film_margin: float = 0.15,
    batch: Optional[int] = None,
    shared_spheres: bool = False,
    shared_camera: bool = False,
) -> Scene:
    """A random scene that draws something.

    Args:
        seed: generator seed (the scene is a pure function of the arguments).
        min_depth: None picks focal + 0.3 (perspective) / 0.3 (orthographic); 0 uses
            the "focal + 2e-6" rule.
        n_tiny: extra spheres of projected radius 0.2-0.9 px (the tiny-sphere rule).
        n_culled: extra spheres culled by the near or far plane (alternating).
        batch: B for batched inputs; ``shared_spheres`` keeps spheres [N, ...] with B
            cameras, ``shared_camera`` keeps one camera with B sphere sets.
    """
    gen = torch.Generator().manual_seed(seed)
    n_cams = 1 if (batch is None or shared_camera) else batch
    n_sets = 1 if (batch is None or shared_spheres) else batch
    cams = torch.stack([_random_cam_params(gen, cam_length, orthographic, width) for _ in range(n_cams)])
    focal = float(cams[0, 9 if cam_length in (11, 13) else 6])
    if min_depth is None:
        min_depth = focal + 0.3
    near = focal + 2e-6 if min_depth == 0 else min_depth
    max_depth = near + float(_uniform(gen, 4.0, 8.0))
    # Spheres are placed through the first camera; other cameras of a batch are near it.
    camera = camera_from_params(cams[:1], width, height, orthographic, right_handed, first_R_then_T)
    sets = []
    for _ in range(n_sets):
        pos, rad = place_spheres(gen, camera, width, height, near, max_depth, n_spheres, radius_px, film_margin)
        if n_tiny:
            tp, tr = place_spheres(gen, camera, width, height, near, max_depth, n_tiny, (0.2, 0.9), 0.0)
            pos, rad = torch.cat([pos, tp]), torch.cat([rad, tr])
        if n_culled:
            cp, cr = place_spheres(gen, camera, width, height, near, max_depth, n_culled, (3.0, 6.0), 0.0)
            cp, cr = _push_out_of_depth_range(camera, cp, cr, near, max_depth)
            pos, rad = torch.cat([pos, cp]), torch.cat([rad, cr])
        sets.append((pos, rad))
    n_total = sets[0][0].shape[0]
    pos = torch.stack([s[0] for s in sets])
    rad = torch.stack([s[1] for s in sets])
    col = _uniform(gen, 0.0, 1.0, (n_sets, n_total, n_channels))
    opacity = _uniform(gen, *opacity_range, (n_sets, n_total)) if with_opacity else None
    bg = _uniform(gen, 0.0, 1.0, (n_channels,)) if with_bg else None
    if n_cams > 1:
        # Other cameras: the first one moved a little (keeps the spheres in view).
        jitter = torch.zeros_like(cams)
        jitter[1:, :3] = _uniform(gen, -0.05, 0.05, (n_cams - 1, 3))
        jitter[1:, 3:6] = _uniform(gen, -0.05, 0.05, (n_cams - 1, 3))
        cams = torch.cat([cams[:1], cams[:1].expand(n_cams - 1, -1)]) + jitter
    squeeze_spheres = n_sets == 1 and (batch is None or shared_spheres)
    squeeze_cams = n_cams == 1 and (batch is None or shared_camera)
    sq = lambda t, yes: None if t is None else (t[0] if yes else t)  # noqa: E731
    kind = "ortho" if orthographic else "persp"
    description = (
        f"seed={seed} {kind} {'rh' if right_handed else 'lh'} L={cam_length} C={n_channels} "
        f"N={n_total} gamma={gamma:g} B={batch}"
    )
    return Scene(
        width=width,
        height=height,
        n_channels=n_channels,
        orthographic=orthographic,
        right_handed=right_handed,
        n_track=n_track,
        beta=beta,
        vert_pos=sq(pos, squeeze_spheres),
        vert_col=sq(col, squeeze_spheres),
        vert_rad=sq(rad, squeeze_spheres),
        opacity=sq(opacity, squeeze_spheres),
        bg_col=bg,
        cam_params=sq(cams, squeeze_cams),
        gamma=gamma,
        max_depth=max_depth,
        min_depth=min_depth,
        percent_allowed_difference=percent_allowed_difference,
        max_n_hits=max_n_hits,
        first_R_then_T=first_R_then_T,
        description=description,
    )


def _push_out_of_depth_range(
    camera: NativeCamera, pos: torch.Tensor, rad: torch.Tensor, near: float, far: float
) -> tuple:
    """Move spheres along their view rays so that they are culled: even indices poke
    through the near plane (centre in front, closest depth < near), odd ones lie beyond far.
    """
    eye = camera.eye[0]
    axis = camera.optical_axis()[0]
    pos = pos.clone()
    for i in range(pos.shape[0]):
        if camera.orthographic:
            direction = axis
            depth = float((pos[i] - eye) @ axis)
        else:
            direction = torch.nn.functional.normalize(pos[i] - eye, dim=0)
            depth = float((pos[i] - eye).norm())
        r = float(rad[i])
        if i % 2 == 0:
            target = near + 0.5 * r  # centre beyond near, but closest depth = target - r < near
        else:
            target = far + 1.5 * r  # closest depth = target - r > far
        pos[i] = pos[i] + (target - depth) * direction
    return pos, rad


def pixel_deltas(
    scene: Scene, cam_params: Optional[torch.Tensor] = None, vert_pos: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """delta of model.md section 4 for every sphere and pixel: [N, H, W] (unbatched scene)."""
    cam = scene.camera(cam_params)
    pos = scene.vert_pos if vert_pos is None else vert_pos
    eye, p00, pdx, pdy = cam.eye[0], cam.p00[0], cam.pdx[0], cam.pdy[0]
    cols = torch.arange(scene.width, dtype=F64)
    rows = torch.arange(scene.height, dtype=F64)
    jj, ii = torch.meshgrid(rows, cols, indexing="ij")
    sensor = p00 + ii.reshape(-1, 1) * pdx + jj.reshape(-1, 1) * pdy  # [P, 3]
    if scene.orthographic:
        axis = cam.optical_axis()[0]
        rel = pos[:, None, :] - sensor[None]  # [N, P, 3]
        delta = (rel - (rel @ axis)[..., None] * axis).norm(dim=-1)
    else:
        c = pos - eye  # [N, 3]
        ray = torch.nn.functional.normalize(sensor - eye, dim=-1)
        t = c.norm(dim=-1)
        delta = (c[:, None, :] - t[:, None, None] * ray[None]).norm(dim=-1)
    return delta.reshape(-1, scene.height, scene.width)


def min_silhouette_distance(scene: Scene) -> float:
    """Smallest |delta - r| / r over all pixel-sphere pairs (unbatched scene).

    Finite-difference checks need it well above the step size: the blend weight has a
    kink where a silhouette crosses a pixel centre.
    """
    delta = pixel_deltas(scene)
    r = scene.vert_rad[:, None, None]
    return float(((delta - r).abs() / r).min())


def grad_output_like(image: torch.Tensor, seed: int = 1234) -> torch.Tensor:
    """A fixed random upstream gradient of the image's shape, dtype and device."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.rand(tuple(image.shape), generator=gen, dtype=F64) * 2 - 1
    return g.to(dtype=image.dtype, device=image.device)


def scene_in_front(seed: int, n: int, dtype: torch.dtype, requires_grad: bool) -> list:
    """Fresh leaves [positions [n, 3], colours [n, 3], radii [n], opacities [n], camera
    vector [8]] of n random spheres in front of the camera [0.1, -0.1, 0, 0.02, -0.03,
    0.01, 4, 2] (x in [-2, 2], y in [-1.5, 1.5], z in [8, 10])."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, 3, generator=g, dtype=dtype) * torch.tensor([4.0, 3.0, 2.0], dtype=dtype) + torch.tensor(
        [-2.0, -1.5, 8.0], dtype=dtype
    )
    col = torch.rand(n, 3, generator=g, dtype=dtype)
    rad = 0.2 + 0.4 * torch.rand(n, generator=g, dtype=dtype)
    opa = 0.2 + 0.8 * torch.rand(n, generator=g, dtype=dtype)
    cam = torch.tensor([0.1, -0.1, 0.0, 0.02, -0.03, 0.01, 4.0, 2.0], dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (pos, col, rad, opa, cam)]
