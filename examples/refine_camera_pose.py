"""Refine a camera pose from one image, with the spheres known.

The situation: a sphere model of the scene (here the built-in knot over a checkered
floor), an image, and a camera guess that is a few degrees and some centimetres off. The
Pulsar camera vector itself - position, axis-angle rotation, focal length - is optimised
with Adam, one learning rate per part, so that the render matches the image.

Two habits that make pose refinement work with this renderer:
* a soft ``gamma`` (0.1 here): a sphere's edge against the (far) background is almost a
  step for small gamma and gives no gradient; the scene's inner texture gives the rest;
* coarse to fine: compare blurred images first, so that a misplaced structure still
  overlaps its target and the gradient says where to move.

    python examples/refine_camera_pose.py [--width 160 --height 120] [--steps 150] [--device cpu|cuda]

(with pulsar_py installed, or ``PYTHONPATH=.`` from the repository root).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Dict, Optional, Sequence

import torch

from pulsar_py import Renderer
from pulsar_py.cameras.look_at import look_at_params, matrix_to_axis_angle, rotation_angle_deg, rotation_from_params
from pulsar_py.cameras.rotations import axis_angle_to_matrix
from pulsar_py.tools.demo import gaussian_blur
from pulsar_py.tools.demo_setup import DemoSettings, build_scene

RENDER = dict(gamma=0.1, max_depth=24.0, min_depth=5.0)


def pose_error(cam: torch.Tensor, true_cam: torch.Tensor) -> Dict[str, float]:
    """Rotation (degrees) and position (world units) error of an 8-value camera vector."""
    rotation = rotation_angle_deg(
        rotation_from_params(cam[None].double())[0], rotation_from_params(true_cam[None].double())[0]
    )
    return {"rotation_deg": float(rotation), "position": float((cam[:3] - true_cam[:3]).double().norm())}


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--height", type=int, default=120)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--spheres", type=int, default=3000, help="spheres on the knot (the floor adds ~2000)")
    parser.add_argument("--rotation-error", type=float, default=4.0, help="degrees of the initial error")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    start = time.perf_counter()

    # The scene: spheres (known) and the true camera: 13 units from the knot, 25 degrees up.
    scene = build_scene(DemoSettings(width=args.width, height=args.height, n_spheres=args.spheres, views=2), device)
    elevation = math.radians(25.0)
    eye = 13.0 * torch.tensor([0.0, math.sin(elevation), -math.cos(elevation)], dtype=torch.float64)
    true_cam = look_at_params(eye, [0.0, 0.0, 0.0], focal_length=1.0, sensor_width=0.93)  # [8]
    renderer = Renderer(args.width, args.height).to(device)

    def render(cam: torch.Tensor) -> torch.Tensor:
        return renderer(scene.positions, scene.colours, scene.radii, cam, bg_col=scene.bg_col, **RENDER)

    with torch.no_grad():
        image = render(true_cam.float().to(device))  # the "photo"

    # The guess: turned by --rotation-error degrees about a fixed axis, moved by 0.3 units.
    axis = torch.nn.functional.normalize(torch.tensor([0.3, -1.0, 0.4], dtype=torch.float64), dim=0)
    turn = axis_angle_to_matrix((math.radians(args.rotation_error) * axis)[None])[0]
    guess = true_cam.clone()
    guess[3:6] = matrix_to_axis_angle(rotation_from_params(true_cam[None])[0] @ turn)
    guess[0:3] += torch.tensor([0.2, -0.15, 0.15], dtype=torch.float64)
    initial = pose_error(guess, true_cam)

    # The camera vector's parts, each its own tensor with its own learning rate.
    position = guess[0:3].float().to(device).requires_grad_()
    rotation = guess[3:6].float().to(device).requires_grad_()
    focal = guess[6:7].float().to(device).requires_grad_()
    sensor = guess[7:8].float().to(device)
    optimiser = torch.optim.Adam(
        [
            {"params": [position], "lr": 2e-2},  # world units per step
            {"params": [rotation], "lr": 3e-3},  # radians per step
            {"params": [focal], "lr": 2e-3},
        ]
    )  # focal length units
    # Large steps first, small ones at the end (cosine decay to 5 %).
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(step / args.steps, 1.0)))
    )
    for step in range(args.steps):
        optimiser.zero_grad()
        render_now = render(torch.cat([position, rotation, focal, sensor]))
        # Blur: 6 pixels (at 160 wide) at the start, none from half-way on.
        sigma = max(0.0, 6.0 * args.width / 160 * (1 - 2 * step / args.steps))
        loss = (gaussian_blur((render_now - image)[None], sigma) ** 2).mean()
        loss.backward()
        optimiser.step()
        schedule.step()
    cam = torch.cat([position, rotation, focal, sensor]).detach().cpu().double()
    final = pose_error(cam, true_cam)
    result = {
        "initial_rotation_deg": initial["rotation_deg"],
        "final_rotation_deg": final["rotation_deg"],
        "initial_position_error": initial["position"],
        "final_position_error": final["position"],
        "seconds": time.perf_counter() - start,
    }
    print(
        f"rotation error {result['initial_rotation_deg']:.2f} -> {result['final_rotation_deg']:.3f} deg, "
        f"position error {result['initial_position_error']:.3f} -> {result['final_position_error']:.3f} "
        f"({args.steps} steps, {result['seconds']:.1f} s)"
    )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
