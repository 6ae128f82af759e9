"""pulsar_py: a differentiable sphere renderer for PyTorch with exact gradients.

``from pulsar_py import Renderer`` replaces PyTorch3D's
``pytorch3d.renderer.points.pulsar.Renderer``: same API, same images, exact gradients.
"""

from __future__ import annotations

# torch first: its import must not follow the native module's (which links the CUDA
# runtime statically); the other order crashed `import torch` on a CUDA machine.
import torch  # noqa: F401

from . import _native
from .cameras import Camera, NativeCamera, camera_from_params
from .debug import replay
from .outputs import RenderResult
from .renderer import Renderer
from .sh import rgb_to_sh_dc, sh_to_color

__version__ = _native.build_info()["version"]


def build_info() -> dict:
    """Version, compiled backends, compiler, CUDA version and architectures."""
    return dict(_native.build_info())


__all__ = ["Renderer", "Camera", "RenderResult", "NativeCamera", "camera_from_params", "sh_to_color",
           "rgb_to_sh_dc", "build_info", "replay", "__version__"]
