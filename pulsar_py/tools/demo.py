"""``python -m pulsar_py demo``: joint optimisation of a camera and thousands of spheres.

The problem (``pulsar_py.demo_setup``): a rainbow trefoil knot of spheres over a
checkered floor of spheres (about 4700 in all), three cameras around it. The demo
renders the target images (all views in one batched call), then perturbs view 0's
rotation (8 degrees), position (0.6 units) and focal length (6 %) and every sphere's
position, colour and radius, and optimises all of them jointly against the targets with
Adam (one learning rate per parameter group) through ``Renderer.forward``, whose
gradients are exact.

Two things make it converge from that far: the loss compares blurred images first
(coarse to fine), and view 0's image starts moving the spheres only once its pose has
settled (``DemoSettings.trust_start_fraction``); the last fifth of the run optimises the
plain joint loss.

Outputs in ``--out``: target.png, initial.png, final.png (the views side by side, view 0
first), optimisation.gif (view 0: target, current render, difference), loss.png (image
error and view 0's pose errors per step) and summary.json::

    {"initial": {"rotation_error_deg", "translation_error", "focal_error", "psnr_db"},
     "final": {...the same keys}, "steps", "seconds", "device"}

Units: rotation error in degrees (angle of the relative rotation), translation error in
world units (distance between the estimated and the true camera centre; the camera is 13
units from the knot, which spans about 7), focal error relative (|f / f_true - 1|), PSNR
in dB over all views (images in [0, 1]), seconds of wall time for the whole run.
Translation and focal length trade off against each other (a 5 % longer lens 5 % further
away gives almost the same image of a shallow scene), so they are only loosely pinned down
and may end no better than they started; rotation and the images are.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

import torch

from .args import positive_int
from .demo_setup import DemoParameters, DemoScene, DemoSettings, build_scene, perturb, pose_errors
from ..io.gif import write_gif
from .plot import PALETTE, Series, draw_text, line_plot, stack_panels
from ..io.png import write_png
from .progress import ProgressLine

__all__ = ["DemoSettings", "run_demo", "main"]


# ---------------------------------------------------------------------------------------
# Schedules and the loss

def learning_rate_factor(settings: DemoSettings, step: int) -> float:
    """Multiplier of every learning rate at ``step``: 1, then a cosine decay."""
    progress = min(step, settings.steps) / max(settings.steps, 1)
    if progress <= settings.decay_start_fraction:
        return 1.0
    t = (progress - settings.decay_start_fraction) / max(1e-9, 1 - settings.decay_start_fraction)
    low = settings.final_lr_fraction
    return low + (1 - low) * 0.5 * (1 + math.cos(math.pi * t))


def view0_sphere_weight(settings: DemoSettings, step: int) -> float:
    """Weight of view 0's gradient on the spheres at ``step`` (see DemoSettings)."""
    progress = min(step, settings.steps) / max(settings.steps, 1)
    start, full = settings.trust_start_fraction, settings.trust_full_fraction
    if progress >= full:
        return 1.0
    if progress <= start:
        return 0.0
    return (progress - start) / (full - start)


def blur_sigma(settings: DemoSettings, step: int) -> float:
    """Standard deviation (pixels) of the loss's Gaussian blur at ``step``."""
    progress = min(step, settings.steps) / max(settings.steps, 1)
    if settings.blur_end_fraction <= 0 or progress >= settings.blur_end_fraction:
        return 0.0
    return settings.blur_start_px * settings.width / 160 * (1 - progress / settings.blur_end_fraction)


def scale_gradient(t: torch.Tensor, weight: float) -> torch.Tensor:
    """``t`` in value, with the gradient flowing back through it multiplied by ``weight``."""
    if weight == 1.0:
        return t
    return t.detach() + weight * (t - t.detach())


def gaussian_blur(images: torch.Tensor, sigma: float) -> torch.Tensor:
    """Blur [V, H, W, C] images with a Gaussian of ``sigma`` pixels (zero padding);
    separable and differentiable. ``sigma`` < 0.3 returns the images unchanged."""
    if sigma < 0.3:
        return images
    radius = max(1, int(math.ceil(3 * sigma)))
    x = torch.arange(-radius, radius + 1, dtype=images.dtype, device=images.device)
    kernel = torch.exp(-0.5 * (x / sigma) ** 2)
    kernel = kernel / kernel.sum()
    v, h, w, c = images.shape
    planes = images.permute(0, 3, 1, 2).reshape(v * c, 1, h, w)
    planes = torch.nn.functional.conv2d(planes, kernel.view(1, 1, 1, -1), padding=(0, radius))
    planes = torch.nn.functional.conv2d(planes, kernel.view(1, 1, -1, 1), padding=(radius, 0))
    return planes.reshape(v, c, h, w).permute(0, 2, 3, 1)


