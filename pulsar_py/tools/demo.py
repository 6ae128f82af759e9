"""``pulsar-py demo``: joint optimisation of a camera and thousands of spheres.

The problem (``pulsar_py.demo_setup``): a rainbow trefoil knot of spheres over a
checkered floor of spheres (about 5000 in all), three cameras around it. The demo
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
first), optimisation.gif (view 0: target, current render, difference; imageio),
loss.png (image error and view 0's rotation, position and focal length errors per step,
one quantity per axis; matplotlib), scene.ply (the optimised spheres: positions, float
colours, radii; z negated, as the demo renders in Pulsar's left-handed convention and
PLY viewers, ``pulsar-py render`` and ``pulsar-py view`` assume a right-handed world) and
summary.json::

    {"initial": {"rotation_error_deg", "translation_error", "focal_error", "psnr_db"},
     "final": {...the same keys}, "steps", "seconds", "device"}

``--view`` shows the spheres in the browser while they train, with the losses plotted
and a pause button (``pulsar_py.tools.viewer.LiveViewer``, docs/viewer.md), and keeps
serving after the run until Ctrl-C.

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
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..io._deps import require
from ..io.images import write_animation, write_image
from ..io.ply import write_ply
from .args import command_device, command_prog, positive_int
from .demo_setup import DemoParameters, DemoScene, DemoSettings, build_scene, perturb, pose_errors

__all__ = ["DemoSettings", "run_demo", "summary_line", "main"]

#: optimisation.gif: display time of a frame, and of the last one (the result), in ms.
GIF_FRAME_MS = 100.0
GIF_HOLD_MS = 2500.0


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


def _figure(width_px: float, height_px: float, dpi: int = 100):
    """A matplotlib Figure of that many pixels with an Agg canvas (no pyplot, no GUI)."""
    require("matplotlib", "to draw the demo's plot and animation")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    FigureCanvasAgg(figure)
    return figure


class AnimationFrames:
    """The frames of optimisation.gif: view 0's target | current render | 4 x |difference|,
    each shown ``scale`` times its size (whole pixels), under captions that matplotlib
    draws.

    ``frame(target, current, step, steps)`` -> uint8 [H, W, 3]: the images are placed in
    torch; only the caption strip is drawn again for every frame.
    """

    CAPTION_PX = 20
    GAP_PX = 2

    def __init__(self, height: int, width: int, scale: Optional[int] = None) -> None:
        # Panels at least 160 pixels wide, so that the captions fit.
        self.scale = max(1, math.ceil(160 / width)) if scale is None else scale
        self.panel = (height * self.scale, width * self.scale)
        total_w = 3 * self.panel[1] + 2 * self.GAP_PX
        self.size = (self.panel[0] + self.CAPTION_PX, total_w)
        self.figure = _figure(total_w, self.CAPTION_PX)
        self.figure.patch.set_facecolor("white")
        self.captions = [
            self.figure.text(
                (k * (self.panel[1] + self.GAP_PX) + self.panel[1] / 2) / total_w,
                0.5,
                text,
                ha="center",
                va="center",
                fontsize=9,
                color="0.1",
            )
            for k, text in enumerate(("target", "", "difference \u00d74"))
        ]

    def _caption(self, text: str) -> torch.Tensor:
        self.captions[1].set_text(text)
        canvas = self.figure.canvas
        canvas.draw()
        return torch.from_numpy(np.asarray(canvas.buffer_rgba())[..., :3].copy())

    def frame(self, target: torch.Tensor, current: torch.Tensor, step: int, steps: int) -> torch.Tensor:
        target = target.detach().cpu().float().clamp(0, 1)
        current = current.detach().cpu().float().clamp(0, 1)
        difference = ((current - target).abs() * 4).clamp(0, 1)
        panels = [
            (p * 255).round().to(torch.uint8).repeat_interleave(self.scale, 0).repeat_interleave(self.scale, 1)
            for p in (target, current, difference)
        ]
        gap = torch.full((self.panel[0], self.GAP_PX, 3), 255, dtype=torch.uint8)
        row = torch.cat([panels[0], gap, panels[1], gap, panels[2]], dim=1)
        return torch.cat([self._caption(f"step {step}/{steps}"), row], dim=0)


def loss_figure(path: str, mse: Sequence[float], errors: Dict[str, Sequence[float]]) -> None:
    """Write loss.png: one axis each for the image error and view 0's rotation, position
    and focal length errors, against the step (matplotlib). ``mse[k]`` and
    ``errors[key][k]`` are the values before step k's update (the last after the run)."""
    figure = _figure(720, 920)
    from matplotlib import ticker

    panels = (
        (mse, "image error\n(mean squared,\nall views; log scale)", "log", 1.0),
        (errors["rotation_error_deg"], "camera 0\nrotation error\n(degrees; log scale)", "log", 1.0),
        (errors["translation_error"], "camera 0\nposition error\n(world units)", "linear", 1.0),
        (errors["focal_error"], "camera 0\nfocal length error\n(% of the true one)", "linear", 100.0),
    )
    axes = figure.subplots(len(panels), 1, sharex=True)
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red")
    for ax, (values, label, scale, factor), colour in zip(axes, panels, colours):
        ax.plot(range(len(values)), [v * factor for v in values], color=colour, linewidth=1.5)
        ax.set_yscale(scale)
        if scale == "log":
            # Labelled ticks as plain numbers (0.02), as many per power of ten as the
            # range leaves room for: every digit within one power of ten, 1, 2 and 5
            # within two, 1 and 3 within four, else the powers of ten.
            positive = [v * factor for v in values if v > 0]
            decades = math.log10(max(positive) / min(positive)) if positive else 0.0
            subs = (
                (1, 2, 3, 4, 5, 6, 7, 8, 9)
                if decades < 1
                else (1, 2, 5)
                if decades < 2
                else (1, 3)
                if decades < 4
                else (1,)
            )
            ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=subs))
            ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_ylabel(label)
        ax.grid(True, which="major", color="0.85")
        ax.grid(True, which="minor", color="0.93", linewidth=0.5)
    axes[-1].set_xlabel("optimisation step")
    axes[0].set_title("pulsar_py demo: camera 0 and the spheres optimised together")
    figure.align_ylabels(axes)
    figure.tight_layout()
    figure.savefig(path)


