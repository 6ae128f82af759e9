"""``LiveViewer``: watch an optimisation's spheres and losses in the browser while it runs.

::

    from pulsar_py.tools.viewer import LiveViewer

    with LiveViewer(port=8080) as viewer:            # prints the page's address
        for step in range(steps):
            ...                                     # render, loss.backward(), optimiser.step()
            viewer.update(positions, colours, radii, opacity, losses={"loss": loss})

Each ``update`` copies the spheres (detached, on their device: one small device copy,
no synchronisation) and appends the losses to the page's plot; the tabs render the copy
from their own cameras in their own threads, so the loop does not wait for frames.
While the page's pause button is pressed, ``update`` waits (the view stays live: the
camera can move around the paused state) until it is pressed again or the viewer closes.
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from .scene import SceneSource, scene_from_tensors
from .server import DEFAULT_HOST, DEFAULT_PORT, SceneViewer, wait_for_interrupt
from .tab import ViewOptions

#: Most points per loss curve sent to the page; longer runs are thinned evenly.
MAX_PLOT_POINTS = 2000
#: Seconds between pushes of the loss plot to the page.
PLOT_INTERVAL = 0.25
#: Colours of the loss curves, in order.
_CURVE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _as_float(name: str, value: Union[float, torch.Tensor]) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"losses[{name!r}]: expected a number or a one-element tensor, got shape {tuple(value.shape)}"
            )
        return float(value.detach())
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"losses[{name!r}]: expected a number or a one-element tensor, got {type(value).__name__}"
        ) from None


class LiveViewer:
    """A browser view of a running optimisation (see the module docstring).

    Args:
        port: port to serve on (default 8080; 0: any free port).
        host: address to listen on (default 127.0.0.1: this machine only; docs/viewer.md,
            "Security", says what another address means).
        gamma: the view's first blending softness, in [1e-5, 1].
        max_depth: the view's first far depth (world units); None: from the first
            spheres' extent.
        background: RGB in [0, 1] behind the spheres.
        up: the world direction shown upwards ("+y", "-z", ...).
        right_handed: False for spheres in Pulsar's default left-handed convention
            (``Renderer(right_handed_system=False)`` with camera vectors): they are shown
            with z negated, i.e. as such a camera sees them, not mirrored.
        title: the page's panel label.
        announce: print the page's address on stdout.

    Raises OSError where the port is in use, MissingDependency (an ImportError) where
    viser is missing (``pip install "pulsar_py[viewer]"``).
    """

    def __init__(
        self,
        port: int = DEFAULT_PORT,
        host: str = DEFAULT_HOST,
        *,
        gamma: float = 1e-3,
        max_depth: Optional[float] = None,
        background: Sequence[float] = (1.0, 1.0, 1.0),
        up: Union[str, Sequence[float]] = "+y",
        right_handed: bool = True,
        title: str = "pulsar_py live",
        announce: bool = True,
    ) -> None:
        self.background = background
        self._right_handed = bool(right_handed)
        self._source = SceneSource()
        self._viewer = SceneViewer(
            self._source, host, port, ViewOptions(gamma=gamma, max_depth=max_depth, up=up), title=title
        )
        self._resume = threading.Event()
        self._resume.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._steps: List[float] = []
        self._losses: Dict[str, List[float]] = {}
        self._plot_version = 0
        gui = self._viewer.server.gui
        self._status = gui.add_markdown("waiting for the first update", order=1.0)
        self._pause_button = gui.add_button(
            "Pause", icon=None, order=2.0, hint="pause the optimisation at its next update; press again to resume"
        )
        self._pause_button.on_click(lambda _event: self.resume() if self.paused else self.pause())
        self._plot = None
        self._plot_keys: tuple = ()
        self._plot_log = False
        self._plot_thread = threading.Thread(target=self._plot_loop, name="pulsar_py viewer plot", daemon=True)
        self._plot_thread.start()
        if announce:
            print(f"pulsar_py viewer at {self.url}", flush=True)
        if not self._viewer.loopback_only:
            print(
                f"pulsar_py viewer: listening on {host}: anyone who can reach this address can open the page "
                f"and pause the run, without a password (docs/viewer.md, 'Security')",
                file=sys.stderr,
                flush=True,
            )

    # -----------------------------------------------------------------------------------
    # What a training loop calls

    def update(
        self,
        positions: torch.Tensor,
        colours: torch.Tensor,
        radii: torch.Tensor,
        opacity: Optional[torch.Tensor] = None,
        losses: Optional[Mapping[str, Union[float, torch.Tensor]]] = None,
        step: Optional[int] = None,
    ) -> None:
        """Show these spheres from now on and add ``losses`` to the plot.

        Args:
            positions: [N, 3] sphere centres (world units).
            colours: [N, 3] RGB in [0, 1], or [N, (d + 1)^2, 3] spherical-harmonics
                coefficients of degree d in 1..3.
            radii: [N] (world units).
            opacity: [N] in [0, 1], or None (opaque).
            losses: name -> value (a number or a one-element tensor; reading a CUDA
                tensor synchronises) plotted against ``step``.
            step: the x value of the losses (default: one more than the last).

        Returns at once, or, while the page's pause button is pressed, when it is
        pressed again or the viewer closes. The spheres are copied: the caller may change
        its tensors right after.
        """
        scene = scene_from_tensors(
            positions,
            colours,
            radii,
            opacity,
            right_handed=self._right_handed,
            background=self._background,
            name="live",
        )
        values = {str(k): _as_float(str(k), v) for k, v in (losses or {}).items()}
        with self._lock:
            x = float(step) if step is not None else (self._steps[-1] + 1 if self._steps else 0.0)
            for key in values:
                if key not in self._losses:
                    self._losses[key] = [math.nan] * len(self._steps)
            self._steps.append(x)
            for key, series in self._losses.items():
                series.append(values.get(key, math.nan))
            self._plot_version += 1
        if not self._closed.is_set():
            self._source.set(scene)
            shown = ", ".join(f"{k} {v:.4g}" for k, v in values.items())
            self._status.content = f"step {x:g}: {len(scene)} spheres" + (f"; {shown}" if shown else "")
        while not self._resume.wait(0.1):
            if self._closed.is_set():
                break

    # -----------------------------------------------------------------------------------
    # Pause

    @property
    def paused(self) -> bool:
        """True while the pause button is pressed (``update`` waits)."""
        return not self._resume.is_set()

    def pause(self) -> None:
        """Make the next ``update`` wait until ``resume`` (what the page's button does)."""
        self._resume.clear()
        self._pause_button.label = "Resume"

    def resume(self) -> None:
        """Let a waiting ``update`` return."""
        self._resume.set()
        self._pause_button.label = "Pause"

    # -----------------------------------------------------------------------------------
    # State

    @property
    def background(self) -> Tuple[float, float, float]:
        """RGB in [0, 1] behind the spheres, from the next ``update`` on."""
        return self._background

    @background.setter
    def background(self, rgb: Sequence[float]) -> None:
        values = tuple(float(v) for v in rgb)
        if len(values) != 3 or not all(math.isfinite(v) for v in values):
            raise ValueError(f"background: expected 3 finite numbers (RGB), got {list(rgb)!r}")
        self._background = values

    @property
    def url(self) -> str:
        """The page's address."""
        return self._viewer.url

    @property
    def port(self) -> int:
        return self._viewer.port

    @property
    def viewer(self) -> SceneViewer:
        """The underlying server (its tabs: ``viewer.tabs()``)."""
        return self._viewer

    def losses(self) -> Dict[str, List[float]]:
        """Every loss so far by name (NaN where a step did not give that one), and the
        steps under the key "step"."""
        with self._lock:
            result = {key: list(values) for key, values in self._losses.items()}
            result["step"] = list(self._steps)
        return result

    # -----------------------------------------------------------------------------------
    # The plot

    def _plot_data(self) -> tuple:
        with self._lock:
            steps = np.asarray(self._steps, dtype=np.float64)
            series = {key: np.asarray(values, dtype=np.float64) for key, values in self._losses.items()}
        if len(steps) > MAX_PLOT_POINTS:
            keep = np.unique(
                np.concatenate([np.linspace(0, len(steps) - 1, MAX_PLOT_POINTS).round().astype(int), [len(steps) - 1]])
            )
            steps = steps[keep]
            series = {key: values[keep] for key, values in series.items()}
        return steps, series

    def _push_plot(self) -> None:
        from .deps import require_viser

        uplot = require_viser().uplot
        steps, series = self._plot_data()
        if not series or len(steps) == 0:
            return
        keys = tuple(series)
        data = (steps,) + tuple(series[key] for key in keys)
        values = np.concatenate([v[np.isfinite(v)] for v in series.values()] or [np.zeros(0)])
        log = bool(values.size) and bool((values > 0).all())
        if self._plot is not None and keys == self._plot_keys and log == self._plot_log:
            self._plot.data = data
            return
        if self._plot is not None:
            self._plot.remove()
        curves = tuple(
            uplot.Series(label=key, stroke=_CURVE_COLOURS[k % len(_CURVE_COLOURS)], width=2)
            for k, key in enumerate(keys)
        )
        scales = {"x": uplot.Scale(time=False, auto=True), "y": uplot.Scale(distr=3 if log else 1, auto=True)}
        self._plot = self._viewer.server.gui.add_uplot(
            data,
            (uplot.Series(label="step"),) + curves,
            title="losses" + (" (log scale)" if log else ""),
            scales=scales,
            aspect=1.6,
            order=3.0,
        )
        self._plot_keys, self._plot_log = keys, log

    def _plot_loop(self) -> None:
        pushed = 0
        while not self._closed.wait(PLOT_INTERVAL):
            version = self._plot_version
            if version != pushed:
                try:
                    self._push_plot()
                except Exception as exc:  # the plot is a view; the optimisation goes on
                    print(f"pulsar_py viewer: loss plot failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                # A failed push is not retried until the losses change again.
                pushed = version

    # -----------------------------------------------------------------------------------
    # Closing

    def close(self) -> None:
        """Stop the server (a waiting ``update`` returns); safe to call twice."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._plot_thread.join(5.0)
        self._viewer.stop()

    def wait(self) -> None:
        """Keep serving until Ctrl-C or ``close()`` (from another thread), e.g. to look
        at the result after the loop."""
        wait_for_interrupt(self._closed)

    def __enter__(self) -> "LiveViewer":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
