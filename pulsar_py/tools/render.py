"""``pulsar-py render``: a PLY point cloud or 3D Gaussian Splatting scene to an image.

Each point becomes a sphere: its position, its colour (``red green blue``; grey when the
file has none), its radius (``radius`` or ``scale``; otherwise estimated from the point
spacing) and its opacity (``opacity`` or ``alpha``; otherwise opaque). A 3DGS scene
(``pulsar_py.io.ply``) gives each Gaussian's sphere its spherical-harmonics colour, seen
along the view direction (``Renderer.render(..., sh_degree=)``), its opacity and one
radius from its scales (``pulsar_py.io.ply.gaussian_radius``). The image format follows
the extension of ``--out`` (``.png``, ``.jpg``, ...). The camera is a
Pulsar camera vector (``--cam-params``), a look-at camera (``--eye``, ``--target``,
``--up``) or, by default, one that fits the whole cloud in view from the +z side
(``--azimuth``/``--elevation`` turn it around the cloud, over the poles too). The field
of view is vertical, ``--fov-y`` (degrees, default 40), as ``Camera.look_at(fov_y=)``;
``--fov-x`` gives the horizontal one instead (``--fov``, its former name, still works and
warns). A camera straight above or below its target takes the fallback up direction of
``pulsar_py.cameras.look_at.up_for_view`` (world -z at the top looking down, for up +y).
The renderer runs in a right-handed system (OpenGL-style: the camera looks along -z of
its frame), so a scan stored in the usual right-handed coordinates is not mirrored; pass
``--left-handed`` for Pulsar's default convention (used with ``--cam-params`` taken from
Pulsar code).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import torch

from ..cameras.look_at import look_at_params, side_of_view
from ..io.images import write_image
from ..io.ply import IgnoredElementsWarning, PointCloud, read_ply
from .args import command_device, command_prog

DEFAULT_COLOUR = (0.62, 0.64, 0.68)
#: The vertical field of view (degrees) when none is given.
DEFAULT_FOV_Y = 40.0
# Pixels of margin around the fitted cloud's bounding sphere, relative to the image.
_FIT_MARGIN = 1.08


def _vector(text: str, length: int, name: str) -> Tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.replace(",", " ").split())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}: expected {length} comma-separated numbers, got {text!r}") from None
    if len(values) != length:
        raise argparse.ArgumentTypeError(f"{name}: expected {length} comma-separated numbers, got {text!r}")
    if not all(math.isfinite(v) for v in values):
        raise argparse.ArgumentTypeError(f"{name}: expected finite numbers, got {text!r}")
    return values


def _cam_params_arg(text: str) -> Tuple[float, ...]:
    values = tuple(float(v) for v in text.replace(",", " ").split())
    if len(values) not in (8, 10, 11, 13):
        raise argparse.ArgumentTypeError(f"--cam-params: expected 8, 10, 11 or 13 numbers, got {len(values)}")
    return values


@dataclass
class CloudFrame:
    """Where a cloud is: ``centre`` [3] and ``radius`` of a sphere holding every point
    (sphere radii included), world units."""

    centre: torch.Tensor
    radius: float


def bounding_sphere(positions: torch.Tensor, radii: torch.Tensor) -> CloudFrame:
    """A sphere around every point: the bounding box's centre, the largest distance + radius."""
    pos = positions.double()
    centre = (pos.amin(0) + pos.amax(0)) / 2
    extent = float(((pos - centre).norm(dim=-1) + radii.double()).max())
    return CloudFrame(centre, max(extent, 1e-9))


def estimate_radius(positions: torch.Tensor, sample: int = 2048, seed: int = 0) -> float:
    """A sphere radius that closes the gaps between neighbouring points (world units).

    Nearest-neighbour distances among a random subset of ``sample`` points, scaled to
    the full count as for a surface (spacing ~ 1/sqrt(density)): twice the median, as
    randomly placed points leave gaps of about twice their nearest-neighbour distance.
    """
    n = positions.shape[0]
    if n < 2:
        return 1.0
    gen = torch.Generator().manual_seed(seed)
    m = min(n, sample)
    subset = positions[torch.randperm(n, generator=gen)[:m]].double()
    distances = torch.cdist(subset, subset)
    distances.fill_diagonal_(float("inf"))
    nearest = distances.min(dim=1).values
    nearest = nearest[torch.isfinite(nearest) & (nearest > 0)]
    if nearest.numel() == 0:
        return 1.0
    spacing = float(nearest.median()) * math.sqrt(m / n)
    return 2.0 * spacing