# ---------------------------------------------------------------------------------------
# The run


def _progress_bar(total: int, label: str, enabled: bool):
    """A tqdm bar on stderr (disabled: draws nothing). Redrawn at most 10 times a second
    on a terminal; in a log or pipe every 5 seconds, so the log stays short."""
    tqdm = require("tqdm", "for the demo's progress bar").tqdm
    interactive = bool(getattr(sys.stderr, "isatty", None) and sys.stderr.isatty())
    return tqdm(
        total=total,
        desc=label,
        unit="step",
        file=sys.stderr,
        disable=not enabled,
        mininterval=0.1 if interactive else 5.0,
        dynamic_ncols=interactive,
    )


def _render_views(
    renderer, scene: DemoScene, settings: DemoSettings, params: DemoParameters, view0_weight: float = 1.0
) -> torch.Tensor:
    """[V, H, W, 3] the current images of all views, in one native call."""
    positions, colours, radii = params.sphere_position, params.sphere_colour, params.radii()
    if view0_weight != 1.0:
        # Per-view copies of the spheres ([V, N, ...], still one call): view 0's copy
        # passes on only ``view0_weight`` of its gradient.
        def per_view(t: torch.Tensor) -> torch.Tensor:
            return torch.stack([scale_gradient(t, view0_weight)] + [t] * (settings.views - 1))

        positions, colours, radii = per_view(positions), per_view(colours), per_view(radii)
    return renderer(
        positions,
        colours,
        radii,
        params.cam_params(),
        gamma=settings.gamma,
        max_depth=settings.max_depth,
        min_depth=settings.min_depth,
        bg_col=scene.bg_col,
    )


def render_targets(renderer, scene: DemoScene, settings: DemoSettings) -> torch.Tensor:
    """[V, H, W, 3] the ground-truth images of every view (no gradient)."""
    with torch.no_grad():
        return renderer(
            scene.positions,
            scene.colours,
            scene.radii,
            scene.cam_params,
            gamma=settings.gamma,
            max_depth=settings.max_depth,
            min_depth=settings.min_depth,
            bg_col=scene.bg_col,
        )


def make_optimiser(params: DemoParameters, settings: DemoSettings) -> torch.optim.Adam:
    """Adam over the parameter groups, each at its learning rate (settings.learning_rates)."""
    return torch.optim.Adam(
        [{"params": [getattr(params, name)], "lr": lr} for name, lr in settings.learning_rates.items()],
        betas=(0.9, 0.99),
    )


#: ``run_demo``'s per-step callback: (step, ground truth, current parameters, losses).
StepCallback = Callable[[int, DemoScene, DemoParameters, Dict[str, float]], None]


