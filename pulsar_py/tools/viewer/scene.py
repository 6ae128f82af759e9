"""What the viewer shows: spheres on the render device, read from a file or handed over.

``load_scene(path)`` reads a PLY file (``pulsar_py.io.ply``: a point cloud with colours,
radii and opacities, or a 3D Gaussian Splatting scene with spherical-harmonics colour) or
the ``scene.ply`` that ``pulsar-py demo`` writes beside summary.json (a folder holding
one is accepted too). ``scene_from_tensors`` takes a program's own tensors
(``LiveViewer``). ``SceneSource`` holds the scene the render threads read; a live
viewer replaces it while they run.

The viewer's world is right-handed, like the browser's: a scene in Pulsar's default
left-handed convention (``Renderer(right_handed_system=False)`` with camera vectors)
is shown with its z negated, which shows what such a camera sees, not its mirror image
(docs/cameras.md, "Handedness").
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ...io.ply import read_ply
from ...sh import sh_dc_to_rgb, sh_degree_of
from ..render import DEFAULT_COLOUR, bounding_sphere, estimate_radius

PathLike = Union[str, "os.PathLike[str]"]

#: The file the demo writes its optimised spheres to, beside summary.json.
DEMO_SCENE_FILE = "scene.ply"

#: Background of a scene read from a file, RGB in [0, 1] (the file has none).
DEFAULT_BACKGROUND = (1.0, 1.0, 1.0)


@dataclass
class ViewerScene:
    """Spheres to show, float32 on the render device.

    Attributes:
        positions: [N, 3] sphere centres (world units, right-handed).
        colours: [N, 3] RGB in [0, 1] (a 3DGS scene: the colour of its degree-0 term).
        radii: [N] sphere radii (world units), > 0.
        opacity: [N] in [0, 1], or None (opaque).
        sh_coefficients: [N, (d + 1)^2, 3] spherical-harmonics coefficients of degree
            d >= 1 (3DGS convention, ``Renderer.render(..., sh_degree=)``), or None.
        background: [3] RGB of the background.
        name: what the scene is, for the page's title.
        ready: on CUDA, an event recorded after the tensors were written on the
            writer's stream (``scene_from_tensors``), or None; readers on other streams
            wait for it.
    """

    positions: torch.Tensor
    colours: torch.Tensor
    radii: torch.Tensor
    opacity: Optional[torch.Tensor] = None
    sh_coefficients: Optional[torch.Tensor] = None
    background: torch.Tensor = field(default_factory=lambda: torch.tensor(DEFAULT_BACKGROUND))
    name: str = "scene"
    ready: Optional["torch.cuda.Event"] = None
    _features: Dict[int, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    @property
    def device(self) -> torch.device:
        return self.positions.device

    @property
    def sh_degree(self) -> Optional[int]:
        """Degree (1..3) of ``sh_coefficients``, or None without them."""
        if self.sh_coefficients is None:
            return None
        return sh_degree_of(self.sh_coefficients.shape[1])

    def features(self, sh_degree: Optional[int]) -> Tuple[torch.Tensor, Optional[int]]:
        """(vert_col, sh_degree) for ``Renderer.render``: the RGB colours for None or 0,
        else the coefficients up to ``sh_degree`` (at most the scene's), made contiguous
        once and kept."""
        top = self.sh_degree
        if sh_degree is None or sh_degree <= 0 or top is None:
            return self.colours, None
        degree = min(int(sh_degree), top)
        if degree not in self._features:
            self._features[degree] = self.sh_coefficients[:, : (degree + 1) ** 2].contiguous()
        return self._features[degree], degree


@dataclass(frozen=True)
class SceneFrame:
    """A sphere holding every sphere of a scene: ``centre`` (3 floats) and ``radius``
    (world units). The viewer's first camera and depth range are fitted to it."""

    centre: Tuple[float, float, float]
    radius: float


def scene_frame(scene: ViewerScene) -> SceneFrame:
    """The bounding sphere of ``scene`` (one device synchronisation)."""
    frame = bounding_sphere(scene.positions.detach().cpu(), scene.radii.detach().cpu())
    centre = tuple(float(v) for v in frame.centre)
    return SceneFrame((centre[0], centre[1], centre[2]), float(frame.radius))


def _check_finite(name: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name}: expected finite values, got {int((~torch.isfinite(t)).sum())} that are not")


def _grey_shading(positions: torch.Tensor) -> torch.Tensor:
    """Colours of a cloud without any: grey, darker towards the outside, so its shape reads."""
    centre = (positions.amin(0) + positions.amax(0)) / 2
    distance = (positions - centre).norm(dim=-1)
    t = distance / distance.max().clamp_min(1e-12)
    return torch.tensor(DEFAULT_COLOUR, dtype=positions.dtype) * (1.0 - 0.5 * t)[:, None]


def resolve_scene_path(path: PathLike) -> str:
    """The PLY file that ``path`` names: the path itself, or the demo's scene.ply in the
    folder it names. ValueError for anything else (the message names ``PATH``)."""
    text = os.fspath(path)
    if os.path.isdir(text):
        candidate = os.path.join(text, DEMO_SCENE_FILE)
        if not os.path.isfile(candidate):
            raise ValueError(
                f"PATH: expected a .ply file or a folder holding {DEMO_SCENE_FILE} "
                f"(written by pulsar-py demo), got the folder {text!r} without it"
            )
        return candidate
    if not text.lower().endswith(".ply"):
        raise ValueError(f"PATH: expected a .ply file or a folder holding {DEMO_SCENE_FILE}, got {text!r}")
    if not os.path.isfile(text):
        raise ValueError(f"PATH: no such file: {text!r}")
    return text


def load_scene(path: PathLike, device: Union[str, torch.device] = "cpu") -> ViewerScene:
    """Read the scene at ``path`` (see the module docstring) onto ``device``.

    Radii missing from a point cloud are estimated from the point spacing and colours
    missing are grey, as ``pulsar-py render`` does. ValueError names what is wrong with
    the file; OSError where it cannot be read.
    """
    file = resolve_scene_path(path)
    cloud = read_ply(file)
    n = len(cloud)
    if n == 0:
        raise ValueError(f"PATH: {file!r} has no points")
    positions = cloud.positions.float()
    _check_finite("ply positions", positions)
    if cloud.radii is not None:
        radii = cloud.radii.float()
        _check_finite("ply radii", radii)  # PointCloud checked > 0
    else:
        radii = torch.full((n,), estimate_radius(positions), dtype=torch.float32)
    colours = cloud.colours.float() if cloud.colours is not None else _grey_shading(positions)
    opacity = cloud.opacity.float() if cloud.opacity is not None else None  # PointCloud checked [0, 1]
    sh = cloud.sh_coefficients.float() if cloud.sh_coefficients is not None and cloud.sh_degree >= 1 else None
    if sh is not None:
        _check_finite("ply SH coefficients", sh)
    scene = ViewerScene(positions, colours.contiguous(), radii, opacity, sh, name=os.path.basename(file))
    return move_scene(scene, device)


def move_scene(scene: ViewerScene, device: Union[str, torch.device]) -> ViewerScene:
    """A copy of ``scene`` with every tensor contiguous, float32, on ``device``."""

    def move(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        return None if t is None else t.detach().to(device=device, dtype=torch.float32).contiguous()

    return ViewerScene(
        move(scene.positions),
        move(scene.colours),
        move(scene.radii),
        move(scene.opacity),
        move(scene.sh_coefficients),
        move(scene.background),
        scene.name,
    )


def _shape_error(name: str, expected: str, t: object) -> ValueError:
    got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
    return ValueError(f"{name}: expected a tensor of shape {expected}, got {got}")


def scene_from_tensors(
    positions: torch.Tensor,
    colours: torch.Tensor,
    radii: torch.Tensor,
    opacity: Optional[torch.Tensor] = None,
    *,
    right_handed: bool = True,
    background: Sequence[float] = DEFAULT_BACKGROUND,
    name: str = "scene",
) -> ViewerScene:
    """A ``ViewerScene`` holding detached float32 copies of the tensors, on their device.

    Args:
        positions: [N, 3] sphere centres (world units).
        colours: [N, 3] RGB in [0, 1], or [N, (d + 1)^2, 3] spherical-harmonics
            coefficients of degree d in 1..3 (``Renderer.render(..., sh_degree=d)``).
        radii: [N] (world units).
        opacity: [N] in [0, 1], or None.
        right_handed: False for spheres in Pulsar's default left-handed convention:
            their z is negated for display (see the module docstring).
        background: RGB in [0, 1].

    Only shapes are checked here (no device synchronisation); the renderer checks the
    values of each frame.
    """
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or positions.shape[1] != 3:
        raise _shape_error("positions", "[N, 3]", positions)
    n = int(positions.shape[0])
    if not isinstance(radii, torch.Tensor) or tuple(radii.shape) != (n,):
        raise _shape_error("radii", f"[N] = [{n}]", radii)
    if opacity is not None and (not isinstance(opacity, torch.Tensor) or tuple(opacity.shape) != (n,)):
        raise _shape_error("opacity", f"[N] = [{n}] or None", opacity)
    sh: Optional[torch.Tensor] = None
    if (
        isinstance(colours, torch.Tensor)
        and colours.dim() == 3
        and colours.shape[0] == n
        and colours.shape[2] == 3
        and colours.shape[1] in (4, 9, 16)
    ):
        sh = colours
        dc = colours[:, 0].detach().float()
        colours = sh_dc_to_rgb(dc)  # the degree-0 term's colour
    elif not isinstance(colours, torch.Tensor) or tuple(colours.shape) != (n, 3):
        raise _shape_error("colours", f"[N, 3] = [{n}, 3] or SH coefficients [{n}, 4 | 9 | 16, 3]", colours)
    background_t = torch.tensor([float(v) for v in background], dtype=torch.float32)
    if background_t.shape != (3,):
        raise ValueError(f"background: expected 3 numbers (RGB), got {list(background)!r}")

    def copy(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        # A copy of its own (``.to`` alone returns the same tensor where nothing
        # changes), so the caller may update its tensors in place right after.
        return (
            None
            if t is None
            else t.detach().to(
                device=positions.device, dtype=torch.float32, memory_format=torch.contiguous_format, copy=True
            )
        )

    pos = copy(positions)
    if not right_handed:
        pos[:, 2].neg_()
    scene = ViewerScene(
        pos, copy(colours), copy(radii), copy(opacity), copy(sh), background_t.to(positions.device), name
    )
    if positions.is_cuda:
        # The copies are queued on the caller's current stream; a render thread reads
        # them on its own stream after this event (FrameRenderer.render).
        scene.ready = torch.cuda.Event()
        scene.ready.record(torch.cuda.current_stream(positions.device))
    return scene


class SceneSource:
    """The scene the render threads read, replaced whole by ``set`` (thread-safe).

    A reader takes ``get()`` once per frame and renders that object, so a scene replaced
    meanwhile is never seen half-written. Listeners added with ``subscribe`` are called
    after each ``set`` (on the caller's thread).
    """

    def __init__(self, scene: Optional[ViewerScene] = None) -> None:
        self._lock = threading.Lock()
        self._scene = scene
        self._version = 0 if scene is None else 1
        self._frame: Optional[SceneFrame] = None if scene is None else scene_frame(scene)
        self._listeners: List[Callable[[], None]] = []

    def get(self) -> Tuple[Optional[ViewerScene], int]:
        """(the current scene or None before the first, its version: 0, 1, 2, ...)."""
        with self._lock:
            return self._scene, self._version

    @property
    def frame(self) -> Optional[SceneFrame]:
        """The bounding sphere of the first scene set (None before it)."""
        return self._frame

    def set(self, scene: ViewerScene) -> None:
        """Show ``scene`` from now on; the first scene set fixes ``frame``."""
        first_frame = scene_frame(scene) if self._frame is None else None
        with self._lock:
            self._scene = scene
            self._version += 1
            if first_frame is not None:
                self._frame = first_frame
            listeners = list(self._listeners)
        for listener in listeners:
            listener()

    def subscribe(self, listener: Callable[[], None]) -> None:
        with self._lock:
            self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)
