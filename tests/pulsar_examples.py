"""The optimisation loops of PyTorch3D's three Pulsar examples, against pulsar_py.

Each loop keeps its example's scene construction (seed 1: centres uniform in a 10-unit
cube 25 to 35 units in front of the camera), renderer settings, camera vectors, loss (sum
of squared differences), optimiser (plain SGD) and learning rates, and prunes spheres
after each step as its example does. The examples fit reference images; here the targets
are rendered by the same renderer from the scenes those references show:

* cam (pulsar_cam.py): 20 spheres; the camera starts perturbed (position, rotation,
  focal length and sensor width) and is fitted to the image of the unperturbed camera.
* optimisation (pulsar_optimization.py): 10 000 grey spheres of radius 0.3 fitted to the
  image of the 20-sphere scene (gamma 0.1).
* multiview (pulsar_multiview.py): grey spheres of radius 0.05 fitted to 8 views of a
  10-sphere scene (gamma 0.1).

``size`` (default 1000, the examples') shrinks the image for quick runs. The cam loop
renders the whole view at that resolution and weights its loss by (1000 / size)^2 (the
camera gradient sums over pixels; this keeps the example's step sizes). The other two
keep the example's pixel size (sensor width 2 * size / 1000): their images are the central
size x size crops of the example's, so each sphere covers as many pixels as there and its
Pulsar-scaled gradients (averages over its pixels) are the same.

Run as a script for the examples' full size (slow on a CPU):
    python tests/pulsar_examples.py [cam|optimisation|multiview] [--size S] [--steps T]
        [--spheres N] [--gradient-scaling exact|pulsar]
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from typing import List

import torch

from pulsar_py import Renderer
from pulsar_py.cameras.rotations import axis_angle_to_matrix

FULL_SIZE = 1000
MAX_DEPTH = 45.0
# Pruned spheres are parked here (behind every camera), as the examples do.
PARKED = -1000.0


@dataclass
class Run:
    """Losses per step (before that step's update) and spheres left unpruned."""

    losses: List[float] = field(default_factory=list)
    spheres_left: int = -1
    error: str = ""  # a renderer error that ended the run (inputs out of range)

    @property
    def converged_ratio(self) -> float:
        """Final over first loss; inf when the run ended in an error or a non-finite loss."""
        if self.error or not self.losses or not math.isfinite(self.losses[-1]):
            return math.inf
        return self.losses[-1] / self.losses[0]


def _cube_spheres(n: int, *batch: int) -> torch.Tensor:
    pos = torch.rand(*batch, n, 3) * 10.0
    pos[..., 2] += 25.0
    pos[..., :2] -= 5.0
    return pos


def _rotation_6d(axis_angle: List[float]) -> torch.Tensor:
    """The 6D rotation (first two matrix rows) of an axis-angle vector."""
    return axis_angle_to_matrix(torch.tensor([axis_angle]))[0, :2, :].reshape(6)


def _step(loss: torch.Tensor, optimizer: torch.optim.Optimizer, run: Run) -> bool:
    run.losses.append(float(loss.detach()))
    if not math.isfinite(run.losses[-1]):
        return False
    loss.backward()
    optimizer.step()
    return True


def cam_loop(size: int = FULL_SIZE, steps: int = 300, gradient_scaling: str = "pulsar") -> Run:
    """pulsar_cam.py: fit camera position, 6D rotation, focal length and sensor width."""
    torch.manual_seed(1)
    n = 20
    pos = _cube_spheres(n)
    col = torch.rand(n, 3)
    rad = torch.rand(n)
    renderer = Renderer(size, size, n, right_handed_system=True, gradient_scaling=gradient_scaling)
    true_cam = torch.cat([torch.zeros(3), _rotation_6d([0.0, math.pi, 0.0]), torch.tensor([5.0, 2.0])])
    with torch.no_grad():
        target = renderer(pos, col, rad, true_cam, 0.1, MAX_DEPTH)
    cam_pos = torch.tensor([0.1, 0.1, 0.0], requires_grad=True)
    cam_rot = _rotation_6d([0.02, math.pi + 0.02, 0.01]).requires_grad_()
    cam_sensor = torch.tensor([4.8, 1.8], requires_grad=True)
    optimizer = torch.optim.SGD(
        [{"params": [cam_pos], "lr": 1e-4}, {"params": [cam_rot], "lr": 5e-6}, {"params": [cam_sensor], "lr": 1e-4}]
    )
    weight = (FULL_SIZE / size) ** 2
    run = Run()
    for _ in range(steps):
        optimizer.zero_grad()
        try:
            image = renderer(pos, col, rad, torch.cat([cam_pos, cam_rot, cam_sensor]), 0.1, MAX_DEPTH)
        except ValueError as error:  # the camera left the valid range
            run.error = str(error)
            break
        if not _step(((image - target) ** 2).sum() * weight, optimizer, run):
            break
    return run


def _prune(pos: torch.nn.Parameter, col: torch.nn.Parameter, rad: torch.nn.Parameter) -> None:
    """The examples' cleanup: clamp colours, park spheres that shrank or turned white."""
    with torch.no_grad():
        col.clamp_(0.0, 1.0)
        small = rad < 0.001
        pos[small] = PARKED
        rad[small] = 0.0001
        pos[(col - 1.0).abs().sum(-1) <= 0.2] = PARKED


def _spheres_left(pos: torch.Tensor) -> int:
    return int((pos != PARKED).any(-1).sum())


def optimisation_loop(
    size: int = FULL_SIZE, steps: int = 100, n_points: int = 10_000, gradient_scaling: str = "pulsar"
) -> Run:
    """pulsar_optimization.py: fit positions, colours and radii of grey spheres."""
    torch.manual_seed(1)
    target_pos, target_col, target_rad = _cube_spheres(20), torch.rand(20, 3), torch.rand(20)
    torch.manual_seed(1)
    pos = torch.nn.Parameter(_cube_spheres(n_points))
    col = torch.nn.Parameter(torch.ones(n_points, 3) * 0.5)
    rad = torch.nn.Parameter(torch.ones(n_points) * 0.3)
    cam = torch.tensor([0.0, 0.0, 0.0, 0.0, math.pi, 0.0, 5.0, _sensor_width(size)])
    renderer = Renderer(size, size, n_points, n_track=32, right_handed_system=True, gradient_scaling=gradient_scaling)
    with torch.no_grad():
        target = renderer(target_pos, target_col, target_rad, cam, 0.1, MAX_DEPTH)
    optimizer = torch.optim.SGD(
        [{"params": [col], "lr": 1e0}, {"params": [rad], "lr": 5e-3}, {"params": [pos], "lr": 1e-2}]
    )
    run = Run()
    for _ in range(steps):
        optimizer.zero_grad()
        try:
            image, _info = renderer(pos, col, rad, cam, 1.0, MAX_DEPTH, return_forward_info=True)
        except ValueError as error:  # e.g. a radius stepped below 0
            run.error = str(error)
            break
        if not _step(((image - target) ** 2).sum(), optimizer, run):
            break
        _prune(pos, col, rad)
    run.spheres_left = _spheres_left(pos)
    return run


def _sensor_width(size: int) -> float:
    """The examples' sensor width (2.0 for 1000 pixels) at their pixel size."""
    return 2.0 * size / FULL_SIZE


def multiview_cameras(size: int = FULL_SIZE, angles=(-1.5, -0.8, -0.4, -0.1, 0.1, 0.4, 0.8, 1.5)) -> torch.Tensor:
    """[8, 8] camera vectors on a circle of radius 35 around (0, 0, 30), facing its centre."""
    return torch.tensor(
        [
            [math.sin(a) * 35.0, 0.0, 30.0 - math.cos(a) * 35.0, 0.0, -a + math.pi, 0.0, 5.0, _sensor_width(size)]
            for a in angles
        ]
    )


def multiview_loop(
    size: int = FULL_SIZE, steps: int = 30, n_points: int = 20_000, gradient_scaling: str = "pulsar"
) -> Run:
    """pulsar_multiview.py: fit positions, colours and radii to 8 views at once."""
    torch.manual_seed(1)
    target_pos, target_col, target_rad = _cube_spheres(10), torch.rand(10, 3) * 0.5, torch.rand(10)
    torch.manual_seed(1)
    pos = torch.nn.Parameter(_cube_spheres(n_points, 1))
    col = torch.nn.Parameter(torch.ones(1, n_points, 3) * 0.5)
    rad = torch.nn.Parameter(torch.ones(1, n_points) * 0.05)
    cams = multiview_cameras(size)
    views = cams.shape[0]
    renderer = Renderer(size, size, n_points, right_handed_system=True, gradient_scaling=gradient_scaling)
    with torch.no_grad():
        target = renderer(
            target_pos.expand(views, -1, -1),
            target_col.expand(views, -1, -1),
            target_rad.expand(views, -1),
            cams,
            0.1,
            MAX_DEPTH,
        )
    optimizer = torch.optim.SGD(
        [{"params": [col], "lr": 1e-1}, {"params": [rad], "lr": 1e-3}, {"params": [pos], "lr": 1e-3}]
    )
    run = Run()
    for _ in range(steps):
        optimizer.zero_grad()
        try:
            image = renderer(
                pos.expand(views, -1, -1), col.expand(views, -1, -1), rad.expand(views, -1), cams, 1.0, MAX_DEPTH
            )
        except ValueError as error:
            run.error = str(error)
            break
        if not _step(((image - target) ** 2).sum(), optimizer, run):
            break
        _prune(pos, col, rad)
    run.spheres_left = _spheres_left(pos[0])
    return run


LOOPS = {"cam": cam_loop, "optimisation": optimisation_loop, "multiview": multiview_loop}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("loop", choices=sorted(LOOPS))
    parser.add_argument("--size", type=int, default=FULL_SIZE)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--spheres", type=int)
    parser.add_argument("--gradient-scaling", default="pulsar", choices=("exact", "pulsar"))
    args = parser.parse_args()
    kwargs = dict(size=args.size, gradient_scaling=args.gradient_scaling)
    if args.steps is not None:
        kwargs["steps"] = args.steps
    if args.spheres is not None:
        kwargs["n_points"] = args.spheres
    start = time.perf_counter()
    run = LOOPS[args.loop](**kwargs)
    seconds = time.perf_counter() - start
    losses = run.losses
    print(
        f"{args.loop} ({args.gradient_scaling}, {args.size}x{args.size}): loss {losses[0]:.0f} -> "
        f"{losses[-1]:.0f} in {len(losses)} steps, min {min(losses):.0f}"
        + (f", {run.spheres_left} spheres left" if run.spheres_left >= 0 else "")
        + (f"; stopped: {run.error}" if run.error else "")
        + f" ({seconds:.0f} s)"
    )


if __name__ == "__main__":
    main()