def run_demo(
    settings: DemoSettings,
    device: torch.device,
    out_dir: Optional[str] = None,
    progress: bool = True,
    on_step: Optional[StepCallback] = None,
) -> Dict[str, object]:
    """Run the demo on ``device``; write its files to ``out_dir`` (None: none) and
    return the summary (the content of summary.json). ``on_step`` is called after every
    step with the losses {"loss": the blurred loss optimised, "mse": the plain one}."""
    from .. import Renderer

    settings.check()
    start = time.perf_counter()
    scene = build_scene(settings, device)
    renderer = Renderer(settings.width, settings.height, n_channels=3).to(device)
    targets = render_targets(renderer, scene, settings)
    params = perturb(scene, settings)
    optimiser = make_optimiser(params, settings)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: learning_rate_factor(settings, step))

    with torch.no_grad():
        initial_images = _render_views(renderer, scene, settings, params)
    initial = dict(pose_errors(params, scene), psnr_db=psnr_db(initial_images, targets))

    frame_every = max(1, settings.steps // settings.gif_frames)
    snapshots: List[Tuple[int, torch.Tensor]] = []  # (step, view 0's image) for the animation
    mse: List[float] = []  # plain mean squared error of all views, per step
    # Pose errors before each step's update: the initial ones first.
    errors: Dict[str, List[float]] = {
        key: [initial[key]] for key in ("rotation_error_deg", "translation_error", "focal_error")
    }
    bar = _progress_bar(settings.steps, f"demo ({device.type})", progress)
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
            snapshots.append((step, images[0].detach().cpu()))
        if on_step is not None:
            on_step(step, scene, params, {"loss": float(loss.detach()), "mse": mse[-1]})
        bar.set_postfix_str(
            f"mse {mse[-1]:.2e}, rotation error {errors['rotation_error_deg'][-1]:5.2f} deg", refresh=False
        )
        bar.update(1)
    bar.close()

    with torch.no_grad():
        final_images = _render_views(renderer, scene, settings, params)
    final = dict(pose_errors(params, scene), psnr_db=psnr_db(final_images, targets))
    mse.append(float(((final_images - targets) ** 2).mean()))
    if out_dir is not None:
        snapshots.append((settings.steps, final_images[0].cpu()))
        os.makedirs(out_dir, exist_ok=True)
        write_image(os.path.join(out_dir, "target.png"), side_by_side(list(targets)))
        write_image(os.path.join(out_dir, "initial.png"), side_by_side(list(initial_images)))
        write_image(os.path.join(out_dir, "final.png"), side_by_side(list(final_images)))
        animation = AnimationFrames(settings.height, settings.width)
        target0 = targets[0].cpu()
        # Every frame 100 ms; the last, the result, is held for GIF_HOLD_MS before the loop restarts.
        write_animation(
            os.path.join(out_dir, "optimisation.gif"),
            [animation.frame(target0, image, step, settings.steps) for step, image in snapshots],
            frame_ms=[GIF_FRAME_MS] * (len(snapshots) - 1) + [GIF_HOLD_MS],
        )
        loss_figure(os.path.join(out_dir, "loss.png"), mse, errors)
        positions = params.sphere_position.detach().cpu().clone()
        positions[:, 2].neg_()  # Pulsar's left-handed world -> right-handed (module docstring)
        write_ply(
            os.path.join(out_dir, "scene.ply"),
            positions,
            params.sphere_colour.detach(),
            params.radii().detach(),
            colour_type="float",
        )
    summary: Dict[str, object] = {
        "initial": initial,
        "final": final,
        "steps": settings.steps,
        "seconds": round(time.perf_counter() - start, 3),
        "device": device.type,
    }
    if out_dir is not None:
        with open(os.path.join(out_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
            f.write("\n")
    return summary


# ---------------------------------------------------------------------------------------
# Command line


def summary_line(summary: Dict[str, object]) -> str:
    """The figures of a summary (summary.json's content) as the command prints them:
    "rotation error 8.00 -> 0.108 deg, translation error ..., PSNR 15.2 -> 40.7 dB"."""
    initial, final = summary["initial"], summary["final"]
    return (
        f"rotation error {initial['rotation_error_deg']:.2f} -> {final['rotation_error_deg']:.3f} deg, "
        f"translation error {initial['translation_error']:.3f} -> {final['translation_error']:.3f}, "
        f"focal error {100 * initial['focal_error']:.1f} -> {100 * final['focal_error']:.1f} %, "
        f"PSNR {initial['psnr_db']:.1f} -> {final['psnr_db']:.1f} dB"
    )


def _default_device() -> str:
    from .. import build_info

    return "cuda" if "cuda" in build_info()["backends"] and torch.cuda.is_available() else "cpu"


def _build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    from .viewer.deps import INSTALL
    from .viewer.server import DEFAULT_HOST, DEFAULT_PORT

    defaults = DemoSettings()
    parser = argparse.ArgumentParser(
        prog=command_prog("demo", prog),
        description="Joint optimisation of a camera (rotation, position, focal length) and thousands of "
        "spheres (positions, colours, radii) from three views. Writes target.png, initial.png, "
        "final.png, optimisation.gif, loss.png, scene.ply and summary.json to --out.",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default=None,
        help="backend (default: cuda when this build has it and a GPU is present, else cpu)",
    )
    parser.add_argument("--out", default="pulsar_demo", help="output folder (default: ./pulsar_demo)")
    parser.add_argument(
        "--steps", type=positive_int, default=defaults.steps, help=f"optimisation steps (default {defaults.steps})"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the scene and perturbations")
    parser.add_argument("--width", type=positive_int, default=defaults.width, help="image width (default 160)")
    parser.add_argument("--height", type=positive_int, default=defaults.height, help="image height (default 120)")
    parser.add_argument(
        "--spheres",
        type=positive_int,
        default=defaults.n_spheres,
        help=f"spheres on the knot (default {defaults.n_spheres}; the floor adds about 2000)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    view = parser.add_argument_group(f"browser view (needs viser: {INSTALL})")
    view.add_argument(
        "--view",
        action="store_true",
        help="show the spheres in the browser while they train, with the losses and a pause button; "
        "keeps serving after the run until Ctrl-C (docs/viewer.md)",
    )
    view.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"--view: port to serve on (default {DEFAULT_PORT})"
    )
    view.add_argument(
        "--host", default=DEFAULT_HOST, help=f"--view: address to listen on (default {DEFAULT_HOST}: this machine only)"
    )
    return parser


def _live_view(args: argparse.Namespace, settings: DemoSettings) -> Tuple[object, StepCallback]:
    """(LiveViewer, run_demo's on_step that updates it) for ``--view``."""
    from .viewer import LiveViewer

    viewer = LiveViewer(
        args.port, args.host, gamma=settings.gamma, right_handed=False, title="pulsar_py demo", announce=False
    )

    def on_step(step: int, scene: DemoScene, params: DemoParameters, losses: Dict[str, float]) -> None:
        if step == 0:
            viewer.background = scene.bg_col.tolist()
        viewer.update(params.sphere_position, params.sphere_colour, params.radii(), losses=losses, step=step)

    return viewer, on_step


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """``pulsar-py demo [--device cpu|cuda] [--out DIR] [--steps N] [--view]``; returns the
    exit status. ``prog``: the program name for help and usage (default "pulsar-py demo")."""
    args = _build_parser(prog).parse_args(argv)
    try:
        device = command_device(args.device or _default_device())
    except ValueError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    settings = DemoSettings(
        width=args.width, height=args.height, n_spheres=args.spheres, steps=args.steps, seed=args.seed
    )
    viewer, on_step, finished = None, None, False
    try:
        settings.check()
        if args.view:
            try:
                viewer, on_step = _live_view(args, settings)
            except (ImportError, OSError, ValueError) as exc:  # ImportError: viser missing
                print(f"demo: --view: {exc}", file=sys.stderr)
                return 1
            print(f"demo: viewer at {viewer.url}", flush=True)
        summary = run_demo(settings, device, args.out, progress=not args.quiet, on_step=on_step)
        finished = True
    except ValueError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"demo: --out: cannot write to {args.out!r}: {exc}", file=sys.stderr)
        return 1
    finally:
        if viewer is not None and not finished:
            viewer.close()
    print(f"{summary_line(summary)}; {summary['steps']} steps on {summary['device']} in {summary['seconds']:.1f} s")
    print(
        f"wrote target.png, initial.png, final.png, optimisation.gif, loss.png, scene.ply, summary.json to {args.out}",
        flush=True,
    )
    if viewer is not None:
        print(f"demo: the viewer goes on at {viewer.url} (Ctrl-C to stop)", flush=True)
        try:
            viewer.wait()
        finally:
            viewer.close()
    return 0
