"""The browser's camera as a ``pulsar_py.Camera``, and the viewer's first camera.

viser reports a client's camera as (docs/viewer.md, "Camera conventions"):

* ``position``: the camera centre, world units;
* ``wxyz``: the unit quaternion (w, x, y, z) of the camera-to-world rotation
  ``R_wc`` with OpenCV's camera axes: +x right, +y down, +z forward;
* ``fov``: the vertical field of view in radians, from the canvas's top edge to its
  bottom edge;
* ``aspect``: the canvas's width / height.

``pulsar_py.Camera`` maps a world point as ``x_cam = R X + t`` in the same camera axes,
so ``R = R_wc^T`` and ``t = -R position``. The rendered image is stretched over the
whole canvas, whose edges lie half a pixel outside the outer pixel centres; so the
focal lengths that make the image line up with the browser's view are

    fy = (H / 2) / tan(fov / 2),     fx = (W / 2) / (aspect tan(fov / 2)),

with the principal point at the image centre ((W - 1) / 2, (H - 1) / 2). fx = fy when
W / H equals the canvas's aspect; a rendered size rounded to whole pixels keeps the
view exact instead of nearly so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence, Tuple, Union

import numpy as np
import torch

from ... import Camera
from ...cameras.look_at import side_of_view
from ...cameras.rotations import matrix_to_quaternion, quaternion_to_matrix
from .scene import SceneFrame

#: Largest side of a rendered frame, in pixels.
MAX_SIDE = 4096
#: The first camera's vertical field of view (degrees).
DEFAULT_FOV_Y_DEG = 50.0
#: How far above the level the first camera looks down on the scene (degrees).
DEFAULT_ELEVATION_DEG = 20.0

#: Up directions the viewer accepts by name.
UP_AXES = {
    "+x": (1.0, 0.0, 0.0),
    "-x": (-1.0, 0.0, 0.0),
    "+y": (0.0, 1.0, 0.0),
    "-y": (0.0, -1.0, 0.0),
    "+z": (0.0, 0.0, 1.0),
    "-z": (0.0, 0.0, -1.0),
}


@dataclass(frozen=True)
class ViewCamera:
    """One browser camera (viser's conventions, see the module docstring)."""

    position: Tuple[float, float, float]
    wxyz: Tuple[float, float, float, float]
    fov_y: float
    aspect: float

    @classmethod
    def from_handle(cls, handle: Any) -> "ViewCamera":
        """From a viser ``CameraHandle`` (``client.camera``)."""
        position = tuple(float(v) for v in handle.position)
        wxyz = tuple(float(v) for v in handle.wxyz)
        return cls(
            (position[0], position[1], position[2]),
            (wxyz[0], wxyz[1], wxyz[2], wxyz[3]),
            float(handle.fov),
            float(handle.aspect),
        )

    def rotation_world_to_camera(self) -> np.ndarray:
        """[3, 3] float64 ``R = R_wc^T``: rows are the camera's right, down and forward
        axes in world coordinates."""
        camera_to_world = quaternion_to_matrix(torch.tensor(self.wxyz, dtype=torch.float64))
        return camera_to_world.T.numpy()


def render_size(canvas_width: int, canvas_height: int, scale: float, max_side: int = MAX_SIDE) -> Tuple[int, int]:
    """(width, height) in pixels of a frame for a canvas of that many pixels at ``scale``
    (0.5: half as many pixels per side), each side at least 1 and at most ``max_side``."""
    if canvas_width < 1 or canvas_height < 1:
        raise ValueError(f"canvas size: expected positive sides, got {canvas_width}x{canvas_height}")
    if not scale > 0:
        raise ValueError(f"scale: expected > 0, got {scale}")
    shrink = min(1.0, max_side / (canvas_width * scale), max_side / (canvas_height * scale))
    factor = scale * shrink
    return max(1, round(canvas_width * factor)), max(1, round(canvas_height * factor))


def near_depth(view: ViewCamera, frame: SceneFrame, max_depth: float) -> float:
    """The near depth of a frame (world units): where the camera's distance to the
    scene's bounding sphere begins, at least 1e-4 of its radius, at most half of
    ``max_depth``. The blend normalises depths to [near, max_depth], so fitting near
    to the scene keeps ``gamma`` meaning the same at any distance."""
    distance = math.dist(view.position, frame.centre)
    near = max(distance - 1.01 * frame.radius, 1e-4 * frame.radius, 1e-9)
    return min(near, 0.5 * max_depth)


def to_camera(
    view: ViewCamera,
    width: int,
    height: int,
    near: float,
    *,
    dtype: torch.dtype = torch.float32,
    device: Union[str, torch.device] = "cpu",
) -> Camera:
    """The ``pulsar_py.Camera`` that renders ``view`` as a ``width`` x ``height`` image,
    lined up with the browser's canvas (see the module docstring). Its film plane sits
    at ``near / 2``, in front of the near depth ``near`` (world units) as the renderer
    requires."""
    if not (0 < view.fov_y < math.pi):
        raise ValueError(f"fov_y: expected radians in (0, pi), got {view.fov_y}")
    if not view.aspect > 0:
        raise ValueError(f"aspect: expected > 0, got {view.aspect}")
    rotation = view.rotation_world_to_camera()
    translation = -rotation @ np.asarray(view.position, dtype=np.float64)
    tan_half = math.tan(view.fov_y / 2)
    fy = (height / 2) / tan_half
    fx = (width / 2) / (view.aspect * tan_half)

    def tensor(values: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(values, dtype=dtype).to(device)

    return Camera(
        tensor(rotation),
        tensor(translation),
        fx,
        fy,
        (width - 1) / 2,
        (height - 1) / 2,
        (height, width),
        film_distance=near / 2,
    )


def up_vector(up: Union[str, Sequence[float]]) -> Tuple[float, float, float]:
    """A unit up direction from "+y" (etc.) or three numbers."""
    if isinstance(up, str):
        if up not in UP_AXES:
            raise ValueError(f"up: expected one of {', '.join(UP_AXES)} or three numbers, got {up!r}")
        return UP_AXES[up]
    values = np.asarray([float(v) for v in up], dtype=np.float64)
    if values.shape != (3,) or not np.isfinite(values).all() or np.linalg.norm(values) == 0:
        raise ValueError(f"up: expected three finite numbers, not all 0, got {list(up)!r}")
    values = values / np.linalg.norm(values)
    return float(values[0]), float(values[1]), float(values[2])


def fit_view(
    frame: SceneFrame,
    up: Union[str, Sequence[float]] = "+y",
    fov_y_deg: float = DEFAULT_FOV_Y_DEG,
    elevation_deg: float = DEFAULT_ELEVATION_DEG,
) -> Tuple[np.ndarray, np.ndarray]:
    """(eye, target) of a first camera that shows the whole bounding sphere ``frame`` in
    a vertical field of view of ``fov_y_deg``: from the +z side for +y up (for another up,
    the side perpendicular to it nearest +z, or -y: ``look_at.side_of_view``, as
    ``pulsar-py render`` fits its camera), ``elevation_deg`` above the level."""
    up_v = np.asarray(up_vector(up))
    level = side_of_view(torch.from_numpy(up_v)).numpy()
    elevation = math.radians(elevation_deg)
    direction = math.cos(elevation) * level + math.sin(elevation) * up_v
    distance = 1.1 * frame.radius / math.sin(math.radians(fov_y_deg) / 2)
    target = np.asarray(frame.centre, dtype=np.float64)
    return target + distance * direction, target


def default_max_depth(frame: SceneFrame, fov_y_deg: float = DEFAULT_FOV_Y_DEG) -> float:
    """The first max depth (world units): twice the first camera's distance to the far
    side of the scene, so that the scene stays whole while the camera backs away."""
    eye, target = fit_view(frame, fov_y_deg=fov_y_deg)
    return 2.0 * (float(np.linalg.norm(eye - target)) + 1.01 * frame.radius)


def camera_for_eye(
    eye: Sequence[float], target: Sequence[float], up: Union[str, Sequence[float]], fov_y: float, aspect: float
) -> ViewCamera:
    """The ``ViewCamera`` at ``eye`` looking at ``target`` with ``up`` shown upwards, as
    viser orients a camera from its look-at point and up direction."""
    eye_v = np.asarray(eye, dtype=np.float64)
    forward = np.asarray(target, dtype=np.float64) - eye_v
    forward /= np.linalg.norm(forward)
    up_v = np.asarray(up_vector(up))
    down = -(up_v - (up_v @ forward) * forward)
    if np.linalg.norm(down) < 1e-9:
        raise ValueError("up: must not be parallel to the viewing direction")
    down /= np.linalg.norm(down)
    right = np.cross(down, forward)
    camera_to_world = torch.from_numpy(np.stack([right, down, forward], axis=1))
    w, x, y, z = (float(v) for v in matrix_to_quaternion(camera_to_world))
    return ViewCamera((float(eye_v[0]), float(eye_v[1]), float(eye_v[2])), (w, x, y, z), float(fov_y), float(aspect))
