"""pulsar_py: a differentiable sphere renderer for PyTorch with exact gradients.

``from pulsar_py import Renderer`` replaces PyTorch3D's
``pytorch3d.renderer.points.pulsar.Renderer``: same API, same images, exact gradients.
"""

from __future__ import annotations

import importlib
import importlib.util
import os

# torch first: its import must not follow the native module's (which links the CUDA
# runtime statically); the other order crashed `import torch` on a CUDA machine.
import torch  # noqa: F401


def _missing_native_message() -> str:
    """Why ``pulsar_py._native`` cannot be found, and what to do, in one line. The usual
    cause: Python started in the repository root, whose source folder ``pulsar_py/``
    (never built there) shadows the installed package."""
    folder = os.path.dirname(os.path.abspath(__file__))
    return (
        f"pulsar_py: the compiled module pulsar_py._native is missing from {folder} (a source tree, which "
        f"shadows an installed pulsar_py when Python starts in the folder above it): run from another "
        f"folder with pulsar_py installed (pip install .), or build it in place (pip install -e .)"
    )


if importlib.util.find_spec(f"{__name__}._native") is None:
    raise ImportError(_missing_native_message(), name=f"{__name__}._native")

from . import _native  # noqa: E402
from .cameras import Camera, NativeCamera, camera_from_params  # noqa: E402
from .debug import replay  # noqa: E402
from .outputs import RenderResult  # noqa: E402
from .renderer import Renderer  # noqa: E402
from .sh import rgb_to_sh_dc, sh_to_color  # noqa: E402

__version__ = _native.build_info()["version"]


def build_info() -> dict:
    """Version, compiled backends, compiler, CUDA version and architectures."""
    return dict(_native.build_info())


#: Subpackages that ``import pulsar_py`` leaves unloaded (``pulsar_py.gradcheck`` and the
#: others still work as attributes: ``__getattr__`` imports them at first use).
_LAZY_SUBMODULES = ("gradcheck", "distributed", "io", "tools")


def __getattr__(name: str):
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Renderer",
    "Camera",
    "RenderResult",
    "NativeCamera",
    "camera_from_params",
    "sh_to_color",
    "rgb_to_sh_dc",
    "build_info",
    "replay",
    "__version__",
]
