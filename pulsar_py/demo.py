"""``python -m pulsar_py demo``: joint optimisation of a camera and thousands of spheres.

The scene is the built-in rainbow trefoil knot of spheres (``sample_scene``), centred at
the origin and seen by ``views`` cameras placed around it. View 0 is the camera being
calibrated; the other views are reference cameras with known poses, which fix the world
frame (otherwise a rigid motion of everything would leave every image unchanged). The
demo renders the target images (all views in one batched call), then perturbs view 0's
rotation, position and focal length and every sphere's position, colour and radius, and
optimises all of them jointly against the targets with Adam (one learning rate per
parameter group). Exact gradients reach every parameter through ``Renderer.forward``.

Outputs in ``--out``: target.png, initial.png, final.png (all views side by side, view 0
first), optimisation.gif (view 0's target, current render and difference over the run),
loss.png (loss and pose error per step) and summary.json::

    {"initial": {"rotation_error_deg", "translation_error", "focal_error", "psnr_db"},
     "final": {...the same keys}, "steps", "seconds", "device"}

Units: rotation error in degrees (angle of the relative rotation), translation error in
world units (distance between the estimated and true camera centre; the cameras are
``camera_distance`` = 13 units from the knot, which spans about 7 units), focal error
relative (|f / f_true - 1|), PSNR in dB over all views (images in [0, 1]), seconds of
wall time for the whole run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from .camera_params import axis_angle_to_matrix
from .gif import write_gif
from .look_at import look_at_matrix, matrix_to_rotation_6d, rotation_angle_deg, rotation_from_params, sensor_width_for_fov
from .plot import PALETTE, Series, draw_text, line_plot, stack_panels
from .png import write_png
from .progress import ProgressLine
from .sample_scene import KNOT_DEPTH, make_sample_scene

#: Where ``make_sample_scene`` puts the knot's centre; the demo moves it to the origin.
_KNOT_CENTRE = (0.0, 0.5, KNOT_DEPTH)


@dataclass
class DemoSettings:
    """Every knob of the demo. The defaults finish in about a minute on 2 CPU cores.

    Perturbation sizes: ``rotation_error_deg`` (degrees, about a random axis),
    ``translation_error`` (world units, random direction), ``focal_error`` (relative,
    random sign); spheres: ``position_noise`` (world units, std per coordinate),
    ``radius_noise`` (std of the log of the radius factor), ``colour_noise`` (std added
    to every channel after mixing ``colour_fade`` of grey in).
    """

    width: int = 160
    height: int = 120
    n_spheres: int = 4000
    views: int = 3
    steps: int = 300
    seed: int = 0
    gamma: float = 0.01
    camera_distance: float = 13.0
    horizontal_fov_deg: float = 50.0
    min_depth: float = 6.0
    max_depth: float = 20.0
    rotation_error_deg: float = 8.0
    translation_error: float = 0.6
    focal_error: float = 0.06
    position_noise: float = 0.08
    radius_noise: float = 0.3
    colour_fade: float = 0.5
    colour_noise: float = 0.1
    gif_frames: int = 40
    #: Adam learning rates per parameter group (units per step, roughly the step size).
    learning_rates: Dict[str, float] = field(default_factory=lambda: {
        "camera_rotation": 3e-3,    # radians
        "camera_position": 2e-2,    # world units
        "camera_log_focal": 3e-3,   # log of the focal length
        "sphere_position": 3e-3,    # world units
        "sphere_colour": 1e-2,
        "sphere_log_radius": 1e-2,
    })
    #: The learning rates decay to this fraction of their start over the run (cosine).
    final_lr_fraction: float = 0.05


@dataclass
class DemoScene:
    """Ground truth: spheres and cameras. cam_params [V, 11]: position, 6D rotation,
    focal length, sensor width (Pulsar's 6D camera vectors)."""

    positions: torch.Tensor   # [N, 3] world units
    colours: torch.Tensor     # [N, 3] RGB in [0, 1]
    radii: torch.Tensor       # [N] world units
    cam_params: torch.Tensor  # [V, 11]
    bg_col: torch.Tensor      # [3]


def build_scene(settings: DemoSettings, device: torch.device) -> DemoScene:
    """The knot of ``n_spheres`` spheres at the origin and ``views`` cameras around it.

    View k sits at azimuth 360 k / views degrees (view 0 on the -z side, looking along
    +z like the sample scene's camera) at alternating elevations of +20 and -15 degrees,
    ``camera_distance`` from the origin, looking at it with world +y up.
    """
    sample = make_sample_scene(settings.width, settings.height, settings.n_spheres, seed=settings.seed,
                               dtype=torch.float64)
    positions = sample.positions - torch.tensor(_KNOT_CENTRE, dtype=torch.float64)
    rows = []
    sensor = sensor_width_for_fov(settings.horizontal_fov_deg)
    for k in range(settings.views):
        azimuth = 2 * math.pi * k / settings.views
        elevation = math.radians(20.0 if k % 2 == 0 else -15.0)
        eye = settings.camera_distance * torch.tensor(
            [math.cos(elevation) * math.sin(azimuth), math.sin(elevation), -math.cos(elevation) * math.cos(azimuth)],
            dtype=torch.float64)
        matrix = look_at_matrix(eye, torch.zeros(3, dtype=torch.float64))
        rows.append(torch.cat([eye, matrix_to_rotation_6d(matrix), torch.tensor([1.0, sensor], dtype=torch.float64)]))
    scene = DemoScene(positions, sample.colours, sample.radii, torch.stack(rows), sample.bg_col)
    return DemoScene(*(t.to(device=device, dtype=torch.float32) for t in
                       (scene.positions, scene.colours, scene.radii, scene.cam_params, scene.bg_col)))


class DemoParameters(torch.nn.Module):
    """What the demo optimises: view 0's pose and focal length, and every sphere.

    View 0's rotation is ``initial_rotation @ R(rotation_delta)`` (``rotation_delta`` an
    axis-angle vector in the camera frame, starting at 0), passed to the renderer as a
    6D rotation; the focal length is ``exp(log_focal)``; radii are ``exp(log_radius)``,
    so they stay positive; colours are clamped to [0, 1] after every step.
    """

    def __init__(self, camera: torch.Tensor, reference_cameras: torch.Tensor, positions: torch.Tensor,
                 colours: torch.Tensor, radii: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("initial_rotation", rotation_from_params(camera[None])[0].detach().clone())
        self.register_buffer("sensor_width", camera[10:11].detach().clone())
        self.register_buffer("reference_cameras", reference_cameras.detach().clone())
        self.camera_rotation = torch.nn.Parameter(torch.zeros(3, dtype=camera.dtype, device=camera.device))
        self.camera_position = torch.nn.Parameter(camera[0:3].detach().clone())
        self.camera_log_focal = torch.nn.Parameter(camera[9:10].detach().log())
        self.sphere_position = torch.nn.Parameter(positions.detach().clone())
        self.sphere_colour = torch.nn.Parameter(colours.detach().clone())
        self.sphere_log_radius = torch.nn.Parameter(radii.detach().log())

    def camera_matrix(self) -> torch.Tensor:
        """[3, 3] view 0's current rotation."""
        return self.initial_rotation @ axis_angle_to_matrix(self.camera_rotation[None])[0]

    def focal_length(self) -> torch.Tensor:
        return self.camera_log_focal.exp()[0]

    def cam_params(self) -> torch.Tensor:
        """[V, 11] all cameras: view 0 (differentiable), then the fixed reference views."""
        view0 = torch.cat([self.camera_position, matrix_to_rotation_6d(self.camera_matrix()),
                           self.camera_log_focal.exp(), self.sensor_width])
        return torch.cat([view0[None], self.reference_cameras], dim=0)

    def radii(self) -> torch.Tensor:
        return self.sphere_log_radius.exp()

    @torch.no_grad()
    def project(self) -> None:
        """Keep colours displayable after an optimiser step."""
        self.sphere_colour.clamp_(0.0, 1.0)


def _random_unit(gen: torch.Generator) -> torch.Tensor:
    v = torch.randn(3, generator=gen, dtype=torch.float64)
    return v / v.norm()


def perturb(scene: DemoScene, settings: DemoSettings) -> DemoParameters:
    """The starting point: view 0's pose and focal length and every sphere perturbed
    (seeded by ``settings.seed``)."""
    gen = torch.Generator().manual_seed(1000 + settings.seed)
    device, dtype = scene.positions.device, scene.positions.dtype
    true_camera = scene.cam_params[0].to(torch.float64).cpu()
    rotation = rotation_from_params(true_camera[None])[0]
    offset = axis_angle_to_matrix((math.radians(settings.rotation_error_deg) * _random_unit(gen))[None])[0]
    position = true_camera[0:3] + settings.translation_error * _random_unit(gen)
    sign = 1.0 if torch.rand(1, generator=gen).item() < 0.5 else -1.0
    focal = true_camera[9] * (1 + sign * settings.focal_error)
    camera = torch.cat([position, matrix_to_rotation_6d(rotation @ offset), focal[None], true_camera[10:11]])

    n = scene.positions.shape[0]
    positions = scene.positions.cpu().double() + settings.position_noise * torch.randn(n, 3, generator=gen,
                                                                                       dtype=torch.float64)
    radii = scene.radii.cpu().double() * torch.exp(settings.radius_noise * torch.randn(n, generator=gen,
                                                                                      dtype=torch.float64))
    colours = (1 - settings.colour_fade) * scene.colours.cpu().double() + settings.colour_fade * 0.5
    colours = (colours + settings.colour_noise * torch.randn(n, 3, generator=gen, dtype=torch.float64)).clamp(0, 1)

    def move(t: torch.Tensor) -> torch.Tensor:
        return t.to(device=device, dtype=dtype)

    return DemoParameters(move(camera), scene.cam_params[1:], move(positions), move(colours), move(radii))


def pose_errors(params: DemoParameters, scene: DemoScene) -> Dict[str, float]:
    """View 0's errors: rotation (degrees), translation (world units), focal (relative)."""
    with torch.no_grad():
        true_camera = scene.cam_params[0].double()
        rotation = rotation_angle_deg(params.camera_matrix().double(), rotation_from_params(true_camera[None])[0])
        translation = (params.camera_position.double() - true_camera[0:3]).norm()
        focal = (params.focal_length().double() / true_camera[9] - 1).abs()
    return {"rotation_error_deg": float(rotation), "translation_error": float(translation),
            "focal_error": float(focal)}


def psnr_db(images: torch.Tensor, targets: torch.Tensor) -> float:
    """Peak signal-to-noise ratio (dB) of images in [0, 1] over every pixel and channel."""
    mse = float(((images.detach().double() - targets.double()) ** 2).mean())
    return float("inf") if mse == 0 else -10 * math.log10(mse)


def side_by_side(images: Sequence[torch.Tensor], gap: int = 2, gap_value: float = 1.0) -> torch.Tensor:
    """[H, W, 3] images next to each other with ``gap`` columns of ``gap_value`` between."""
    parts: List[torch.Tensor] = []
    for image in images:
        if parts:
            parts.append(torch.full((image.shape[0], gap, image.shape[2]), gap_value, dtype=image.dtype))
        parts.append(image.detach().cpu().float().clamp(0, 1))
    return torch.cat(parts, dim=1)


def _gif_frame(target: torch.Tensor, current: torch.Tensor, step: int, steps: int) -> torch.Tensor:
    """View 0: target | current | 4x |difference|, with a caption bar, float [H', W', 3]."""
    target = target.detach().cpu().float()
    current = current.detach().cpu().float().clamp(0, 1)
    difference = ((current - target).abs() * 4).clamp(0, 1)
    row = side_by_side([target, current, difference])
    caption = torch.ones(14, row.shape[1], 3)
    width = target.shape[1]
    for k, text in enumerate(("TARGET", f"STEP {step}/{steps}", "DIFFERENCE X4")):
        draw_text(caption, text, k * (width + 2) + 3, 3, (0.1, 0.1, 0.1), scale=1)
    return torch.cat([caption, row], dim=0)


def _loss_figure(losses: List[float], rotation: List[float], translation: List[float], focal: List[float]) -> torch.Tensor:
    loss_panel = line_plot([Series("mse", losses, PALETTE[0])], "loss (mean squared error, all views)")
    pose_panel = line_plot([Series("rotation (deg)", rotation, PALETTE[1]),
                            Series("translation", translation, PALETTE[2]),
                            Series("focal (rel.)", focal, PALETTE[3])], "view 0 pose error")
    return stack_panels([loss_panel, pose_panel])


def run_demo(settings: DemoSettings, device: torch.device, out_dir: Optional[str] = None,
             progress: bool = True) -> Dict[str, object]:
    """Run the demo; write its files to ``out_dir`` (None: write nothing) and return
    the summary (the content of summary.json)."""
    from .renderer import Renderer

    start = time.perf_counter()
    torch.manual_seed(settings.seed)
    scene = build_scene(settings, device)
    renderer = Renderer(settings.width, settings.height, n_channels=3).to(device)

    def render(positions, colours, radii, cam_params) -> torch.Tensor:
        return renderer(positions, colours, radii, cam_params, gamma=settings.gamma, max_depth=settings.max_depth,
                        min_depth=settings.min_depth, bg_col=scene.bg_col)

    with torch.no_grad():
        targets = render(scene.positions, scene.colours, scene.radii, scene.cam_params)  # [V, H, W, 3]
    params = perturb(scene, settings)
    groups = [{"params": [getattr(params, name)], "lr": lr, "name": name}
              for name, lr in settings.learning_rates.items()]
    optimiser = torch.optim.Adam(groups, betas=(0.9, 0.99))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: settings.final_lr_fraction + (
        1 - settings.final_lr_fraction) * 0.5 * (1 + math.cos(math.pi * min(step, settings.steps) / max(settings.steps, 1))))

    def current_images() -> torch.Tensor:
        return render(params.sphere_position, params.sphere_colour, params.radii(), params.cam_params())

    with torch.no_grad():
        initial_images = current_images()
    initial = dict(pose_errors(params, scene), psnr_db=psnr_db(initial_images, targets))

    frame_every = max(1, settings.steps // max(settings.gif_frames, 1))
    frames: List[torch.Tensor] = []
    losses: List[float] = []
    errors: Dict[str, List[float]] = {"rotation_error_deg": [], "translation_error": [], "focal_error": []}
    bar = ProgressLine(settings.steps, f"demo ({device.type})", enabled=progress)
    for step in range(settings.steps):
        optimiser.zero_grad(set_to_none=True)
        images = current_images()
        loss = ((images - targets) ** 2).mean()
        loss.backward()
        optimiser.step()
        schedule.step()
        params.project()
        losses.append(float(loss.detach()))
        for key, value in pose_errors(params, scene).items():
            errors[key].append(value)
        if out_dir is not None and step % frame_every == 0:
            frames.append(_gif_frame(targets[0], images[0], step, settings.steps))
        bar.update(step + 1, f"loss {losses[-1]:.2e} rot {errors['rotation_error_deg'][-1]:5.2f} deg")
    bar.close()

    with torch.no_grad():
        final_images = current_images()
    final = dict(pose_errors(params, scene), psnr_db=psnr_db(final_images, targets))
    if out_dir is not None:
        frames.append(_gif_frame(targets[0], final_images[0], settings.steps, settings.steps))
        os.makedirs(out_dir, exist_ok=True)
        write_png(os.path.join(out_dir, "target.png"), side_by_side(list(targets)))
        write_png(os.path.join(out_dir, "initial.png"), side_by_side(list(initial_images)))
        write_png(os.path.join(out_dir, "final.png"), side_by_side(list(final_images)))
        write_gif(os.path.join(out_dir, "optimisation.gif"), frames, frame_ms=100)
        write_png(os.path.join(out_dir, "loss.png"),
                  _loss_figure(losses, errors["rotation_error_deg"], errors["translation_error"],
                               errors["focal_error"]))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    summary: Dict[str, object] = {"initial": initial, "final": final, "steps": settings.steps,
                                  "seconds": round(time.perf_counter() - start, 3), "device": device.type}
    if out_dir is not None:
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    return summary
