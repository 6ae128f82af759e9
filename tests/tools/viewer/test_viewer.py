"""The browser viewer without a browser: camera conventions, frames, scene loading, the
command's errors, the live viewer's losses and pause, the address it listens on, Ctrl-C.
The page itself is tested in a real browser by test_viewer_browser.py."""

from __future__ import annotations

import math
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from viewer_support import free_port, non_loopback_ipv4, write_gaussian_ply

from pulsar_py.tools.viewer import LiveViewer
from pulsar_py.tools.viewer import command as view_command
from pulsar_py.tools.viewer.camera import ViewCamera, camera_for_eye, render_size, to_camera
from pulsar_py.tools.viewer.frame import FrameRenderer, FrameSettings
from pulsar_py.tools.viewer.scene import ViewerScene, load_scene, scene_frame, scene_from_tensors
from pulsar_py.tools.viewer.server import check_address, is_loopback

REPO = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------------------------
# Camera conventions


def _browser_projection(view: ViewCamera, points: np.ndarray) -> np.ndarray:
    """Where the browser's perspective camera puts world points on its canvas, as
    fractions (0..1) of the canvas's width and height from its top-left corner: the
    OpenGL camera (looking along its -z, y up) at ``position`` whose orientation is
    viser's OpenCV-frame rotation with y and z flipped, and the projection of a vertical
    field of view ``fov_y`` with that aspect."""
    w, x, y, z = view.wxyz
    camera_to_world = np.array(
        [  # the rotation of the unit quaternion (w, x, y, z)
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )
    opengl = camera_to_world @ np.diag([1.0, -1.0, -1.0])
    eye = (points - np.asarray(view.position)) @ opengl  # rows: points in the OpenGL camera frame
    t = math.tan(view.fov_y / 2)
    ndc_x = eye[:, 0] / -eye[:, 2] / (view.aspect * t)
    ndc_y = eye[:, 1] / -eye[:, 2] / t
    return np.stack([(ndc_x + 1) / 2, (1 - ndc_y) / 2], -1)


@pytest.mark.parametrize("width,height", [(400, 300), (333, 200), (64, 97)])
def test_pulsar_camera_puts_points_where_the_browser_camera_does(width, height):
    gen = np.random.default_rng(1)
    q = gen.normal(size=4)
    view = ViewCamera(tuple(gen.normal(size=3)), tuple(q / np.linalg.norm(q)), fov_y=math.radians(55), aspect=1.6)
    camera = to_camera(view, width, height, near=0.01, dtype=torch.float64)
    # Points in front of the camera, within its view.
    forward = view.rotation_world_to_camera()[2]
    right, down = view.rotation_world_to_camera()[0], view.rotation_world_to_camera()[1]
    depth = gen.uniform(1, 5, size=(20, 1))
    points = (
        np.asarray(view.position)
        + depth * forward
        + depth * gen.uniform(-0.4, 0.4, size=(20, 1)) * right
        + depth * gen.uniform(-0.3, 0.3, size=(20, 1)) * down
    )
    uv, z = camera.project(torch.from_numpy(points))
    # The frame is stretched over the canvas: pixel centre u lies (u + 0.5) / W of the way across.
    fraction = (uv[0].numpy() + 0.5) / np.array([width, height])
    assert np.allclose(fraction, _browser_projection(view, points), atol=1e-9)
    assert bool((z > 0).all())


def test_look_at_camera_centres_its_target_with_up_upwards_and_right_to_the_right():
    view = camera_for_eye((0.0, 2.0, 6.0), (0.0, 0.0, 0.0), "+y", math.radians(50), 1.5)
    camera = to_camera(view, 150, 100, near=0.1, dtype=torch.float64)
    uv, _ = camera.project(torch.tensor([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64))
    target, above, right = uv[0].numpy()
    assert np.allclose(target, [74.5, 49.5], atol=1e-9)
    assert above[1] < target[1] - 5 and abs(above[0] - target[0]) < 1e-9
    assert right[0] > target[0] + 5  # a right-handed world, seen from +z: +x is to the right


def test_render_size_follows_the_canvas_and_the_scale():
    assert render_size(1280, 720, 1.0) == (1280, 720)
    assert render_size(1280, 720, 0.25) == (320, 180)
    assert render_size(10000, 5000, 1.0, max_side=4096) == (4096, 2048)
    with pytest.raises(ValueError, match="scale"):
        render_size(100, 100, 0.0)


# ---------------------------------------------------------------------------------------
# Frames


def _two_spheres() -> ViewerScene:
    """A red sphere at the origin, a green one 1 unit along +x; white background."""
    return ViewerScene(
        torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]),
        torch.tensor([[1.0, 0, 0], [0, 1.0, 0]]),
        torch.tensor([0.3, 0.3]),
    )


