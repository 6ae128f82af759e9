"""``pulsar-py gradcheck``: the gradient check of pulsar_py.gradcheck on built-in random
scenes, one table per scene."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from ..cameras.params import camera_from_params
from ..cameras.rotations import axis_angle_to_matrix
from ..gradcheck import gradcheck
from ..renderer import Renderer
from .args import command_device


@dataclass
class BuiltinScene:
    """A named renderer configuration and call, for ``python -m pulsar_py gradcheck``."""

    name: str
    renderer_kwargs: dict
    call_kwargs: dict

    def describe(self) -> str:
        r, c = self.renderer_kwargs, self.call_kwargs
        shape = tuple(c["vert_pos"].shape)
        return (
            f"{r['width']}x{r['height']}, {shape[-2]} spheres"
            f"{'' if len(shape) == 2 else f' x {shape[0]} batch'}, C={r['n_channels']}, "
            f"cam_params[{c['cam_params'].shape[-1]}], gamma={c['gamma']:g}, "
            f"opacity={'yes' if c['opacity'] is not None else 'no'}"
        )


def _random_camera(gen: torch.Generator, length: int, orthographic: bool, width: int) -> torch.Tensor:
    """[L] a Pulsar camera vector: small random pose, moderate field of view."""
    u = lambda *shape: torch.rand(shape, generator=gen, dtype=torch.float64)  # noqa: E731
    position = (u(3) - 0.5) * 0.6
    axis_angle = (u(3) - 0.5) * 0.8
    if length in (11, 13):
        m = axis_angle_to_matrix(axis_angle[None])[0]
        rotation = torch.cat([m[0] * (0.8 + u(1)), m[1] * (0.8 + u(1)) + 0.3 * m[0]])  # not orthonormal
    else:
        rotation = axis_angle
    focal = torch.zeros(1, dtype=torch.float64) if orthographic else 0.15 + 0.3 * u(1)
    sensor = 2.0 + 2.0 * u(1) if orthographic else focal * (0.8 + 0.5 * u(1))
    parts = [position, rotation, focal, sensor]
    if length in (10, 13):
        parts.append((u(2) - 0.5) * 0.3 * width + 0.29)  # non-integer principal point offsets
    return torch.cat(parts)


def _builtin_scene(
    name: str,
    gen: torch.Generator,
    *,
    width: int = 20,
    height: int = 15,
    n_spheres: int = 8,
    n_channels: int = 3,
    orthographic: bool = False,
    right_handed: bool = False,
    cam_length: int = 8,
    with_opacity: bool = True,
    gamma: float = 0.1,
    min_depth: float = -1.0,
    first_R_then_T: bool = False,
    batch: Optional[int] = None,
) -> BuiltinScene:
    """Spheres placed through the camera (random film position, depth, radius 2-5 px)."""
    u = lambda *shape: torch.rand(shape, generator=gen, dtype=torch.float64)  # noqa: E731
    cam = _random_camera(gen, cam_length, orthographic, width)
    camera = camera_from_params(cam[None], width, height, orthographic, right_handed, first_R_then_T)
    focal = float(camera.focal[0])
    near = (focal + 0.3) if min_depth < 0 else (focal + 2e-6 if min_depth == 0 else min_depth)
    far = near + 6.0
    n_sets = batch or 1
    eye, p00, pdx, pdy = camera.eye[0], camera.p00[0], camera.pdx[0], camera.pdy[0]
    axis = camera.optical_axis()[0]
    pixel = float(pdx.norm())
    pos, rad = [], []
    for _ in range(n_sets):
        film = p00 + (u(n_spheres, 1) * (width + 2) - 1) * pdx + (u(n_spheres, 1) * (height + 2) - 1) * pdy
        depth = near + 0.5 + 4.0 * u(n_spheres)
        r_px = 2.0 + 3.0 * u(n_spheres)
        if orthographic:
            r = r_px * pixel
            pos.append(film + (depth + r)[:, None] * axis)
        else:
            r = r_px * pixel * depth / focal
            pos.append(eye + (depth + r)[:, None] * torch.nn.functional.normalize(film - eye, dim=-1))
        rad.append(r)
    squeeze = (lambda t: t[0]) if batch is None else (lambda t: t)  # noqa: E731
    vert_pos, vert_rad = squeeze(torch.stack(pos)), squeeze(torch.stack(rad))
    lead = vert_rad.shape
    if batch is not None:
        # B cameras: the first one moved a little (position and rotation entries only).
        n_pose = 3 + (6 if cam_length in (11, 13) else 3)
        jitter = torch.zeros(batch, cam.numel(), dtype=torch.float64)
        jitter[1:, :n_pose] = 0.02 * (u(batch - 1, n_pose) - 0.5)
        cam = cam[None] + jitter
    call = dict(
        vert_pos=vert_pos,
        vert_col=u(*lead, n_channels),
        vert_rad=vert_rad,
        cam_params=cam,
        gamma=gamma,
        max_depth=far,
        min_depth=0.0 if min_depth == 0 else near,
        bg_col=u(n_channels),
        opacity=(0.3 + 0.7 * u(*lead)) if with_opacity else None,
        first_R_then_T=first_R_then_T,
    )
    renderer = dict(
        width=width,
        height=height,
        orthogonal_projection=orthographic,
        right_handed_system=right_handed,
        n_channels=n_channels,
    )
    return BuiltinScene(name, renderer, call)


def builtin_scenes(seed: int = 0) -> List[BuiltinScene]:
    """The scenes of ``python -m pulsar_py gradcheck`` (deterministic for a seed)."""
    gen = torch.Generator().manual_seed(seed)
    return [
        _builtin_scene("perspective", gen),
        _builtin_scene("orthographic", gen, orthographic=True, gamma=0.2),
        _builtin_scene("right-handed, principal point", gen, right_handed=True, cam_length=10, gamma=0.3),
        _builtin_scene("6D camera, principal point, R then T", gen, cam_length=13, first_R_then_T=True),
        _builtin_scene("8 channels, no opacity", gen, n_channels=8, with_opacity=False, gamma=0.5),
        _builtin_scene("no opacity, min_depth 0, gamma 0.05", gen, with_opacity=False, min_depth=0.0, gamma=0.05),
        _builtin_scene(
            "orthographic right-handed 6D, gamma 1", gen, orthographic=True, right_handed=True, cam_length=11, gamma=1.0
        ),
        _builtin_scene("batch of 2", gen, batch=2, cam_length=10),
    ]


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pulsar_py gradcheck",
        description="Check every gradient of the renderer against central finite differences (float64) "
        "on built-in random scenes. Exit status 0 when all pass, 1 otherwise.",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="backend to check (default cpu)")
    parser.add_argument(
        "--dtype",
        choices=("float64", "float32"),
        default="float64",
        help="dtype of the analytic gradient; finite differences are float64 (default float64)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random scenes (default 0)")
    parser.add_argument(
        "--max-entries",
        type=int,
        default=None,
        help="check at most this many entries per parameter group (default: all)",
    )
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m pulsar_py gradcheck [--device cpu|cuda] [--dtype float64|float32] [--seed N]``.

    Prints a progress line and a table per built-in scene; returns 0 if every scene
    passes, 1 otherwise.
    """
    args = _parse_args(argv)

    try:
        command_device(args.device)
    except ValueError as exc:
        print(f"gradcheck: {exc}", file=sys.stderr)
        return 1
    dtype = torch.float64 if args.dtype == "float64" else torch.float32
    scenes = builtin_scenes(args.seed)
    failed = []
    start = time.perf_counter()
    for i, scene in enumerate(scenes, 1):
        print(f"[{i}/{len(scenes)}] {scene.name}: {scene.describe()} ...", flush=True)
        t0 = time.perf_counter()
        renderer = Renderer(**scene.renderer_kwargs).to(args.device)
        report = gradcheck(
            renderer, **scene.call_kwargs, analytic_dtype=dtype, max_entries=args.max_entries, seed=args.seed
        )
        print(report.table())
        print(
            f"[{i}/{len(scenes)}] {scene.name}: {'passed' if report.passed else 'FAILED'} "
            f"in {time.perf_counter() - t0:.2f} s\n",
            flush=True,
        )
        if not report.passed:
            failed.append(scene.name)
    total = time.perf_counter() - start
    if failed:
        print(f"gradcheck: FAILED on {len(failed)} of {len(scenes)} scenes ({'; '.join(failed)}) in {total:.1f} s")
        return 1
    print(f"gradcheck: all {len(scenes)} scenes passed ({args.device}, {args.dtype}) in {total:.1f} s")
    return 0
