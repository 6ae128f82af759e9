"""The viewer's page in a real headless browser (Chromium through chromedriver).

Marked ``browser``; skipped only where this machine has no Chromium and chromedriver
(Debian: ``apt-get install chromium chromium-driver``; .ci/run installs them where it
can). Set PULSAR_PY_VIEWER_SCREENSHOT=PATH to also write the page's screenshot there
(docs/images/viewer.png is made so).
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from viewer_support import Browser, centre, find_browser, free_port, wait_until, write_gaussian_ply

from pulsar_py.tools.viewer import command as view_command
from pulsar_py.tools.viewer.camera import fit_view

pytestmark = pytest.mark.browser

#: Seconds to wait for a page, a frame or a process (generous: a busy 2-core machine
#: renders in software and starts Python with torch slowly).
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def browser():
    found = find_browser()
    if found is None:
        pytest.skip(
            "no browser: Chromium and chromedriver are not installed (apt-get install chromium chromium-driver)"
        )
    # A small window keeps software rendering and screenshots quick; the docs' screenshot
    # is taken in a larger one.
    size = (960, 640) if os.environ.get("PULSAR_PY_VIEWER_SCREENSHOT") else (640, 480)
    driver = Browser(*found, size=size)
    yield driver
    driver.quit()


def _shows_a_scene(image: np.ndarray) -> bool:
    """The image's centre is not one flat colour."""
    middle = centre(image).astype(np.float64)
    return float(middle.std(axis=(0, 1)).max()) > 10.0


def _still_frame(tab, after: int):
    """Wait for a full-resolution frame (the view at rest) newer than frame ``after``."""
    return wait_until(
        lambda: (
            tab.frames_sent > after and tab.last_frame is not None and not tab.last_frame.preview and tab.frames_sent
        ),
        TIMEOUT,
        "a full-resolution frame",
    )


def _screenshot_showing(browser, window, predicate, what) -> np.ndarray:
    """The window's first screenshot for which ``predicate`` holds."""

    def attempt():
        shot = browser.screenshot(window)
        return (shot,) if predicate(shot) else None

    return wait_until(attempt, TIMEOUT, what, interval=0.3)[0]


def test_view_page_renders_the_scene_and_each_tab_has_its_own_camera(browser, tmp_path):
    ply = tmp_path / "gaussians.ply"
    write_gaussian_ply(ply, n=800)
    viewer = view_command.serve(view_command.parse_args([str(ply), "--port", str(free_port())]))
    try:
        first = browser.open(viewer.url)
        tab = wait_until(lambda: next(iter(viewer.tabs().values()), None), TIMEOUT, "the page to connect")
        sent = _still_frame(tab, 0)
        shot = _screenshot_showing(browser, first, _shows_a_scene, "the scene in the page's centre")
        assert tab.last_frame.width > 100 and tab.last_frame.height > 100
        target = os.environ.get("PULSAR_PY_VIEWER_SCREENSHOT")
        if target:
            import imageio.v3 as iio

            browser.hide_notifications(first)
            iio.imwrite(target, browser.screenshot(first))

        # A camera set through the tab's viser handle changes the frame.
        frame = viewer.source.frame
        eye, look_at = fit_view(frame)
        camera = tab.client.camera
        # From above, at the ring's +x side (the torus's ring has radius 1: the centre of
        # the frame is then the tube, not the hole).
        ring = (look_at[0] + 1.0, look_at[1], look_at[2])
        camera.position = (ring[0] + 0.2, ring[1] + 2.2 * frame.radius, ring[2] + 0.3)
        camera.look_at = ring
        sent = _still_frame(tab, sent)
        moved = _screenshot_showing(
            browser,
            first,
            lambda s: np.abs(centre(s).astype(float) - centre(shot)).mean() > 8,
            "the frame of the new camera",
        )
        assert _shows_a_scene(moved)

        # A second tab gets a camera of its own, at the first view, not the first tab's.
        second = browser.open(viewer.url)
        other = wait_until(
            lambda: next((s for i, s in viewer.tabs().items() if i != tab.client_id), None),
            TIMEOUT,
            "the second page to connect",
        )
        _still_frame(other, 0)
        # (The page may report its pose before the first view is applied: wait for it.)
        wait_until(
            lambda: np.allclose(other.client.camera.position, eye, atol=1e-3),
            TIMEOUT,
            "the second page's camera at the first view",
        )
        assert not np.allclose(tab.client.camera.position, eye, atol=1e-3)

        # Closing the second tab ends its view (render thread, renderers); the first
        # tab is still served.
        assert other.renderers_held > 0
        browser.close_window(second)
        wait_until(lambda: list(viewer.tabs()) == [tab.client_id], TIMEOUT, "the closed tab to disconnect")
        wait_until(lambda: other.closed, TIMEOUT, "the closed tab's render thread to end")
        assert other.renderers_held == 0
        camera.position = tuple(eye)
        camera.look_at = tuple(look_at)
        _still_frame(tab, sent)
        _screenshot_showing(
            browser,
            first,
            lambda s: np.abs(centre(s).astype(float) - centre(moved)).mean() > 8,
            "the first tab's frame after the second closed",
        )
    finally:
        viewer.stop()