def test_frame_shows_each_sphere_where_the_browser_camera_sees_it():
    scene = _two_spheres()
    frame = scene_frame(scene)
    view = camera_for_eye((0.0, 0.0, 5.0), (0.0, 0.0, 0.0), "+y", math.radians(50), 2.0)
    settings = FrameSettings(gamma=1e-3, max_depth=20.0)
    pixels = FrameRenderer().render(scene, frame, view, 120, 60, settings).pixels
    assert pixels.shape == (60, 120, 3) and pixels.dtype == np.uint8
    red = (pixels[..., 0] > 200) & (pixels[..., 1] < 60)
    green = (pixels[..., 1] > 200) & (pixels[..., 0] < 60)
    ys, xs = np.nonzero(red)
    assert abs(xs.mean() - 59.5) < 1 and abs(ys.mean() - 29.5) < 1
    gx = np.nonzero(green)[1].mean()
    # +x one unit at depth 5: fx = (W / 2) / (aspect tan 25 deg) pixels per unit of x / z.
    assert abs(gx - (59.5 + (60 / (2.0 * math.tan(math.radians(25)))) / 5)) < 1.5
    assert tuple(pixels[0, 0]) == (255, 255, 255)  # the background


def test_depth_and_coverage_outputs():
    scene = _two_spheres()
    frame = scene_frame(scene)
    # From the side of the +x sphere: the green one is nearer than the red one.
    view = camera_for_eye((4.0, 0.0, 3.0), (0.5, 0.0, 0.0), "+y", math.radians(50), 1.0)
    renderer = FrameRenderer()
    image = renderer.render(scene, frame, view, 80, 80, FrameSettings(max_depth=20.0)).pixels
    coverage = renderer.render(scene, frame, view, 80, 80, FrameSettings(max_depth=20.0, output="coverage")).pixels
    depth = renderer.render(scene, frame, view, 80, 80, FrameSettings(max_depth=20.0, output="depth")).pixels
    red = (image[..., 0] > 200) & (image[..., 1] < 60)
    green = (image[..., 1] > 200) & (image[..., 0] < 60)
    assert red.sum() > 20 and green.sum() > 20
    assert coverage[0, 0, 0] == 0 and coverage[red | green][:, 0].min() > 200
    assert depth[0, 0, 0] == 0
    assert depth[green][:, 0].mean() > depth[red][:, 0].mean() + 20  # near is brighter


# ---------------------------------------------------------------------------------------
# Scenes


def test_load_scene_reads_a_gaussian_splatting_ply(tmp_path):
    positions = write_gaussian_ply(tmp_path / "g.ply", n=50)
    scene = load_scene(tmp_path / "g.ply")
    assert len(scene) == 50 and scene.sh_degree == 1
    assert torch.allclose(scene.positions, torch.tensor(positions, dtype=torch.float32))
    assert scene.opacity is not None and bool(((scene.opacity > 0.9) & (scene.opacity < 1)).all())
    features, degree = scene.features(1)
    assert degree == 1 and tuple(features.shape) == (50, 4, 3)
    assert scene.features(0)[0] is scene.colours and scene.features(0)[1] is None