def half_angles(
    width: int, height: int, fov_y_deg: Optional[float] = None, fov_x_deg: Optional[float] = None
) -> Tuple[float, float]:
    """(horizontal, vertical) half fields of view in radians of a ``width`` x ``height``
    image with square pixels, from its vertical field of view ``fov_y_deg`` or its
    horizontal one ``fov_x_deg`` (degrees; neither: ``DEFAULT_FOV_Y``, both: ValueError)."""
    if fov_y_deg is not None and fov_x_deg is not None:
        raise ValueError(
            f"fov_y_deg, fov_x_deg: give one field of view (square pixels), got {fov_y_deg} and {fov_x_deg}"
        )
    name, value = (
        ("fov_x_deg", fov_x_deg)
        if fov_x_deg is not None
        else ("fov_y_deg", DEFAULT_FOV_Y if fov_y_deg is None else fov_y_deg)
    )
    if not 0 < value < 180:
        raise ValueError(f"{name}: expected degrees in (0, 180), got {value}")
    half = math.radians(value) / 2
    if name == "fov_x_deg":
        return half, math.atan(math.tan(half) * height / width)
    return math.atan(math.tan(half) * width / height), half


def _focal_length(distance: float, frame: CloudFrame) -> float:
    """Focal length of a look-at camera ``distance`` from the cloud's centre: 1, or less
    for a cloud that comes nearer (the renderer sees nothing in front of the image plane
    at the focal length; the sensor width scales with it, so the view stays the same)."""
    gap = distance - frame.radius * 1.01
    return min(1.0, 0.5 * gap) if gap > 0 else min(1.0, 1e-3 * frame.radius)


def _depth_range(distance: float, focal: float, frame: CloudFrame) -> Tuple[float, float]:
    """(near, far) depth of a look-at camera ``distance`` from the cloud's centre with
    focal length ``focal``: the bounding sphere's depths with 1 % to spare, near kept
    beyond the image plane."""
    return max(distance - frame.radius * 1.01, focal * 1.001 + 1e-6), distance + frame.radius * 1.01


def fit_camera(
    frame: CloudFrame,
    width: int,
    height: int,
    fov_y_deg: Optional[float],
    azimuth_deg: float,
    elevation_deg: float,
    up: Sequence[float],
    right_handed: bool,
    fov_x_deg: Optional[float] = None,
) -> Tuple[torch.Tensor, float, float]:
    """A look-at camera showing the whole bounding sphere.

    The camera sits on a sphere around the cloud's centre: azimuth 0, elevation 0 is
    the +z side for y up (for another ``up``, the side perpendicular to it nearest +z,
    or -y: ``look_at.side_of_view``); azimuth turns about ``up``, elevation raises towards
    it, through +-90 (straight above or below, the image's up pointing away from the
    azimuth's side) and beyond. Field of view: see ``half_angles``. Returns
    (cam_params [8] float64, near depth, far depth).
    """
    up_t = torch.nn.functional.normalize(torch.tensor(up, dtype=torch.float64), dim=0)
    forward = side_of_view(up_t)  # from centre to eye, level
    side = torch.cross(up_t, forward, dim=0)
    az, el = math.radians(azimuth_deg), math.radians(elevation_deg)
    level = math.cos(az) * forward + math.sin(az) * side
    direction = math.cos(el) * level + math.sin(el) * up_t
    # The image's up: the direction of rising elevation, perpendicular to the view at every
    # elevation (up itself is parallel to it at +-90 degrees).
    image_up = math.cos(el) * up_t - math.sin(el) * level
    half_h, half_v = half_angles(width, height, fov_y_deg, fov_x_deg)
    distance = _FIT_MARGIN * frame.radius / math.sin(min(half_h, half_v))
    eye = frame.centre + distance * direction
    focal = _focal_length(distance, frame)
    sensor = 2 * focal * math.tan(half_h)
    cam = look_at_params(eye, frame.centre, image_up, focal, sensor, right_handed=right_handed)
    near, far = _depth_range(distance, focal, frame)
    return cam, near, far