def image_loss(images: torch.Tensor, targets: torch.Tensor, sigma: float) -> torch.Tensor:
    """Mean squared difference of [V, H, W, C] images after a Gaussian blur of ``sigma``
    pixels (blurring the difference = the difference of the blurred images)."""
    return (gaussian_blur(images - targets, sigma) ** 2).mean()


def psnr_db(images: torch.Tensor, targets: torch.Tensor) -> float:
    """Peak signal-to-noise ratio (dB) of images in [0, 1] over every pixel and channel."""
    mse = float(((images.detach().double() - targets.double()) ** 2).mean())
    return float("inf") if mse == 0 else -10 * math.log10(mse)


# ---------------------------------------------------------------------------------------
# Pictures

def side_by_side(images: Sequence[torch.Tensor], gap: int = 2, gap_value: float = 1.0) -> torch.Tensor:
    """[H, W, 3] images next to each other with ``gap`` columns of ``gap_value`` between."""
    parts: List[torch.Tensor] = []
    for image in images:
        if parts:
            parts.append(torch.full((image.shape[0], gap, image.shape[2]), gap_value))
        parts.append(image.detach().cpu().float().clamp(0, 1))
    return torch.cat(parts, dim=1)


def gif_frame(target: torch.Tensor, current: torch.Tensor, step: int, steps: int) -> torch.Tensor:
    """View 0: target | current | 4 x |difference|, under a caption bar; float [H + 14, 3 W + 4, 3]."""
    target = target.detach().cpu().float()
    current = current.detach().cpu().float().clamp(0, 1)
    difference = ((current - target).abs() * 4).clamp(0, 1)
    row = side_by_side([target, current, difference])
    caption = torch.ones(14, row.shape[1], 3)
    width = target.shape[1]
    for k, text in enumerate(("target", f"step {step}/{steps}", "difference x4")):
        draw_text(caption, text, k * (width + 2) + 3, 4, (0.1, 0.1, 0.1))
    return torch.cat([caption, row], dim=0)


def loss_figure(mse: Sequence[float], errors: Dict[str, Sequence[float]]) -> torch.Tensor:
    """loss.png: the image error and view 0's pose errors per step, float [H, 480, 3]."""
    return stack_panels([
        line_plot([Series("mse", mse, PALETTE[0])], "image error (mean squared, all views)", height=150),
        line_plot([Series("degrees", errors["rotation_error_deg"], PALETTE[1])], "view 0 rotation error",
                  height=150),
        line_plot([Series("translation (world units)", errors["translation_error"], PALETTE[2]),
                   Series("focal (relative)", errors["focal_error"], PALETTE[3])],
                  "view 0 position and focal length error", height=170),
    ])


# ---------------------------------------------------------------------------------------
# The run

def _render_views(renderer, scene: DemoScene, settings: DemoSettings, params: DemoParameters,
                  view0_weight: float = 1.0) -> torch.Tensor:
    """[V, H, W, 3] the current images of all views, in one native call."""
    positions, colours, radii = params.sphere_position, params.sphere_colour, params.radii()
    if view0_weight != 1.0:
        # Per-view copies of the spheres ([V, N, ...], still one call): view 0's copy
        # passes on only ``view0_weight`` of its gradient.
        def per_view(t: torch.Tensor) -> torch.Tensor:
            return torch.stack([scale_gradient(t, view0_weight)] + [t] * (settings.views - 1))

        positions, colours, radii = per_view(positions), per_view(colours), per_view(radii)
    return renderer(positions, colours, radii, params.cam_params(), gamma=settings.gamma,
                    max_depth=settings.max_depth, min_depth=settings.min_depth, bg_col=scene.bg_col)


