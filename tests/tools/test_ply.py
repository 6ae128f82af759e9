"""pulsar_py.ply (PLY reader and writer) and python -m pulsar_py render."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pulsar_py
from pulsar_py.tools.cli import main as cli_main
from pulsar_py.cameras.params import camera_from_params
from pulsar_py.io.ply import decode_ply, encode_ply, read_ply, write_ply
from pulsar_py.io.png import read_png
from pulsar_py.tools.render import bounding_sphere, estimate_radius, fit_camera, render_point_cloud


def _cloud(n=50, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randn(n, 3, generator=gen) * 2
    col = torch.rand(n, 3, generator=gen)
    rad = 0.05 + 0.1 * torch.rand(n, generator=gen)
    opa = torch.rand(n, generator=gen)
    return pos, col, rad, opa


# ---------------------------------------------------------------------------------------
# Reading and writing


@pytest.mark.parametrize("binary", [True, False])
@pytest.mark.parametrize("colour_type", ["uchar", "float"])
def test_round_trip(tmp_path, binary, colour_type):
    pos, col, rad, opa = _cloud()
    path = tmp_path / "sub" / "cloud.ply"
    write_ply(path, pos, col, rad, opa, binary=binary, colour_type=colour_type)
    cloud = read_ply(path)
    assert len(cloud) == 50
    assert torch.allclose(cloud.positions, pos, atol=1e-6)
    colour_tol = 0.5 / 255 + 1e-6 if colour_type == "uchar" else 1e-6
    assert float((cloud.colours - col).abs().max()) <= colour_tol
    assert torch.allclose(cloud.radii, rad, atol=1e-6) and torch.allclose(cloud.opacity, opa, atol=1e-6)
    assert cloud.positions.dtype == torch.float32


def test_positions_only(tmp_path):
    pos = _cloud()[0]
    cloud = decode_ply(encode_ply(pos))
    assert torch.allclose(cloud.positions, pos) and cloud.colours is None and cloud.radii is None
    assert cloud.opacity is None
    empty = decode_ply(encode_ply(torch.zeros(0, 3), binary=False))
    assert len(empty) == 0


def test_ascii_with_comments_faces_and_other_names():
    text = """ply
