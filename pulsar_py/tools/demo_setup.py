"""The demo's problem: settings, ground-truth scene, perturbed start, what is optimised.

See ``pulsar_py.demo`` for the optimisation and the command line. The scene is the
built-in rainbow trefoil knot (``sample_scene``) centred at the origin, standing over a
checkered floor of spheres, seen by ``views`` cameras around it. View 0 is the camera
being calibrated; the others are reference cameras with known poses, which fix the world
frame (otherwise moving everything rigidly would leave every image unchanged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Tuple

import torch

from ..cameras.look_at import look_at_matrix, rotation_angle_deg, rotation_from_params, sensor_width_for_fov
from ..cameras.rotations import axis_angle_to_matrix, matrix_to_rotation_6d
from .sample_scene import KNOT_DEPTH, make_sample_scene

#: Where ``make_sample_scene`` puts the knot's centre; the demo moves it to the origin.
_KNOT_CENTRE = (0.0, 0.5, KNOT_DEPTH)


@dataclass
class DemoSettings:
    """Every knob of the demo; the defaults take about 3 minutes on 2 CPU cores
    (docs/images/demo_record_cpu.json).

    Perturbation sizes: ``rotation_error_deg`` (degrees, about a random axis through the
    camera centre), ``translation_error`` (world units, random direction),
    ``focal_error`` (relative, random sign); spheres: ``position_noise`` (world units,
    standard deviation per coordinate), ``radius_noise`` (standard deviation of the log
    of a mean-1 factor), ``colour_noise`` (standard deviation added per channel after
    mixing ``colour_fade`` of mid-grey in).
    """

    width: int = 160
    height: int = 120
    #: Spheres on the knot (rounded down to whole rings of 12); the floor adds about 2000.
    n_spheres: int = 3000
    #: A checkered floor of spheres under the knot (radius and grid spacing, world
    #: units; radius 0: no floor). Its texture gives the camera gradients all over the
    #: lower half of the image (silhouettes against the far background give almost none).
    floor_radius: float = 7.0
    floor_spacing: float = 0.3
    views: int = 3
    steps: int = 400
    seed: int = 0
    #: Pulsar's blending softness. 0.1 keeps silhouettes soft enough for the pose to
    #: get gradients: the background sits at the far end of the depth range, and with a
    #: small gamma a sphere's edge against it is practically a step (no gradient).
    gamma: float = 0.1
    camera_distance: float = 13.0
    horizontal_fov_deg: float = 50.0
    min_depth: float = 5.0
    max_depth: float = 24.0
    rotation_error_deg: float = 8.0
    translation_error: float = 0.6
    focal_error: float = 0.06
    position_noise: float = 0.08
    radius_noise: float = 0.3
    colour_fade: float = 0.5
    colour_noise: float = 0.1
    #: Frames of optimisation.gif (about evenly spaced over the steps, plus the end).
    gif_frames: int = 40
    #: Coarse to fine: the loss compares Gaussian-blurred images, the blur's standard
    #: deviation (pixels at 160 pixels image width; it scales with the width) falling
    #: linearly from ``blur_start_px`` to 0 at ``blur_end_fraction`` of the steps.
    #: Blurred, a misplaced structure still overlaps its target, so the gradient says
    #: "move there" rather than only "fade out here".
    blur_start_px: float = 8.0
    blur_end_fraction: float = 0.5
    #: Weight of view 0's gradient on the spheres: 0 until ``trust_start_fraction`` of
    #: the steps, then rising linearly to 1 at ``trust_full_fraction``. While view 0's
    #: pose is still wrong, its image would bend the spheres to fit the wrong pose; the
    #: reference views shape the spheres meanwhile, and view 0's camera always gets its
    #: full gradient. From ``trust_full_fraction`` on, the run optimises the plain joint loss.
    trust_start_fraction: float = 0.5
    trust_full_fraction: float = 0.8
    #: Adam learning rates per parameter group (about the step size per iteration, in
    #: the group's units).
    learning_rates: Dict[str, float] = field(
        default_factory=lambda: {
            "camera_rotation": 3e-3,  # radians
            "camera_offset": 2e-2,  # world units
            "camera_log_focal": 3e-3,  # log of the focal length
            "sphere_position": 3e-3,  # world units
            "sphere_colour": 1e-2,  # colour units (RGB in [0, 1])
            "sphere_log_radius": 1e-2,  # log of the radius
        }
    )
    #: Every learning rate stays constant until ``decay_start_fraction`` of the steps,
    #: then decays (cosine) to ``final_lr_fraction`` of its start at the end.
    decay_start_fraction: float = 0.5
    final_lr_fraction: float = 0.05

    def check(self) -> None:
        """ValueError naming the first setting out of range."""
        for name in ("width", "height", "n_spheres", "views", "steps", "gif_frames"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive integer, got {value!r}")
        if self.views < 2:
            raise ValueError(f"views: expected at least 2 (view 0 and a reference view), got {self.views}")
        if self.n_spheres < 12:
            raise ValueError(f"n_spheres: expected at least 12 (one ring of the knot), got {self.n_spheres}")
        if not 1e-5 <= self.gamma <= 1:
            raise ValueError(f"gamma: expected a value in [1e-5, 1], got {self.gamma}")
        missing = {
            "camera_rotation",
            "camera_offset",
            "camera_log_focal",
            "sphere_position",
            "sphere_colour",
            "sphere_log_radius",
        } - set(self.learning_rates)
        if missing:
            raise ValueError(f"learning_rates: missing groups {sorted(missing)}")


@dataclass
class DemoScene:
    """Ground truth (float32, on the demo's device). cam_params [V, 11]: position, 6D
    rotation, focal length, sensor width (Pulsar's 11-value camera vectors)."""

    positions: torch.Tensor  # [N, 3] world units
    colours: torch.Tensor  # [N, 3] RGB in [0, 1]
    radii: torch.Tensor  # [N] world units
    cam_params: torch.Tensor  # [V, 11]
    bg_col: torch.Tensor  # [3]


def make_floor(radius: float, spacing: float, height: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A checkered disc of spheres in the plane y = ``height``: a hexagonal grid of
    ``spacing`` (world units) within ``radius`` of the y axis, squares of 1.2 units.
    Returns positions [M, 3], colours [M, 3], radii [M] (float64)."""
    rows = int(math.ceil(radius / (spacing * math.sqrt(3) / 2)))
    cols = int(math.ceil(radius / spacing)) + 1
    j, i = torch.meshgrid(
        torch.arange(-rows, rows + 1, dtype=torch.float64),
        torch.arange(-cols, cols + 1, dtype=torch.float64),
        indexing="ij",
    )
    x = (i + 0.5 * (j % 2)) * spacing
    z = j * spacing * math.sqrt(3) / 2
    keep = (x * x + z * z) <= radius * radius
    x, z = x[keep], z[keep]
    positions = torch.stack([x, torch.full_like(x, height), z], dim=-1)
    light = torch.tensor([0.86, 0.84, 0.78], dtype=torch.float64)
    dark = torch.tensor([0.28, 0.33, 0.45], dtype=torch.float64)
    checker = ((torch.floor(x / 1.2) + torch.floor(z / 1.2)) % 2)[:, None]
    colours = checker * light + (1 - checker) * dark
    # Radius 0.7 spacing: neighbours overlap, so the floor has no holes.
    return positions, colours, torch.full_like(x, 0.7 * spacing)


def build_scene(settings: DemoSettings, device: torch.device) -> DemoScene:
    """The knot (and floor) at the origin and ``views`` cameras around it.

    View k sits at azimuth 360 k / views degrees (view 0 on the -z side) at an
    elevation of 25 degrees (even k) or 15 degrees (odd k), ``camera_distance`` from the
    origin, looking at it with world +y up (Pulsar's default left-handed convention).
    """
    sample = make_sample_scene(
        settings.width, settings.height, settings.n_spheres, seed=settings.seed, dtype=torch.float64
    )
    positions = sample.positions - torch.tensor(_KNOT_CENTRE, dtype=torch.float64)
    colours, radii = sample.colours, sample.radii
    if settings.floor_radius > 0:
        floor = make_floor(settings.floor_radius, settings.floor_spacing, float(positions[:, 1].min()) - 0.6)
        positions, colours, radii = (torch.cat(pair) for pair in zip((positions, colours, radii), floor))
    rows = []
    sensor = sensor_width_for_fov(settings.horizontal_fov_deg)
    for k in range(settings.views):
        azimuth = 2 * math.pi * k / settings.views
        elevation = math.radians(25.0 if k % 2 == 0 else 15.0)
        eye = settings.camera_distance * torch.tensor(
            [math.cos(elevation) * math.sin(azimuth), math.sin(elevation), -math.cos(elevation) * math.cos(azimuth)],
            dtype=torch.float64,
        )
        matrix = look_at_matrix(eye, torch.zeros(3, dtype=torch.float64))
        rows.append(torch.cat([eye, matrix_to_rotation_6d(matrix), torch.tensor([1.0, sensor], dtype=torch.float64)]))

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=torch.float32).contiguous()

    return DemoScene(move(positions), move(colours), move(radii), move(torch.stack(rows)), move(sample.bg_col))


class DemoParameters(torch.nn.Module):
    """What the demo optimises: view 0's pose and focal length, and every sphere.

    View 0's rotation is ``M = initial_rotation @ R(camera_rotation)`` (an axis-angle
    vector in the camera frame, starting at 0), passed to the renderer as a 6D rotation.
    Its position is held as the scene centre (``pivot``) in camera coordinates,
    ``camera_offset = M^T (pivot - eye)``, so ``eye = pivot - M camera_offset``: turning
    the camera then orbits the scene instead of swinging it across the image, which keeps
    rotation and translation from fighting each other (with a plain eye position, a small
    turn and a sideways move look alike: a long, narrow valley of the loss). The focal
    length is ``exp(camera_log_focal)``; radii are ``exp(sphere_log_radius)``, so they
    stay positive; colours are clamped to [0, 1] after every step (``project``).
    """

    def __init__(
        self,
        camera: torch.Tensor,
        reference_cameras: torch.Tensor,
        positions: torch.Tensor,
        colours: torch.Tensor,
        radii: torch.Tensor,
    ) -> None:
        super().__init__()
        self.register_buffer("initial_rotation", rotation_from_params(camera[None])[0].detach().clone())
        self.register_buffer("sensor_width", camera[10:11].detach().clone())
        self.register_buffer("reference_cameras", reference_cameras.detach().clone())
        self.register_buffer("pivot", torch.zeros(3, dtype=camera.dtype, device=camera.device))
        self.camera_rotation = torch.nn.Parameter(torch.zeros(3, dtype=camera.dtype, device=camera.device))
        self.camera_offset = torch.nn.Parameter(self.initial_rotation.T @ (self.pivot - camera[0:3].detach()))
        self.camera_log_focal = torch.nn.Parameter(camera[9:10].detach().log())
        self.sphere_position = torch.nn.Parameter(positions.detach().clone())
        self.sphere_colour = torch.nn.Parameter(colours.detach().clone())
        self.sphere_log_radius = torch.nn.Parameter(radii.detach().log())

    def camera_matrix(self) -> torch.Tensor:
        """[3, 3] view 0's current rotation (columns: image x, image up, optical axis)."""
        return self.initial_rotation @ axis_angle_to_matrix(self.camera_rotation[None])[0]

    def camera_position(self) -> torch.Tensor:
        """[3] view 0's current centre (world units)."""
        return self.pivot - self.camera_matrix() @ self.camera_offset

    def focal_length(self) -> torch.Tensor:
        """[] view 0's current focal length (world units)."""
        return self.camera_log_focal.exp()[0]

    def cam_params(self) -> torch.Tensor:
        """[V, 11] all cameras: view 0 (differentiable), then the fixed reference views."""
        view0 = torch.cat(
            [
                self.camera_position(),
                matrix_to_rotation_6d(self.camera_matrix()),
                self.camera_log_focal.exp(),
                self.sensor_width,
            ]
        )
        return torch.cat([view0[None], self.reference_cameras], dim=0)

    def radii(self) -> torch.Tensor:
        """[N] current sphere radii (world units)."""
        return self.sphere_log_radius.exp()

    @torch.no_grad()
    def project(self) -> None:
        """Keep colours displayable after an optimiser step."""
        self.sphere_colour.clamp_(0.0, 1.0)


def _random_unit(gen: torch.Generator) -> torch.Tensor:
    v = torch.randn(3, generator=gen, dtype=torch.float64)
    return v / v.norm()


def perturb(scene: DemoScene, settings: DemoSettings) -> DemoParameters:
    """The starting point: view 0's rotation, position and focal length and every
    sphere's position, radius and colour perturbed (seeded by ``settings.seed``)."""
    gen = torch.Generator().manual_seed(1000 + settings.seed)
    device, dtype = scene.positions.device, scene.positions.dtype
    true_camera = scene.cam_params[0].to(torch.float64).cpu()
    rotation = rotation_from_params(true_camera[None])[0]
    turn = axis_angle_to_matrix((math.radians(settings.rotation_error_deg) * _random_unit(gen))[None])[0]
    position = true_camera[0:3] + settings.translation_error * _random_unit(gen)
    sign = 1.0 if torch.rand(1, generator=gen).item() < 0.5 else -1.0
    focal = true_camera[9] * (1 + sign * settings.focal_error)
    camera = torch.cat([position, matrix_to_rotation_6d(rotation @ turn), focal[None], true_camera[10:11]])

    n = scene.positions.shape[0]
    f64 = torch.float64
    positions = scene.positions.cpu().double() + settings.position_noise * torch.randn(n, 3, generator=gen, dtype=f64)
    # Log-normal factors with mean 1 (exp(s n - s^2 / 2)): a biased factor would make
    # every sphere fatter on average, which view 0 could mistake for a closer camera.
    log_factor = settings.radius_noise * torch.randn(n, generator=gen, dtype=f64)
    radii = scene.radii.cpu().double() * torch.exp(log_factor - settings.radius_noise**2 / 2)
    colours = (1 - settings.colour_fade) * scene.colours.cpu().double() + settings.colour_fade * 0.5
    colours = (colours + settings.colour_noise * torch.randn(n, 3, generator=gen, dtype=f64)).clamp(0, 1)

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype)

    return DemoParameters(move(camera), scene.cam_params[1:], move(positions), move(colours), move(radii))


def pose_errors(params: DemoParameters, scene: DemoScene) -> Dict[str, float]:
    """View 0's errors: rotation (degrees), translation (world units), focal (relative)."""
    with torch.no_grad():
        true_camera = scene.cam_params[0].double()
        rotation = rotation_angle_deg(params.camera_matrix().double(), rotation_from_params(true_camera[None])[0])
        translation = (params.camera_position().double() - true_camera[0:3]).norm()
        focal = (params.focal_length().double() / true_camera[9] - 1).abs()
        values = torch.stack([rotation, translation, focal]).cpu().tolist()  # one device sync
    return dict(zip(("rotation_error_deg", "translation_error", "focal_error"), values))