def test_load_scene_errors_name_the_path(tmp_path):
    with pytest.raises(ValueError, match="PATH: no such file"):
        load_scene(tmp_path / "missing.ply")
    with pytest.raises(ValueError, match="PATH: expected a .ply file or a folder holding scene.ply"):
        load_scene(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="PATH: expected a .ply file"):
        load_scene(tmp_path / "notes.txt")
    (tmp_path / "bad.ply").write_text("not a ply\n")
    with pytest.raises(ValueError, match="not a PLY file"):
        load_scene(tmp_path / "bad.ply")


def test_scene_from_tensors_copies_and_mirrors_a_left_handed_scene():
    positions = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    colours, radii = torch.tensor([[0.1, 0.2, 0.3]]), torch.tensor([0.5])
    scene = scene_from_tensors(positions, colours, radii, right_handed=False)
    assert scene.positions.tolist() == [[1.0, 2.0, -3.0]] and not scene.positions.requires_grad
    colours.mul_(0)
    radii.mul_(0)
    assert scene.colours.tolist() == [[pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.3)]]
    assert scene.radii.tolist() == [0.5]
    sh = scene_from_tensors(positions, torch.zeros(1, 4, 3), radii + 1)
    assert sh.sh_degree == 1 and torch.allclose(sh.colours, torch.full((1, 3), 0.5))
    with pytest.raises(ValueError, match=r"radii: expected a tensor of shape \[N\] = \[1\], got \(2,\)"):
        scene_from_tensors(positions, colours, torch.ones(2))
    with pytest.raises(ValueError, match="colours"):
        scene_from_tensors(positions, torch.ones(1, 2), radii)


# ---------------------------------------------------------------------------------------
# The command's errors: one line each, no traceback


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize("viser_installed", [True, False])
def test_view_with_a_bad_path_says_so_in_one_line(tmp_path, capsys, monkeypatch, viser_installed):
    if not viser_installed:
        monkeypatch.setitem(sys.modules, "viser", None)  # import viser raises ModuleNotFoundError
    assert view_command.main([str(tmp_path / "missing.ply"), "--port", "0"]) == 1
    assert "PATH: no such file" in _one_line_error(capsys)


def test_view_on_a_port_in_use_says_so_in_one_line(tmp_path, capsys):
    write_gaussian_ply(tmp_path / "g.ply", n=10)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert view_command.main([str(tmp_path / "g.ply"), "--port", str(port)]) == 1
        line = _one_line_error(capsys)
    assert f"port {port} on 127.0.0.1 is in use" in line
    with pytest.raises(OSError, match="not an address of this machine"):
        check_address("no-such-host.invalid", 0)


def test_loopback_addresses_are_told_apart():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.1")


def test_view_without_viser_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    write_gaussian_ply(tmp_path / "g.ply", n=10)
    monkeypatch.setitem(sys.modules, "viser", None)  # import viser raises ModuleNotFoundError
    assert view_command.main([str(tmp_path / "g.ply"), "--port", "0"]) == 1
    assert 'pip install "pulsar_py[viewer]"' in _one_line_error(capsys)


def test_the_library_never_imports_viser():
    library = [p for p in (REPO / "pulsar_py").rglob("*.py") if "tools" not in p.relative_to(REPO / "pulsar_py").parts]
    assert library
    assert [str(p) for p in library if "viser" in p.read_text()] == []


# ---------------------------------------------------------------------------------------
# The live viewer


