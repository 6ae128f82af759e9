"""The browser viewer: ``pulsar-py view`` and ``LiveViewer``.

A viser server (``pip install "pulsar_py[viewer]"``) serves a page whose camera drives
``pulsar_py.Renderer`` renders on the server; each frame goes back as the page's
background image. ``pulsar-py view PATH`` shows a PLY file or a scene the demo saved;
``LiveViewer`` shows the spheres of a running optimisation and plots its losses.
docs/viewer.md describes it. viser is imported when a viewer starts, so this package
imports without it.

Modules: ``deps`` (the optional dependency), ``scene`` (what is shown and how it is
loaded), ``camera`` (the browser's camera as a ``pulsar_py.Camera``), ``frame`` (one
frame: render, colour map, uint8 pixels on the host), ``tab`` (one browser tab:
controls and its render thread), ``server`` (the viser server), ``live`` (``LiveViewer``),
``command`` (``pulsar-py view``).
"""

from .live import LiveViewer

__all__ = ["LiveViewer"]
