"""Fit spheres to multi-view images: positions, colours, radii and opacities.

The situation: images of an object from several calibrated cameras, and no 3D model. A
cloud of spheres starts as a random blob where the object is and is optimised with Adam
(one learning rate per parameter group) until its renders match every image; all views
render in one batched call. Here the images are renders of the built-in rainbow trefoil
knot, so the result can be compared with them.

    python examples/fit_spheres_multiview.py [--views 4] [--width 128 --height 96]
        [--spheres 2000] [--steps 300] [--out DIR] [--device cpu|cuda]

(with pulsar_py installed, or ``PYTHONPATH=.`` from the repository root). With --out it
writes targets.png and fit.png (the views side by side).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Dict, Optional, Sequence

import torch

from pulsar_py import Renderer
from pulsar_py.cameras.look_at import look_at_params, sensor_width_for_fov
from pulsar_py.io.images import write_image
from pulsar_py.tools.sample_scene import make_sample_scene

# Depth range around cameras 12 units from the object; gamma 0.05: soft enough for
# gradients at the edges, firm enough for occlusion.
RENDER = dict(gamma=0.05, max_depth=20.0, min_depth=4.0)
BACKGROUND = (0.07, 0.08, 0.11)


def cameras_around(views: int, distance: float = 12.0) -> torch.Tensor:
    """[views, 8] Pulsar camera vectors on a ring around the origin, 20 degrees up, looking at it."""
    elevation = math.radians(20.0)
    rows = []
    for k in range(views):
        azimuth = 2 * math.pi * k / views
        eye = distance * torch.tensor(
            [math.cos(elevation) * math.sin(azimuth), math.sin(elevation), -math.cos(elevation) * math.cos(azimuth)],
            dtype=torch.float64,
        )
        rows.append(look_at_params(eye, [0.0, 0.0, 0.0], sensor_width=sensor_width_for_fov(45.0)))
    return torch.stack(rows)


def psnr(images: torch.Tensor, targets: torch.Tensor) -> float:
    return -10 * math.log10(float(((images - targets) ** 2).mean()))


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--views", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--spheres", type=int, default=2000, help="spheres to fit")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default=None, help="folder for targets.png and fit.png")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    start = time.perf_counter()
    f32 = dict(dtype=torch.float32, device=device)

    # Targets: the knot (centred at the origin) from every camera, in one call.
    knot = make_sample_scene(n_spheres=3600, dtype=torch.float64)
    knot_pos = knot.positions - torch.tensor([0.0, 0.5, 20.0], dtype=torch.float64)
    cams = cameras_around(args.views).to(**f32)
    bg = torch.tensor(BACKGROUND, **f32)
    renderer = Renderer(args.width, args.height).to(device)
    with torch.no_grad():
        targets = renderer(
            knot_pos.to(**f32), knot.colours.to(**f32), knot.radii.to(**f32), cams, bg_col=bg, **RENDER
        )  # [V, H, W, 3]

    # The start: a random blob of grey, half-transparent spheres where the object is.
    gen = torch.Generator().manual_seed(0)
    n = args.spheres
    positions = ((torch.rand(n, 3, generator=gen) - 0.5) * 7.0).to(**f32).requires_grad_()
    colours = torch.full((n, 3), 0.5, **f32).requires_grad_()
    log_radii = torch.full((n,), math.log(0.3), **f32).requires_grad_()
    opacity_logits = torch.zeros(n, **f32).requires_grad_()  # sigmoid(0) = 0.5

    def render() -> torch.Tensor:
        return renderer(
            positions, colours, log_radii.exp(), cams, bg_col=bg, opacity=torch.sigmoid(opacity_logits), **RENDER
        )

    with torch.no_grad():
        initial_psnr = psnr(render(), targets)
    # Learning rates: about the step size per iteration in each group's units (Adam).
    optimiser = torch.optim.Adam(
        [
            {"params": [positions], "lr": 2e-2},  # world units
            {"params": [colours], "lr": 2e-2},  # RGB
            {"params": [log_radii], "lr": 2e-2},  # log radius
            {"params": [opacity_logits], "lr": 5e-2},  # logit of the opacity
        ]
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step / args.steps, 1.0)))
    )
    for step in range(args.steps):
        optimiser.zero_grad()
        loss = ((render() - targets) ** 2).mean()
        loss.backward()
        optimiser.step()
        schedule.step()
        with torch.no_grad():
            colours.clamp_(0.0, 1.0)
        if step % max(1, args.steps // 10) == 0:
            print(f"step {step:4d}: PSNR {-10 * math.log10(float(loss.detach())):.2f} dB", file=sys.stderr)

    with torch.no_grad():
        fit = render()
    result = {
        "initial_psnr_db": initial_psnr,
        "final_psnr_db": psnr(fit, targets),
        "seconds": time.perf_counter() - start,
    }
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        write_image(os.path.join(args.out, "targets.png"), torch.cat(list(targets.cpu()), dim=1))
        write_image(os.path.join(args.out, "fit.png"), torch.cat(list(fit.cpu()), dim=1))
    print(
        f"PSNR over {args.views} views: {result['initial_psnr_db']:.2f} -> {result['final_psnr_db']:.2f} dB "
        f"({n} spheres, {args.steps} steps, {result['seconds']:.1f} s)"
    )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