def test_live_viewer_keeps_the_losses_and_honours_pause():
    positions, colours, radii = torch.zeros(3, 3), torch.full((3, 3), 0.5), torch.full((3,), 0.2)
    positions[:, 0] = torch.arange(3.0)
    with LiveViewer(port=0, announce=False) as viewer:
        assert viewer.url.startswith("http://127.0.0.1:")
        viewer.update(positions, colours, radii, losses={"loss": 1.0})
        viewer.update(positions, colours, radii, losses={"loss": torch.tensor(0.5), "mse": 0.25})
        losses = viewer.losses()
        assert losses["step"] == [0.0, 1.0] and losses["loss"] == [1.0, 0.5]
        assert math.isnan(losses["mse"][0]) and losses["mse"][1] == 0.25
        assert viewer.viewer.source.get()[1] == 2
        # Paused, update waits until resumed.
        viewer.pause()
        done = threading.Event()
        worker = threading.Thread(
            target=lambda: (viewer.update(positions, colours, radii, losses={"loss": 0.1}), done.set())
        )
        worker.start()
        assert not done.wait(0.3) and viewer.paused
        viewer.resume()
        assert done.wait(10) and not viewer.paused
        worker.join()
        assert viewer.losses()["loss"][-1] == 0.1
        with pytest.raises(ValueError, match=r"losses\['x'\]"):
            viewer.update(positions, colours, radii, losses={"x": torch.ones(2)})


def test_demo_calls_back_every_step_and_saves_a_scene_the_viewer_reads(tmp_path):
    from pulsar_py.tools.demo import run_demo
    from pulsar_py.tools.demo_setup import DemoSettings

    settings = DemoSettings(width=24, height=18, n_spheres=60, floor_spacing=1.0, steps=2, gif_frames=1)
    seen = []
    run_demo(
        settings,
        torch.device("cpu"),
        str(tmp_path),
        progress=False,
        on_step=lambda step, scene, params, losses: seen.append(
            (step, sorted(losses), params.sphere_position.detach().clone())
        ),
    )
    assert [(s, keys) for s, keys, _ in seen] == [(k, ["loss", "mse"]) for k in range(2)]
    scene = load_scene(tmp_path)  # the folder: its scene.ply
    final = seen[-1][2]
    assert len(scene) == final.shape[0]
    # Saved right-handed: the demo's (left-handed) z negated.
    assert torch.allclose(scene.positions, final * torch.tensor([1.0, 1.0, -1.0]), atol=1e-6)


# ---------------------------------------------------------------------------------------
# The command as a process: loopback only, nothing but the page, Ctrl-C


# ``python -m pulsar_py`` as a terminal starts it, with SIGINT's default action (Python's
# KeyboardInterrupt). A process started with SIGINT ignored keeps it ignored (a background
# job of a non-interactive shell is, and passes that on to the test's processes): Ctrl-C
# could not reach the command there, and the test would not test it.
_AS_FROM_A_TERMINAL = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv[0] = 'pulsar_py'; runpy.run_module('pulsar_py', run_name='__main__', alter_sys=True)"
)


def test_view_listens_on_loopback_only_serves_no_files_and_stops_on_ctrl_c(tmp_path):
    ply = tmp_path / "scene.ply"
    write_gaussian_ply(ply, n=20)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", _AS_FROM_A_TERMINAL, "view", str(ply), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        line = process.stdout.readline()
        assert f"at http://127.0.0.1:{port} " in line, (line, process.stderr.read() if process.poll() else "")
        url = f"http://127.0.0.1:{port}"
        assert b"<html" in urllib.request.urlopen(url + "/", timeout=10).read().lower()
        # The page reaches nothing else on this machine: not the scene's file, not a
        # path outside viser's client.
        for path in (f"/{ply}", "/scene.ply", "/../../../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd"):
            with pytest.raises(urllib.error.HTTPError) as error:
                urllib.request.urlopen(url + path, timeout=10)
            assert error.value.code == 404, path
        address = non_loopback_ipv4()
        if address is not None:
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((address, port), timeout=5).close()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode in (0, 130), err
    assert "Traceback" not in err and "Traceback" not in out
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address: the loopback-only check did not run")