def test_demo_view_plots_the_losses_while_it_trains(browser, tmp_path, monkeypatch):
    # ``pulsar-py demo --view`` in this process (its main, as the command line runs it),
    # so that the test can close its viewer where a user presses Ctrl-C.
    import pulsar_py.tools.viewer as viewer_package
    from pulsar_py.tools import demo

    started = []

    class RecordedLiveViewer(viewer_package.LiveViewer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(viewer_package, "LiveViewer", RecordedLiveViewer)
    out = tmp_path / "demo"
    status = []
    argv = [
        "--view",
        "--port",
        str(free_port()),
        "--steps",
        "8",
        "--width",
        "40",
        "--height",
        "30",
        "--spheres",
        "120",
        "--quiet",
        "--out",
        str(out),
    ]
    run = threading.Thread(target=lambda: status.append(demo.main(argv)))
    run.start()
    try:
        viewer = wait_until(lambda: started and started[0], TIMEOUT, "the demo's viewer to start")
        window = browser.open(viewer.url)
        _screenshot_showing(browser, window, _shows_a_scene, "the demo's spheres in the page's centre")

        def curve_span():
            """Share of the plot's width the loss curves (their stroke colours) cover."""
            plot = browser.element_image(window, ".uplot canvas")
            if plot is None:
                return 0.0
            stroke = np.array([[31, 119, 180], [255, 127, 14]])  # the first two curves' colours
            near = (np.abs(plot[:, :, None, :].astype(int) - stroke).max(-1) < 40).any(-1)
            columns = np.nonzero(near.any(0))[0]
            span = (columns.max() - columns.min()) / plot.shape[1] if columns.size else 0.0
            return span if span > 0.5 else 0.0

        # One point draws no line; more than one draws a curve across the plot.
        wait_until(curve_span, TIMEOUT, "a loss curve of more than one point", interval=0.3)
        assert len(viewer.losses()["loss"]) > 1
        # The page's button pauses (update waits) and resumes.
        browser.click_button(window, "Pause")
        wait_until(lambda: viewer.paused, TIMEOUT, "the pause button to pause")
        browser.click_button(window, "Resume")
        wait_until(lambda: not viewer.paused, TIMEOUT, "the button to resume")
        wait_until(
            lambda: (out / "scene.ply").is_file() and viewer.losses()["step"][-1] == 7, TIMEOUT, "the demo to finish"
        )
    finally:
        for each in started:
            each.close()  # what Ctrl-C does: the demo's wait ends
        run.join(TIMEOUT)
    assert status == [0]