def run_demo(settings: DemoSettings, device: torch.device, out_dir: Optional[str] = None,
             progress: bool = True) -> Dict[str, object]:
    """Run the demo on ``device``; write its files to ``out_dir`` (None: none) and
    return the summary (the content of summary.json)."""
    from ..renderer import Renderer

    settings.check()
    start = time.perf_counter()
    scene = build_scene(settings, device)
    renderer = Renderer(settings.width, settings.height, n_channels=3).to(device)
    with torch.no_grad():
        targets = renderer(scene.positions, scene.colours, scene.radii, scene.cam_params, gamma=settings.gamma,
                           max_depth=settings.max_depth, min_depth=settings.min_depth, bg_col=scene.bg_col)
    params = perturb(scene, settings)
    optimiser = torch.optim.Adam([{"params": [getattr(params, name)], "lr": lr}
                                  for name, lr in settings.learning_rates.items()], betas=(0.9, 0.99))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: learning_rate_factor(settings, step))

    with torch.no_grad():
        initial_images = _render_views(renderer, scene, settings, params)
    initial = dict(pose_errors(params, scene), psnr_db=psnr_db(initial_images, targets))

    frame_every = max(1, settings.steps // settings.gif_frames)
    frames: List[torch.Tensor] = []
    mse: List[float] = []  # plain mean squared error of all views, per step
    errors: Dict[str, List[float]] = {key: [] for key in ("rotation_error_deg", "translation_error", "focal_error")}
    bar = ProgressLine(settings.steps, f"demo ({device.type})", enabled=progress)
    for step in range(settings.steps):
        optimiser.zero_grad(set_to_none=True)
        images = _render_views(renderer, scene, settings, params, view0_sphere_weight(settings, step))
        loss = image_loss(images, targets, blur_sigma(settings, step))
        loss.backward()
        optimiser.step()
        schedule.step()
        params.project()
        mse.append(float(((images.detach() - targets) ** 2).mean()))
        for key, value in pose_errors(params, scene).items():
            errors[key].append(value)
        if out_dir is not None and step % frame_every == 0:
            frames.append(gif_frame(targets[0], images[0], step, settings.steps))
        bar.update(step + 1, f"mse {mse[-1]:.2e}, rotation error {errors['rotation_error_deg'][-1]:5.2f} deg")
    bar.close()

    with torch.no_grad():
        final_images = _render_views(renderer, scene, settings, params)
    final = dict(pose_errors(params, scene), psnr_db=psnr_db(final_images, targets))
    if out_dir is not None:
        frames.append(gif_frame(targets[0], final_images[0], settings.steps, settings.steps))
        os.makedirs(out_dir, exist_ok=True)
        write_png(os.path.join(out_dir, "target.png"), side_by_side(list(targets)))
        write_png(os.path.join(out_dir, "initial.png"), side_by_side(list(initial_images)))
        write_png(os.path.join(out_dir, "final.png"), side_by_side(list(final_images)))
        write_gif(os.path.join(out_dir, "optimisation.gif"), frames, frame_ms=100)
        write_png(os.path.join(out_dir, "loss.png"), loss_figure(mse, errors))
    summary: Dict[str, object] = {"initial": initial, "final": final, "steps": settings.steps,
                                  "seconds": round(time.perf_counter() - start, 3), "device": device.type}
    if out_dir is not None:
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    return summary


# ---------------------------------------------------------------------------------------
# Command line

def _default_device() -> str:
    from .. import build_info

    return "cuda" if "cuda" in build_info()["backends"] and torch.cuda.is_available() else "cpu"


def _build_parser() -> argparse.ArgumentParser:
    defaults = DemoSettings()
    parser = argparse.ArgumentParser(
        prog="python -m pulsar_py demo",
        description="Joint optimisation of a camera (rotation, position, focal length) and thousands of "
                    "spheres (positions, colours, radii) from three views. Writes target.png, initial.png, "
                    "final.png, optimisation.gif, loss.png and summary.json to --out.")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="backend (default: cuda when this build has it and a GPU is present, else cpu)")
    parser.add_argument("--out", default="pulsar_demo", help="output folder (default: ./pulsar_demo)")
    parser.add_argument("--steps", type=positive_int, default=defaults.steps,
                        help=f"optimisation steps (default {defaults.steps})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the scene and perturbations")
    parser.add_argument("--width", type=positive_int, default=defaults.width, help="image width (default 160)")
    parser.add_argument("--height", type=positive_int, default=defaults.height, help="image height (default 120)")
    parser.add_argument("--spheres", type=positive_int, default=defaults.n_spheres,
                        help=f"spheres on the knot (default {defaults.n_spheres}; the floor adds about 2000)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m pulsar_py demo [--device cpu|cuda] [--out DIR] [--steps N]``; returns the exit status."""
    args = _build_parser().parse_args(argv)
    from ..renderer import check_device_usable

    device = torch.device(args.device or _default_device())
    try:
        check_device_usable(device)
    except ValueError as exc:
        print(f"demo: --device {device.type}: {exc}", file=sys.stderr)
        return 1
    settings = DemoSettings(width=args.width, height=args.height, n_spheres=args.spheres, steps=args.steps,
                            seed=args.seed)
    try:
        settings.check()
        summary = run_demo(settings, device, args.out, progress=not args.quiet)
    except ValueError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"demo: --out: cannot write to {args.out!r}: {exc}", file=sys.stderr)
        return 1
    initial, final = summary["initial"], summary["final"]
    print(f"rotation error {initial['rotation_error_deg']:.2f} -> {final['rotation_error_deg']:.3f} deg, "
          f"translation error {initial['translation_error']:.3f} -> {final['translation_error']:.3f}, "
          f"focal error {100 * initial['focal_error']:.1f} -> {100 * final['focal_error']:.1f} %, "
          f"PSNR {initial['psnr_db']:.1f} -> {final['psnr_db']:.1f} dB; "
          f"{summary['steps']} steps on {summary['device']} in {summary['seconds']:.1f} s")
    print(f"wrote target.png, initial.png, final.png, optimisation.gif, loss.png, summary.json to {args.out}")
    return 0
