"""One browser tab of the viewer: its controls and the thread that renders its frames.

Each tab (a viser client) has a camera of its own, controls of its own and a render
thread of its own, which sends each frame as the tab's background image (JPEG). A
change of the camera, of a control or of the scene wakes the thread. While changes keep
coming (the camera moves, a slider is dragged, an optimisation updates the spheres),
frames render at a reduced resolution (``ViewOptions.preview_factor`` per side); once
nothing has changed for ``ViewOptions.settle_seconds`` the thread renders the view
once more at full resolution (for changes of the scene, after
``ViewOptions.scene_settle_seconds``, as an optimisation's steps come at intervals). A
slow backend (the CPU) thus keeps up with the mouse, and the still view is sharp.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from .camera import ViewCamera, default_max_depth, render_size, up_vector
from .frame import OUTPUTS, FrameRenderer, FrameSettings
from .scene import SceneFrame, SceneSource, ViewerScene


@dataclass
class ViewOptions:
    """Settings of a viewer shared by its tabs.

    Attributes:
        gamma: first blending softness, in [1e-5, 1].
        max_depth: first far depth (world units); None: twice the first camera's
            distance to the far side of the scene.
        resolution_scale: first frame pixels per canvas pixel (per side), 0.1 to 2.
        preview_factor: resolution of frames while the view changes, relative to the
            full one (per side).
        settle_seconds: how long the camera and the controls must stay unchanged before
            the full-resolution frame is rendered.
        scene_settle_seconds: the same for changes of the scene (a live viewer's updates).
        max_fps: most frames a tab is sent per second.
        jpeg_quality: quality (1..100) of the JPEG frames sent to the page.
        up: the world direction shown upwards ("+y", "-z", ... or three numbers).
    """

    gamma: float = 1e-3
    max_depth: Optional[float] = None
    resolution_scale: float = 1.0
    preview_factor: float = 1 / 3
    settle_seconds: float = 0.25
    scene_settle_seconds: float = 1.0
    max_fps: float = 30.0
    jpeg_quality: int = 80
    up: Union[str, Sequence[float]] = "+y"

    def check(self) -> None:
        """ValueError naming the first option out of range, or an ``up`` that is neither an
        axis name nor three finite numbers, not all 0 (``camera.up_vector``)."""
        if not 1e-5 <= self.gamma <= 1:
            raise ValueError(f"gamma: expected a value in [1e-5, 1], got {self.gamma}")
        if self.max_depth is not None and not self.max_depth > 0:
            raise ValueError(f"max_depth: expected > 0 (world units) or None, got {self.max_depth}")
        if not 0.1 <= self.resolution_scale <= 2:
            raise ValueError(f"resolution_scale: expected a value in [0.1, 2], got {self.resolution_scale}")
        if not 0 < self.preview_factor <= 1:
            raise ValueError(f"preview_factor: expected a value in (0, 1], got {self.preview_factor}")
        for name in ("settle_seconds", "scene_settle_seconds"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: expected >= 0, got {getattr(self, name)}")
        if not self.max_fps > 0:
            raise ValueError(f"max_fps: expected > 0, got {self.max_fps}")
        if not (isinstance(self.jpeg_quality, int) and 1 <= self.jpeg_quality <= 100):
            raise ValueError(f"jpeg_quality: expected an integer in 1..100, got {self.jpeg_quality!r}")
        up_vector(self.up)

    def first_max_depth(self, frame: SceneFrame) -> float:
        return self.max_depth if self.max_depth is not None else _round_to_digits(default_max_depth(frame), 2)


def _round_to_digits(value: float, digits: int) -> float:
    """``value`` > 0 rounded to ``digits`` significant digits."""
    return float(f"{value:.{digits}g}")


def _nice_ceil(value: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten that is >= ``value`` > 0."""
    power = 10.0 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value * (1 - 1e-12))


