"""The viewer's web server: viser, listening on one address, serving one scene.

What the page can reach: viser serves its own client (HTML, JavaScript) from the viser
package and talks to the page over one websocket; the page gets the frames of the scene
the viewer was started with, and sends its camera and the values of the viewer's
controls. No message from the page names a file or a path. viser's share-link feature
(which would tunnel the page to a public address) is turned off. The server listens on
127.0.0.1 unless told otherwise (docs/viewer.md, "Security").
"""

from __future__ import annotations

import ipaddress
import math
import socket
import threading
import time
from typing import Any, Dict, Optional

from .camera import DEFAULT_FOV_Y_DEG, fit_view, up_vector
from .deps import quiet_stdout, require_viser
from .scene import SceneSource
from .tab import TabView, ViewOptions

#: The address the viewer listens on unless told otherwise: this machine only.
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def check_address(host: str, port: int) -> None:
    """OSError (naming ``host`` and ``port``) unless a server can listen there now.

    viser itself moves on to the next port when one is taken, and waits forever when an
    address cannot be bound at all; the viewer wants the port it was given, or an error.
    """
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port: expected an integer in 0..65535, got {port!r}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"host {host!r}: not an address of this machine ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As the server's own socket (asyncio sets SO_REUSEADDR on POSIX): a port in
        # TIME_WAIT is free, a port with a listener is not.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            what = "is in use" if exc.errno in (98, 48, 10048) else f"cannot be listened on ({exc.strerror})"
            raise OSError(f"port {port} on {host} {what}") from None


def is_loopback(host: str) -> bool:
    """True when ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    try:
        return all(
            ipaddress.ip_address(info[4][0]).is_loopback
            for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        )
    except (socket.gaierror, ValueError):
        return False


def wait_for_interrupt(stop: Optional[threading.Event] = None) -> None:
    """Block until Ctrl-C (KeyboardInterrupt, caught) or until ``stop`` is set."""
    stop = stop or threading.Event()
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass


def _refuse_share_url(*_args: Any, **_kwargs: Any) -> None:
    """Stands in for viser's share-link request: the viewer is never tunnelled to a
    public address, whatever the page asks."""
    return None


class SceneViewer:
    """A running viewer: a viser server whose tabs each render ``source`` from their
    own camera (``TabView``).

    Args:
        source: the scene (set now, or later by a live viewer).
        host: the address to listen on (default 127.0.0.1: this machine only).
        port: the port (0: any free one).
        options: settings shared by the tabs.
        title: the panel's label.

    Raises OSError where the address cannot be listened on (e.g. the port is in use),
    MissingDependency (an ImportError) where viser is missing.
    """

    def __init__(
        self,
        source: SceneSource,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        options: Optional[ViewOptions] = None,
        title: str = "pulsar_py",
    ) -> None:
        self.options = options or ViewOptions()
        self.options.check()
        viser = require_viser()
        check_address(host, port)
        self.source = source
        self._tabs: Dict[int, TabView] = {}
        self._lock = threading.Lock()
        self._fitted = False
        with quiet_stdout():
            server = viser.ViserServer(host=host, port=port, label=title, verbose=False)
        if port != 0 and server.get_port() != port:  # taken between the check and the bind
            self._stop_server(server)
            raise OSError(f"port {port} on {host} is in use")
        self.server = server
        self.host = host
        # Checked by viser when a share link is requested: the page's share button is
        # hidden, and a request sent anyway does nothing.
        server.request_share_url = _refuse_share_url
        server.gui.configure_theme(show_share_button=False, control_width="medium")
        server.scene.set_up_direction(up_vector(self.options.up))
        server.initial_camera.fov = math.radians(DEFAULT_FOV_Y_DEG)
        server.on_client_connect(self._connect)
        server.on_client_disconnect(self._disconnect)
        if source.frame is not None:
            self._fit()
        else:
            source.subscribe(self._fit)

    @property
    def port(self) -> int:
        return int(self.server.get_port())

    @property
    def url(self) -> str:
        """The page's address (for a server on every address, 0.0.0.0 or ::, by this
        machine's name)."""
        host = socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}"

    @property
    def loopback_only(self) -> bool:
        """True when only this machine can reach the page."""
        return is_loopback(self.host)

    def tabs(self) -> Dict[int, TabView]:
        """The open tabs, by viser client id."""
        with self._lock:
            return dict(self._tabs)

    def _fit(self) -> None:
        """Point the first camera (and that of tabs opened before the scene came) at
        the scene."""
        if self.source.frame is None or self._fitted:
            return
        self._fitted = True
        self.source.unsubscribe(self._fit)
        self._point_at_scene(self.server.initial_camera)
        for tab in self.tabs().values():
            self._point_at_scene(tab.client.camera)

    def _point_at_scene(self, camera: Any) -> None:
        """Set a viser camera (a tab's, or the initial one) to the fitted view."""
        eye, target = fit_view(self.source.frame, self.options.up)
        up = up_vector(self.options.up)
        if hasattr(type(camera), "up_direction"):  # a tab's CameraHandle; the initial one has "up"
            camera.up_direction = up
        else:
            camera.up = up
        camera.position = tuple(eye)
        camera.look_at = tuple(target)

    def _connect(self, client: Any) -> None:
        if self.source.frame is not None:
            # Each tab starts at the fitted view: viser's initial camera says the same,
            # but a tab whose first report came before it applied would keep its pose.
            self._point_at_scene(client.camera)
        tab = TabView(client, self.source, self.options)
        with self._lock:
            stale = self._tabs.pop(client.client_id, None)
            self._tabs[client.client_id] = tab
        if stale is not None:
            stale.close()

    def _disconnect(self, client: Any) -> None:
        """A closed tab: its render thread ends and its renderers are freed; the other
        tabs go on."""
        with self._lock:
            tab = self._tabs.pop(client.client_id, None)
        if tab is not None:
            tab.close()

    @staticmethod
    def _stop_server(server: Any, wait: float = 1.0) -> None:
        """Stop viser's server, waiting at most ``wait`` seconds.

        The listening socket closes at once; viser then waits for every open connection
        to end, and a browser's idle pre-opened connection ends only when its handshake
        times out (seconds later). That wind-down goes on in a daemon thread, so Ctrl-C
        and ``close()`` return promptly.
        """
        stopper = threading.Thread(target=server.stop, name="pulsar_py viewer stop", daemon=True)
        with quiet_stdout():
            stopper.start()
            stopper.join(wait)

    def stop(self, wait: float = 1.0) -> None:
        """Stop the server and every tab's render thread, waiting about ``wait`` seconds
        at most (a frame in progress then ends in its daemon thread, its tab gone). The
        port no longer accepts connections on return."""
        self.source.unsubscribe(self._fit)
        with self._lock:
            tabs = list(self._tabs.values())
            self._tabs.clear()
        for tab in tabs:
            tab.request_stop()
        deadline = time.monotonic() + wait
        self._stop_server(self.server, wait)
        for tab in tabs:
            tab.close(max(0.0, deadline - time.monotonic()))