format ascii 1.0
comment made by hand
obj_info nothing
element vertex 3
property float x
property float y
property float z
property uchar r
property uchar g
property uchar b
property uchar alpha
property float scale
element face 1
property list uchar int vertex_indices
end_header
0 0 0 255 0 0 255 0.5
1 0 0 0 255 0 0 0.25
0 1.5 -2 0 0 51 128 1
3 0 1 2
"""
    cloud = decode_ply(text.encode())
    assert cloud.positions.tolist() == [[0, 0, 0], [1, 0, 0], [0, 1.5, -2]]
    assert torch.allclose(cloud.colours, torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 0.2]]))
    assert torch.allclose(cloud.opacity, torch.tensor([1.0, 0.0, 128 / 255]))
    assert cloud.radii.tolist() == [0.5, 0.25, 1.0]


@pytest.mark.parametrize("order", ["<", ">"])
def test_binary_with_a_list_element_before_the_vertices(order):
    fmt = "binary_little_endian" if order == "<" else "binary_big_endian"
    header = (f"ply\nformat {fmt} 1.0\nelement face 2\nproperty list uchar int vertex_indices\n"
              "element vertex 2\nproperty double x\nproperty double y\nproperty double z\n"
              "property ushort red\nproperty ushort green\nproperty ushort blue\nend_header\n").encode()
    faces = struct.pack(order + "B3i", 3, 0, 1, 2) + struct.pack(order + "B4i", 4, 0, 1, 2, 3)
    vertices = struct.pack(order + "3d3H", 1.0, 2.0, 3.0, 65535, 0, 32768) + \
        struct.pack(order + "3d3H", -1.0, 0.5, 0.0, 0, 65535, 0)
    cloud = decode_ply(header + faces + vertices)
    assert cloud.positions.tolist() == [[1, 2, 3], [-1, 0.5, 0]]
    assert torch.allclose(cloud.colours, torch.tensor([[1.0, 0, 32768 / 65535], [0, 1, 0]]))


def test_windows_line_endings_in_the_header():
    data = encode_ply(torch.tensor([[1.0, 2.0, 3.0]]), binary=False).replace(b"\n", b"\r\n")
    assert decode_ply(data).positions.tolist() == [[1, 2, 3]]


@pytest.mark.parametrize("data, message", [
    (b"PK\x03\x04", "not a PLY"),
    (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\n", "end_header"),
    (b"ply\nformat binary_middle_endian 1.0\nend_header\n", "format"),
    (b"ply\nelement vertex 1\nproperty float x\nend_header\n1\n", "format"),
    (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nend_header\n1 2\n", "missing z"),
    (b"ply\nformat ascii 1.0\nelement face 1\nproperty list uchar int v\nend_header\n0\n", "vertex"),
    (b"ply\nformat binary_little_endian 1.0\nelement vertex 5\nproperty float x\nproperty float y\n"
     b"property float z\nend_header\n" + b"\x00" * 12, "too short"),
    (b"ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\nproperty float z\n"
     b"end_header\n1 2 3\n", "vertex lines"),
    (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty quad x\nend_header\n", "property"),
])
def test_bad_files_are_clear_errors(data, message):
    with pytest.raises(ValueError, match=message):
        decode_ply(data)


def test_writer_checks_its_arguments():
    with pytest.raises(ValueError, match="positions"):
        encode_ply(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="colours"):
        encode_ply(torch.zeros(4, 3), colours=torch.zeros(3, 3))
    with pytest.raises(ValueError, match="colour_type"):
        encode_ply(torch.zeros(4, 3), colour_type="half")


# ---------------------------------------------------------------------------------------
# Rendering


def test_fitted_camera_sees_the_whole_cloud():
    pos = _cloud(200)[0].double() + torch.tensor([10.0, -3.0, 4.0], dtype=torch.float64)
    radii = torch.full((200,), 0.1, dtype=torch.float64)
    frame = bounding_sphere(pos, radii)
    for azimuth, elevation, up in ((0, 0, (0, 1, 0)), (60, 30, (0, 1, 0)), (10, -20, (0, 0, 1))):
        cam, near, far = fit_camera(frame, 64, 48, 50.0, azimuth, elevation, up, right_handed=True)
        native = camera_from_params(cam[None], 64, 48, right_handed=True)
        # Project every point: the film coordinates (column, row) lie inside the image.
        rel = pos - native.eye
        axis = native.optical_axis()[0]
        depth = rel @ axis
        assert float(depth.min()) > near and float(depth.max()) < far
        on_film = rel * (native.focal / depth)[:, None] - native.p00_rel
        col = on_film @ native.pdx[0] / native.pdx[0].dot(native.pdx[0])
        row = on_film @ native.pdy[0] / native.pdy[0].dot(native.pdy[0])
        assert float(col.min()) > 0 and float(col.max()) < 63
        assert float(row.min()) > 0 and float(row.max()) < 47


def test_radius_estimate_follows_the_point_spacing():
    # A square grid of spacing h: the nearest neighbour is h away; the estimate closes gaps.
    h = 0.1
    g = torch.arange(40, dtype=torch.float64) * h
    x, y = torch.meshgrid(g, g, indexing="ij")
    grid = torch.stack([x.reshape(-1), y.reshape(-1), torch.zeros(1600, dtype=torch.float64)], dim=-1)
    assert 1.5 * h <= estimate_radius(grid) <= 2.5 * h
    # A random subset of the points is scaled back to the full density.
    assert 1.0 * h <= estimate_radius(grid, sample=400) <= 3.0 * h


def test_render_command_draws_the_cloud(tmp_path, capsys):
    pos, col, rad, _ = _cloud(300)
    col[:] = torch.tensor([0.9, 0.1, 0.1])  # all red
    ply = tmp_path / "cloud.ply"
    write_ply(ply, pos, col, rad * 3)
    out = tmp_path / "out" / "render.png"
    assert cli_main(["render", "--ply", str(ply), "--out", str(out), "--width", "48", "--height", "36"]) == 0
    assert str(out) in capsys.readouterr().out
    image = read_png(out).int()
    assert image.shape == (36, 48, 3)
    white = (image == 255).all(-1)
    assert bool(white[0, 0]) and bool(white[-1, -1])  # background corners
    red = (image[..., 0] > 150) & (image[..., 1] < 80) & (image[..., 2] < 80)
    assert 0.05 < float(red.float().mean()) < 0.9
    assert bool(red[18, 24])  # the cloud is centred


def test_render_with_cam_params_and_look_at_agree(tmp_path):
    pos, col, rad, opa = _cloud(100)
    from pulsar_py.io.ply import PointCloud
    from pulsar_py.cameras.look_at import look_at_params

    cloud = PointCloud(pos, col, rad, opa)
    eye, target = (0.5, 1.0, 12.0), (0.0, 0.0, 0.0)
    by_eye = render_point_cloud(cloud, 40, 30, eye=eye, target=target, min_depth=2.0, max_depth=20.0)
    cam = look_at_params(eye, target, sensor_width=2 * np.tan(np.radians(25.0)), right_handed=True)
    by_params = render_point_cloud(cloud, 40, 30, cam_params=cam.tolist(), min_depth=2.0, max_depth=20.0)
    assert torch.allclose(by_eye, by_params, atol=1e-5)
    assert float((by_eye - 1).abs().max()) > 0.5  # something was drawn


def test_render_command_errors(tmp_path, capsys):
    assert cli_main(["render", "--ply", str(tmp_path / "none.ply"), "--out", str(tmp_path / "x.png")]) == 1
    assert "--ply" in capsys.readouterr().err
    bad = tmp_path / "bad.ply"
    bad.write_bytes(b"not a ply")
    assert cli_main(["render", "--ply", str(bad), "--out", str(tmp_path / "x.png")]) == 1
    assert "not a PLY" in capsys.readouterr().err
    good = tmp_path / "good.ply"
    write_ply(good, *_cloud(10)[:3])
    assert cli_main(["render", "--ply", str(good), "--out", str(tmp_path / "x.png"), "--eye", "0,0,5",
                     "--cam-params", "0,0,0,0,0,0,1,1"]) == 2
    assert cli_main(["render", "--ply", str(good), "--out", str(tmp_path / "x.png"), "--cam-params", "1,2"]) == 2
    assert cli_main(["render", "--ply", str(good), "--out", str(tmp_path / "x.png"), "--radius", "-1"]) == 1
    assert "--radius" in capsys.readouterr().err
    opaque = tmp_path / "opaque.ply"
    write_ply(opaque, *_cloud(10)[:3], opacity=torch.full((10,), 2.0))
    assert cli_main(["render", "--ply", str(opaque), "--out", str(tmp_path / "x.png")]) == 1
    assert "opacity" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_python_m_pulsar_py_render(tmp_path):
    ply = tmp_path / "c.ply"
    write_ply(ply, *_cloud(40)[:2], binary=False)  # no radii: estimated
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(pulsar_py.__file__).resolve().parent.parent) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-m", "pulsar_py", "render", "--ply", "c.ply", "--out", "c.png",
                           "--width", "32", "--height", "24", "--azimuth", "45", "--elevation", "10"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert read_png(tmp_path / "c.png").shape == (24, 32, 3)