def render_point_cloud(
    cloud: PointCloud,
    width: int = 640,
    height: int = 480,
    device: "str | torch.device" = "cpu",
    cam_params: Optional[Sequence[float]] = None,
    eye: Optional[Sequence[float]] = None,
    target: Optional[Sequence[float]] = None,
    up: Sequence[float] = (0.0, 1.0, 0.0),
    fov_y_deg: Optional[float] = None,
    azimuth_deg: float = 0.0,
    elevation_deg: float = 0.0,
    radius: Optional[float] = None,
    radius_scale: float = 1.0,
    gamma: float = 1e-3,
    background: Sequence[float] = (1.0, 1.0, 1.0),
    right_handed: bool = True,
    min_depth: Optional[float] = None,
    max_depth: Optional[float] = None,
    fov_x_deg: Optional[float] = None,
    fov_deg: Optional[float] = None,
) -> torch.Tensor:
    """Render ``cloud`` to an image [height, width, 3] (float32, CPU).

    Colours: the cloud's spherical-harmonics coefficients where it has some of degree >= 1
    (each camera sees the colour along its view direction), else its colours, else grey
    shaded by distance. Radii: ``radius`` if given, else the file's radii, else
    ``estimate_radius``; then times ``radius_scale``. Camera: ``cam_params`` (a Pulsar camera vector) if given;
    else a look-at camera from ``eye`` to ``target`` (default: the cloud's centre), or
    ``fit_camera`` when ``eye`` is None. Field of view: vertical ``fov_y_deg`` (degrees,
    default 40) or horizontal ``fov_x_deg``; ``fov_deg``, the horizontal one's former
    name, is deprecated. The depth range defaults to the cloud's.
    """
    from .. import Renderer

    if fov_deg is not None:
        warnings.warn(
            "render_point_cloud(fov_deg=) is deprecated: it is the horizontal field of view, now "
            "fov_x_deg (fov_y_deg gives the vertical one)",
            DeprecationWarning,
            stacklevel=2,
        )
        if fov_x_deg is not None:
            raise ValueError(f"fov_deg, fov_x_deg: give one, got {fov_deg} and {fov_x_deg}")
        fov_x_deg = fov_deg
    half_h, _ = half_angles(width, height, fov_y_deg, fov_x_deg)
    n = len(cloud)
    if n == 0:
        raise ValueError("ply: the point cloud has no points")
    positions = cloud.positions.double()
    if radius is not None:
        if not radius > 0:
            raise ValueError(f"--radius: expected > 0, got {radius}")
        radii = torch.full((n,), float(radius), dtype=torch.float64)
    elif cloud.radii is not None:
        radii = cloud.radii.double()  # PointCloud checked > 0
    else:
        radii = torch.full((n,), estimate_radius(positions), dtype=torch.float64)
    if not radius_scale > 0:
        raise ValueError(f"--radius-scale: expected > 0, got {radius_scale}")
    radii = radii * radius_scale
    opacity = cloud.opacity.double() if cloud.opacity is not None else None  # PointCloud checked [0, 1]
    frame = bounding_sphere(positions, radii)
    if cam_params is not None:
        cam = torch.tensor(list(cam_params), dtype=torch.float64)
        distance = float((frame.centre - cam[:3]).norm())
        near, far = None, distance + frame.radius * 1.01
    elif eye is not None:
        eye_t = torch.tensor(list(eye), dtype=torch.float64)
        target_t = frame.centre if target is None else torch.tensor(list(target), dtype=torch.float64)
        distance = float((frame.centre - eye_t).norm())
        focal = _focal_length(distance, frame)
        cam = look_at_params(eye_t, target_t, up, focal, 2 * focal * math.tan(half_h), right_handed=right_handed)
        near, far = _depth_range(distance, focal, frame)
    else:
        cam, near, far = fit_camera(
            frame, width, height, fov_y_deg, azimuth_deg, elevation_deg, up, right_handed, fov_x_deg=fov_x_deg
        )
    focal = float(cam[9] if cam.shape[0] in (11, 13) else cam[6])
    if cloud.colours is not None:
        colours = cloud.colours.double()
    else:
        # No colours in the file: grey, darker with distance from the camera, so the
        # shape reads as 3D.
        distance_to_eye = (positions - cam[:3]).norm(dim=-1)
        t = (distance_to_eye - distance_to_eye.min()) / (distance_to_eye.max() - distance_to_eye.min()).clamp_min(1e-12)
        colours = torch.tensor(DEFAULT_COLOUR, dtype=torch.float64) * (1.0 - 0.6 * t)[:, None]
    near = min_depth if min_depth is not None else (near if near is not None else 0.0)
    if near and near <= focal:
        near = 0.0  # "focal length + 2e-6", the renderer's default
    far = max_depth if max_depth is not None else max(far, (near or focal) + 1e-3)
    renderer = Renderer(width, height, right_handed_system=right_handed, n_channels=3).to(device)
    f32 = dict(dtype=torch.float32, device=device)
    scene = dict(
        gamma=gamma,
        max_depth=float(far),
        min_depth=float(near),
        bg_col=torch.tensor(list(background), **f32),
        opacity=None if opacity is None else opacity.to(**f32),
    )
    with torch.no_grad():
        if cloud.sh_coefficients is not None and cloud.sh_degree >= 1:
            image = renderer.render(
                positions.to(**f32),
                cloud.sh_coefficients.to(**f32).contiguous(),
                radii.to(**f32),
                cam.to(**f32),
                sh_degree=cloud.sh_degree,
                **scene,
            ).image
        else:
            image = renderer(
                positions.to(**f32), colours.to(**f32).contiguous(), radii.to(**f32), cam.to(**f32), **scene
            )
    return image.cpu()


