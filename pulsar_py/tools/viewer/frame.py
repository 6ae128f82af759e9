"""One frame of the viewer: render, turn the chosen output into colours, uint8 pixels on the host.

The colour mapping and the conversion to 8 bits run on the render device, so a GPU
frame crosses to the host as 3 bytes per pixel rather than 12 (float32) or more, and
the host does nothing but encode it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np
import torch

from ... import Renderer, RenderResult
from .camera import ViewCamera, near_depth, to_camera
from .scene import SceneFrame, ViewerScene

#: What a frame can show: ``Renderer.render``'s image, depth or coverage.
OUTPUTS = ("image", "depth", "coverage")


@dataclass
class FrameSettings:
    """The settings of one frame, as a tab's controls set them (not the renderer's own
    ``pulsar_py.render_settings.RenderSettings``).

    Attributes:
        gamma: blending softness in [1e-5, 1] (``Renderer.forward``).
        max_depth: far depth (world units); the near depth follows the camera
            (``camera.near_depth``).
        output: one of ``OUTPUTS``: "image" (the colours), "depth" (the expected
            depth, near white to far dark, scaled to the depths in view; nothing hit:
            black) or "coverage" (the share of each pixel that is not background, white
            = 1).
        sh_degree: spherical-harmonics degree used for colour (None or 0: the colours;
            at most the scene's degree).
    """

    gamma: float = 1e-3
    max_depth: float = 100.0
    output: str = "image"
    sh_degree: Optional[int] = None

    def check(self) -> None:
        """ValueError naming the first setting out of range."""
        if not 1e-5 <= self.gamma <= 1:
            raise ValueError(f"gamma: expected a value in [1e-5, 1], got {self.gamma}")
        if not self.max_depth > 0:
            raise ValueError(f"max_depth: expected > 0 (world units), got {self.max_depth}")
        if self.output not in OUTPUTS:
            raise ValueError(f"output: expected one of {', '.join(OUTPUTS)}, got {self.output!r}")


@dataclass
class Frame:
    """A rendered frame: ``pixels`` uint8 [H, W, 3] on the host (RGB) and the seconds it
    took, render and copy to the host included."""

    pixels: np.ndarray
    seconds: float

    @property
    def width(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def height(self) -> int:
        return int(self.pixels.shape[0])


def colour_output(result: RenderResult, output: str) -> torch.Tensor:
    """[H, W, 3] colours in [0, 1] of ``output`` (see ``FrameSettings``), on the render
    device, without a device synchronisation."""
    if output == "image":
        return result.image
    coverage = result.coverage
    if output == "coverage":
        grey = coverage
    elif output == "depth":
        depth = result.depth
        seen = coverage > 0.5
        near = torch.where(seen, depth, torch.full_like(depth, float("inf"))).amin()
        far = torch.where(seen, depth, torch.full_like(depth, float("-inf"))).amax()
        relative = (depth - near) / (far - near).clamp_min(1e-12)
        # Near is white, far a dark grey; where nothing is hit, black (coverage 0).
        grey = torch.nan_to_num((1.0 - 0.8 * relative.clamp(0, 1)) * coverage, nan=0.0, posinf=0.0, neginf=0.0)
    else:
        raise ValueError(f"output: expected one of {', '.join(OUTPUTS)}, got {output!r}")
    return grey[..., None].expand(*grey.shape, 3)


def to_uint8(colours: torch.Tensor) -> torch.Tensor:
    """Colours in [0, 1] (clamped) -> uint8, rounded, on their device."""
    return colours.clamp(0, 1).mul(255).add_(0.5).to(torch.uint8)


class FrameRenderer:
    """Renders frames of a scene for one thread (a ``Renderer`` serves one call at a
    time). Keeps a renderer per recent image size and device, as a renderer is built for
    one size."""

    def __init__(self, cache_size: int = 3) -> None:
        self._renderers: "OrderedDict[Tuple[int, int, str], Renderer]" = OrderedDict()
        self._cache_size = cache_size

    def _renderer(self, width: int, height: int, device: torch.device) -> Renderer:
        key = (width, height, str(device))
        renderer = self._renderers.pop(key, None)
        if renderer is None:
            renderer = Renderer(width, height, n_channels=3).to(device)
        self._renderers[key] = renderer
        while len(self._renderers) > self._cache_size:
            self._renderers.popitem(last=False)
        return renderer

    @property
    def cached(self) -> int:
        """Renderers kept (one per recent image size and device)."""
        return len(self._renderers)

    def release(self) -> None:
        """Drop every renderer (their native buffers are freed with them)."""
        self._renderers.clear()

    @torch.no_grad()
    def render(
        self, scene: ViewerScene, frame: SceneFrame, view: ViewCamera, width: int, height: int, settings: FrameSettings
    ) -> Frame:
        """Render ``scene`` seen by ``view`` as a ``width`` x ``height`` frame."""
        settings.check()
        start = time.perf_counter()
        device = scene.device
        if scene.ready is not None:
            # Written on another thread's stream: wait for it there, and keep the
            # allocator from reusing the memory while this stream reads it.
            stream = torch.cuda.current_stream(device)
            stream.wait_event(scene.ready)
            for t in (
                scene.positions,
                scene.colours,
                scene.radii,
                scene.opacity,
                scene.sh_coefficients,
                scene.background,
            ):
                if t is not None:
                    t.record_stream(stream)
        renderer = self._renderer(width, height, device)
        near = near_depth(view, frame, settings.max_depth)
        camera = to_camera(view, width, height, near, device=device)
        features, sh_degree = scene.features(settings.sh_degree)
        result = renderer.render(
            scene.positions,
            features,
            scene.radii,
            camera,
            gamma=settings.gamma,
            max_depth=settings.max_depth,
            min_depth=near,
            bg_col=scene.background,
            opacity=scene.opacity,
            sh_degree=sh_degree,
        )
        pixels = to_uint8(colour_output(result, settings.output)).contiguous().cpu().numpy()
        return Frame(pixels, time.perf_counter() - start)
