"""Helpers of the viewer's tests: scenes, ports, addresses, waiting, a headless browser;
and the writer of 3D Gaussian Splatting PLY files that the PLY tests use too."""

from __future__ import annotations

import io
import ipaddress
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Callable, List, Optional

import numpy as np
import plyfile

from pulsar_py.sh import SH_C0

#: Chromium's switches for a headless run on a machine without a display, GPU or network.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-background-timer-throttling",
    "--disable-renderer-backgrounding",
    "--disable-backgrounding-occluded-windows",
    "--disable-dev-shm-usage",
)


def write_gaussians(path, positions, f_dc, log_scales, opacity_logit, f_rest=None, extra=()):
    """A PLY file in the layout 3D Gaussian Splatting writes (plyfile, binary).

    f_rest: [N, K, 3] coefficients of degree >= 1 (K = 3, 8 or 15), stored channel by
    channel as 3DGS does: f_rest_{c K + k} = f_rest[:, k, c].
    """
    n = positions.shape[0]
    columns = [("x", positions[:, 0]), ("y", positions[:, 1]), ("z", positions[:, 2])]
    columns += [(f"n{a}", np.zeros(n)) for a in "xyz"]
    columns += [(f"f_dc_{c}", f_dc[:, c]) for c in range(3)]
    if f_rest is not None:
        k_count = f_rest.shape[1]
        columns += [(f"f_rest_{c * k_count + k}", f_rest[:, k, c]) for c in range(3) for k in range(k_count)]
    columns += [("opacity", opacity_logit)]
    columns += [(f"scale_{a}", log_scales[:, a]) for a in range(3)]
    columns += [(f"rot_{a}", np.full(n, 1.0 if a == 0 else 0.0)) for a in range(4)]
    columns += list(extra)
    table = np.empty(n, [(name, "f4") for name, _ in columns])
    for name, values in columns:
        table[name] = values
    plyfile.PlyData([plyfile.PlyElement.describe(table, "vertex")]).write(str(path))


def write_gaussian_ply(path, n: int = 1500, seed: int = 0) -> np.ndarray:
    """A 3D Gaussian Splatting PLY (SH degree 1): a torus of Gaussians around the y axis
    (ring radius 1, tube radius 0.4), coloured by the angle around the ring; returns the
    positions [n, 3]."""
    gen = np.random.default_rng(seed)
    u, v = gen.uniform(0, 2 * np.pi, n), gen.uniform(0, 2 * np.pi, n)
    positions = np.stack([(1 + 0.4 * np.cos(v)) * np.cos(u), 0.4 * np.sin(v), (1 + 0.4 * np.cos(v)) * np.sin(u)], -1)
    rgb = np.stack([0.5 + 0.5 * np.cos(u), 0.5 + 0.5 * np.sin(u), 0.5 + 0.5 * np.cos(v)], -1)
    f_rest = gen.normal(scale=0.05, size=(n, 3, 3))  # [n, K, channel]
    write_gaussians(path, positions, (rgb - 0.5) / SH_C0, np.full((n, 3), np.log(0.05)), np.full(n, 4.0), f_rest)
    return positions


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def non_loopback_ipv4() -> Optional[str]:
    """An IPv4 address of this machine other than loopback, or None where it has none."""
    candidates: List[str] = []
    try:  # the address a route out would use; a UDP connect sends nothing
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            candidates.append(s.getsockname()[0])
    except OSError:
        pass
    try:
        candidates += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    if shutil.which("ip"):
        out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            tokens = line.split()
            candidates += [tokens[k + 1].split("/")[0] for k in range(len(tokens) - 1) if tokens[k] == "inet"]
    for address in candidates:
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            continue
        if ip.version == 4 and not ip.is_loopback and not ip.is_unspecified:
            return address
    return None


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Poll ``predicate`` until it returns something true (returned), else AssertionError
    naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def find_browser() -> Optional[tuple]:
    """(chromium, chromedriver) paths, or None where this machine has no browser."""
    browser = next(
        (shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome") if shutil.which(name)), None
    )
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


class Browser:
    """A headless Chromium driven through chromedriver (selenium); one window per page."""

    def __init__(self, browser: str, driver: str, size: tuple = (640, 480)) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--window-size={size[0]},{size[1]}")
        self._profile = tempfile.TemporaryDirectory(prefix="pulsar_py_viewer_test_")
        options.add_argument(f"--user-data-dir={self._profile.name}")
        self.driver = webdriver.Chrome(service=Service(driver), options=options)
        self._first = True

    def open(self, url: str) -> str:
        """Open ``url`` in a new window (the first in the start window); returns its handle."""
        if not self._first:
            self.driver.switch_to.new_window("window")
        self._first = False
        self.driver.get(url)
        return self.driver.current_window_handle

    def screenshot(self, window: str) -> np.ndarray:
        """[H, W, 3] uint8 of the window's page."""
        import imageio.v3 as iio

        self.driver.switch_to.window(window)
        return np.asarray(iio.imread(io.BytesIO(self.driver.get_screenshot_as_png()), extension=".png"))[..., :3]

    def element_image(self, window: str, css: str) -> Optional[np.ndarray]:
        """[h, w, 3] uint8 of the first element matching ``css`` in the window, or None.

        None also when the page replaced the element between finding it and taking its
        picture (a plot redraws its canvas as points arrive): the caller polls again.
        """
        import imageio.v3 as iio
        from selenium.common.exceptions import StaleElementReferenceException
        from selenium.webdriver.common.by import By

        self.driver.switch_to.window(window)
        found = self.driver.find_elements(By.CSS_SELECTOR, css)
        if not found:
            return None
        try:
            png = found[0].screenshot_as_png
        except StaleElementReferenceException:
            return None
        return np.asarray(iio.imread(io.BytesIO(png), extension=".png"))[..., :3]

    def click_button(self, window: str, label: str) -> None:
        """Click the page's button labelled ``label`` (waiting for it to show)."""
        from selenium.webdriver.common.by import By

        self.driver.switch_to.window(window)
        xpath = f"//button[normalize-space()='{label}']"
        button = wait_until(lambda: self.driver.find_elements(By.XPATH, xpath), 30.0, f"a button {label!r}")[0]
        button.click()

    def hide_notifications(self, window: str) -> None:
        """Remove the page's pop-up notices (the software-WebGL notice of a GPU-less run)."""
        self.driver.switch_to.window(window)
        self.driver.execute_script(
            "document.querySelectorAll('.mantine-Notification-root, .mantine-Notifications-root')"
            ".forEach(e => e.remove());"
        )

    def close_window(self, window: str) -> None:
        self.driver.switch_to.window(window)
        self.driver.close()
        remaining = self.driver.window_handles
        if remaining:
            self.driver.switch_to.window(remaining[0])

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            self._profile.cleanup()


def centre(image: np.ndarray, fraction: float = 0.3) -> np.ndarray:
    """The central ``fraction`` of an image (per side)."""
    h, w = image.shape[:2]
    dh, dw = int(h * fraction / 2), int(w * fraction / 2)
    return image[h // 2 - dh : h // 2 + dh, w // 2 - dw : w // 2 + dw]