def _build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=command_prog("render", prog),
        description="Render a PLY file as spheres to an image: a point cloud (ascii or binary; x y z, optional "
        "red green blue, radius or scale, opacity or alpha) or a 3D Gaussian Splatting scene "
        "(f_dc_*, f_rest_* as view-dependent colour, opacity as a logit, scale_* as logs; "
        "rot_* ignored: spheres are isotropic). Default camera: the whole cloud in view from "
        "the +z side.",
    )
    parser.add_argument("--ply", required=True, help="input PLY file")
    parser.add_argument(
        "--out",
        required=True,
        help="image file to write, its format from the extension: .png, .jpg, ... (folders are created)",
    )
    parser.add_argument("--width", type=int, default=640, help="image width in pixels (default 640)")
    parser.add_argument("--height", type=int, default=480, help="image height in pixels (default 480)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    camera = parser.add_argument_group("camera (default: fit the cloud in view)")
    camera.add_argument(
        "--cam-params",
        type=_cam_params_arg,
        default=None,
        metavar="V1,V2,...",
        help="a Pulsar camera vector: 8, 10, 11 or 13 numbers (position, rotation, focal length, "
        "sensor width[, principal point])",
    )
    camera.add_argument(
        "--eye",
        type=lambda t: _vector(t, 3, "--eye"),
        default=None,
        metavar="X,Y,Z",
        help="camera position of a look-at camera",
    )
    camera.add_argument(
        "--target",
        type=lambda t: _vector(t, 3, "--target"),
        default=None,
        metavar="X,Y,Z",
        help="point the look-at camera looks at (default: the cloud's centre)",
    )
    camera.add_argument(
        "--up",
        type=lambda t: _vector(t, 3, "--up"),
        default=(0.0, 1.0, 0.0),
        metavar="X,Y,Z",
        help="world direction shown upwards (default 0,1,0)",
    )
    fov = camera.add_mutually_exclusive_group()
    fov.add_argument(
        "--fov-y",
        type=float,
        default=None,
        metavar="DEG",
        help=f"vertical field of view in degrees (default {DEFAULT_FOV_Y:g})",
    )
    fov.add_argument(
        "--fov-x",
        type=float,
        default=None,
        metavar="DEG",
        help="horizontal field of view in degrees, instead of --fov-y",
    )
    fov.add_argument(
        "--fov",
        type=float,
        default=None,
        metavar="DEG",
        dest="fov_deprecated",
        help="deprecated: the horizontal field of view, now --fov-x",
    )
    camera.add_argument(
        "--azimuth", type=float, default=0.0, help="fitted camera: degrees around the up axis (default 0)"
    )
    camera.add_argument(
        "--elevation",
        type=float,
        default=0.0,
        help="fitted camera: degrees above the level (default 0; 90: straight above)",
    )
    camera.add_argument(
        "--left-handed", action="store_true", help="Pulsar's default left-handed system instead of right-handed"
    )
    look = parser.add_argument_group("appearance")
    look.add_argument(
        "--radius",
        type=float,
        default=None,
        help="sphere radius in world units (default: the file's, else estimated from the spacing)",
    )
    look.add_argument("--radius-scale", type=float, default=1.0, help="multiply every radius (default 1)")
    look.add_argument("--gamma", type=float, default=1e-3, help="blending softness in [1e-5, 1] (default 1e-3)")
    look.add_argument(
        "--background",
        type=lambda t: _vector(t, 3, "--background"),
        default=(1.0, 1.0, 1.0),
        metavar="R,G,B",
        help="background colour in [0, 1] (default 1,1,1)",
    )
    look.add_argument("--min-depth", type=float, default=None, help="near depth (default: from the cloud)")
    look.add_argument("--max-depth", type=float, default=None, help="far depth (default: from the cloud)")
    return parser


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """``pulsar-py render --ply FILE --out FILE.png [options]``; returns the exit status.
    ``prog``: the program name for help and usage (default "pulsar-py render")."""
    args = _build_parser(prog).parse_args(argv)
    for name, value in (("--width", args.width), ("--height", args.height)):
        if value < 1:
            print(f"render: {name}: expected a positive integer, got {value}", file=sys.stderr)
            return 2
    if args.fov_deprecated is not None:
        print(
            "render: warning: --fov is deprecated: it is the horizontal field of view, now --fov-x "
            "(--fov-y gives the vertical one)",
            file=sys.stderr,
        )
        args.fov_x = args.fov_deprecated
    for name, value in (("--fov-y", args.fov_y), ("--fov-x", args.fov_x)):
        if value is not None and not 0 < value < 180:
            print(f"render: {name}: expected degrees in (0, 180), got {value}", file=sys.stderr)
            return 2
    if args.cam_params is not None and args.eye is not None:
        print("render: --cam-params and --eye: give one camera, not both", file=sys.stderr)
        return 2
    try:
        device = command_device(args.device)
    except ValueError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    if not os.path.splitext(args.out)[1]:
        print(
            f"render: --out: expected a file name whose extension names the format (.png, .jpg, ...), got {args.out!r}",
            file=sys.stderr,
        )
        return 2
    start = time.perf_counter()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", IgnoredElementsWarning)
            cloud = read_ply(args.ply)
        for warning in caught:  # one line each (a mesh's faces, ...)
            print(f"render: warning: {warning.message}", file=sys.stderr)
    except OSError as exc:
        print(f"render: --ply: cannot read {args.ply!r}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"render: --ply {args.ply!r}: {exc}", file=sys.stderr)
        return 1
    try:
        image = render_point_cloud(
            cloud,
            args.width,
            args.height,
            device,
            cam_params=args.cam_params,
            eye=args.eye,
            target=args.target,
            up=args.up,
            fov_y_deg=args.fov_y,
            fov_x_deg=args.fov_x,
            azimuth_deg=args.azimuth,
            elevation_deg=args.elevation,
            radius=args.radius,
            radius_scale=args.radius_scale,
            gamma=args.gamma,
            background=args.background,
            right_handed=not args.left_handed,
            min_depth=args.min_depth,
            max_depth=args.max_depth,
        )
    except ValueError as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 1
    try:
        write_image(args.out, image)
    except OSError as exc:
        print(f"render: --out: cannot write {args.out!r}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"render: --out: {exc}", file=sys.stderr)
        return 1
    print(
        f"wrote {args.out} ({args.width}x{args.height}, {len(cloud)} points, {device}) "
        f"in {time.perf_counter() - start:.2f} s"
    )
    return 0