@dataclass(frozen=True)
class FrameStats:
    """The last frame a tab was sent: its size, whether it was a reduced-resolution
    frame of a changing view, the seconds of render (copy to host included) and of
    JPEG encoding, and the scene version it showed."""

    width: int
    height: int
    preview: bool
    render_seconds: float
    encode_seconds: float
    scene_version: int


class TabView:
    """A tab's controls and render thread (see the module docstring).

    Args:
        client: the viser ``ClientHandle``.
        source: the scene shown.
        options: the viewer's options.
    """

    #: GUI order of the tab's controls (the viewer's shared elements come first).
    GUI_ORDER = 100.0

    def __init__(self, client: Any, source: SceneSource, options: ViewOptions) -> None:
        self.client = client
        self.client_id: int = client.client_id
        self._source = source
        self._options = options
        self._frames = FrameRenderer()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._dirty = True
        self._refined = False
        self._last_change = time.monotonic()  # the first frame is a quick one
        self._last_scene_change = 0.0
        self._last_frame_time = 0.0
        self._controls: Optional[dict] = None
        self._status: Any = None
        self._error: Optional[str] = None
        #: Frames sent to this tab so far.
        self.frames_sent = 0
        #: The last frame sent (None before the first).
        self.last_frame: Optional[FrameStats] = None
        client.camera.on_update(lambda _camera: self.changed())
        source.subscribe(self.scene_changed)
        self._thread = threading.Thread(target=self._run, name=f"pulsar_py viewer tab {self.client_id}", daemon=True)
        self._thread.start()

    # -----------------------------------------------------------------------------------
    # Lifecycle

    @property
    def closed(self) -> bool:
        """True once the render thread has ended (``close``)."""
        return self._stop.is_set() and not self._thread.is_alive()

    @property
    def renderers_held(self) -> int:
        """Renderers (with their native buffers) the tab holds; 0 once closed."""
        return self._frames.cached

    def changed(self) -> None:
        """Something the frame depends on changed: render again (at reduced resolution
        until changes stop)."""
        self._last_change = time.monotonic()
        self._dirty = True
        self._wake.set()

    def scene_changed(self) -> None:
        """The scene changed (see ``changed``)."""
        self._last_scene_change = time.monotonic()
        self._dirty = True
        self._wake.set()

    def request_stop(self) -> None:
        """Ask the render thread to end after its current frame (returns at once)."""
        self._source.unsubscribe(self.scene_changed)
        self._stop.set()
        self._wake.set()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the render thread and free the tab's renderers (waiting at most
        ``timeout`` seconds for a frame in progress); safe to call twice."""
        self.request_stop()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -----------------------------------------------------------------------------------
    # Controls

    def _build_controls(self, scene: ViewerScene, frame: SceneFrame) -> None:
        gui = self.client.gui
        options = self._options
        order = self.GUI_ORDER
        with gui.add_folder("View", order=order):
            output = gui.add_dropdown(
                "output",
                OUTPUTS,
                initial_value="image",
                hint="image: colours; depth: near white, far dark; coverage: white where spheres cover the pixel",
            )
            gamma = gui.add_slider(
                "log10 gamma",
                min=-5.0,
                max=0.0,
                step=0.1,
                initial_value=round(math.log10(options.gamma), 1),
                hint="blending softness: small is hard and opaque, 0 (gamma 1) is soft",
            )
            first_depth = options.first_max_depth(frame)
            high = _nice_ceil(5.0 * first_depth)
            max_depth = gui.add_slider(
                "max depth",
                min=high / 1000,
                max=high,
                step=high / 1000,
                initial_value=first_depth,
                hint="far depth (world units); farther spheres are not drawn",
            )
            sh_degree = None
            if scene.sh_degree is not None:
                sh_degree = gui.add_slider(
                    "SH degree",
                    min=0,
                    max=scene.sh_degree,
                    step=1,
                    initial_value=scene.sh_degree,
                    hint="spherical-harmonics degree of the view-dependent colour",
                )
            scale = gui.add_slider(
                "resolution scale",
                min=0.1,
                max=2.0,
                step=0.05,
                initial_value=options.resolution_scale,
                hint="frame pixels per screen pixel (per side); lower renders faster",
            )
            self._status = gui.add_markdown("waiting for the first frame")
        self._controls = dict(output=output, gamma=gamma, max_depth=max_depth, sh_degree=sh_degree, scale=scale)
        for handle in self._controls.values():
            if handle is not None:
                handle.on_update(lambda _event: self.changed())

    def settings(self) -> FrameSettings:
        """The render settings the tab's controls show now."""
        assert self._controls is not None
        c = self._controls
        return FrameSettings(
            gamma=float(10.0 ** float(c["gamma"].value)),
            max_depth=float(c["max_depth"].value),
            output=str(c["output"].value),
            sh_degree=None if c["sh_degree"] is None else int(c["sh_degree"].value),
        )

    # -----------------------------------------------------------------------------------
    # Render thread

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._wake.wait(self._wait_seconds())
                self._wake.clear()
                if self._stop.is_set():
                    break
                try:
                    self._step()
                except Exception as exc:  # shown on the page; the tab stays usable
                    self._show_error(exc)
        finally:
            self._frames.release()

    def _moving_for(self) -> float:
        """Seconds until the view counts as still (<= 0: it is still)."""
        now = time.monotonic()
        return max(
            self._options.settle_seconds - (now - self._last_change),
            self._options.scene_settle_seconds - (now - self._last_scene_change),
        )

    def _wait_seconds(self) -> Optional[float]:
        if self._refined and not self._dirty:
            return None
        return max(self._moving_for(), 0.005)

    def _step(self) -> None:
        scene, version = self._source.get()
        frame = self._source.frame
        if scene is None or frame is None:
            return
        if self._controls is None:
            self._build_controls(scene, frame)
        moving = self._moving_for() > 0
        if not self._dirty and (moving or self._refined):
            return
        pause = 1.0 / self._options.max_fps - (time.monotonic() - self._last_frame_time)
        if pause > 0 and self._stop.wait(pause):
            return
        self._dirty = False
        camera = self.client.camera
        if camera.image_width < 1 or camera.image_height < 1:
            return
        view = ViewCamera.from_handle(camera)
        canvas = (camera.image_width, camera.image_height)
        settings = self.settings()
        scale = float(self._controls["scale"].value) * (self._options.preview_factor if moving else 1.0)
        width, height = render_size(camera.image_width, camera.image_height, scale)
        rendered = self._frames.render(scene, frame, view, width, height, settings)
        if self._stop.is_set():  # the tab closed meanwhile
            return
        start = time.perf_counter()
        self.client.scene.set_background_image(rendered.pixels, format="jpeg", jpeg_quality=self._options.jpeg_quality)
        encode = time.perf_counter() - start
        self._last_frame_time = time.monotonic()
        self._refined = not moving
        if (ViewCamera.from_handle(camera), camera.image_width, camera.image_height) != (view,) + canvas:
            self.changed()  # the camera moved during the frame: render it again
        self.frames_sent += 1
        self.last_frame = FrameStats(width, height, moving, rendered.seconds, encode, version)
        self._error = None
        self._status.content = (
            f"{width}x{height}{' (moving: reduced)' if moving else ''}, "
            f"render {1e3 * rendered.seconds:.1f} ms, JPEG {1e3 * encode:.1f} ms; "
            f"gamma {settings.gamma:.2g}"
        )

    def _show_error(self, exc: Exception) -> None:
        message = f"{type(exc).__name__}: {exc}"
        self._refined = True  # no retry until something changes
        if message != self._error:
            self._error = message
            print(f"pulsar_py viewer: frame failed: {message}", file=sys.stderr)
        if self._status is not None:
            self._status.content = f"frame failed: {message}"
