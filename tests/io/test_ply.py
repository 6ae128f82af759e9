"""pulsar_py.io.ply (PLY point clouds and 3D Gaussian Splatting scenes, through plyfile)
and pulsar-py render."""

from __future__ import annotations

import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

plyfile = pytest.importorskip("plyfile")

from viewer_support import write_gaussians  # noqa: E402

import pulsar_py  # noqa: E402
from pulsar_py.io.images import read_image  # noqa: E402
from pulsar_py.io.ply import (  # noqa: E402
    GAUSSIAN_RADIUS_FACTOR,
    IgnoredElementsWarning,
    decode_ply,
    encode_ply,
    gaussian_radius,
    read_ply,
    write_ply,
)
from pulsar_py.sh import SH_C0, sh_to_color  # noqa: E402
from pulsar_py.tools.cli import main as cli_main  # noqa: E402
from pulsar_py.tools.render import render_point_cloud  # noqa: E402


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
    with pytest.warns(IgnoredElementsWarning, match="ignored the file's 1 face: only its 3 vertices are read"):
        cloud = decode_ply(text.encode())
    assert cloud.positions.tolist() == [[0, 0, 0], [1, 0, 0], [0, 1.5, -2]]
    assert torch.allclose(cloud.colours, torch.tensor([[1.0, 0, 0], [0, 1, 0], [0, 0, 0.2]]))
    assert torch.allclose(cloud.opacity, torch.tensor([1.0, 0.0, 128 / 255]))
    assert cloud.radii.tolist() == [0.5, 0.25, 1.0]


@pytest.mark.parametrize("order", ["<", ">"])
def test_binary_with_a_list_element_before_the_vertices(order):
    fmt = "binary_little_endian" if order == "<" else "binary_big_endian"
    header = (
        f"ply\nformat {fmt} 1.0\nelement face 2\nproperty list uchar int vertex_indices\n"
        "element vertex 2\nproperty double x\nproperty double y\nproperty double z\n"
        "property ushort red\nproperty ushort green\nproperty ushort blue\nend_header\n"
    ).encode()
    faces = struct.pack(order + "B3i", 3, 0, 1, 2) + struct.pack(order + "B4i", 4, 0, 1, 2, 3)
    vertices = struct.pack(order + "3d3H", 1.0, 2.0, 3.0, 65535, 0, 32768) + struct.pack(
        order + "3d3H", -1.0, 0.5, 0.0, 0, 65535, 0
    )
    with pytest.warns(IgnoredElementsWarning, match="2 faces"):
        cloud = decode_ply(header + faces + vertices)
    assert cloud.positions.tolist() == [[1, 2, 3], [-1, 0.5, 0]]
    assert torch.allclose(cloud.colours, torch.tensor([[1.0, 0, 32768 / 65535], [0, 1, 0]]))


def test_windows_line_endings_in_the_header():
    data = encode_ply(torch.tensor([[1.0, 2.0, 3.0]]), binary=False).replace(b"\n", b"\r\n")
    assert decode_ply(data).positions.tolist() == [[1, 2, 3]]


@pytest.mark.parametrize(
    "data, message",
    [
        (b"PK\x03\x04", "not a PLY"),
        (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\n", "bad header: .*end-of-file"),
        (b"ply\nformat binary_middle_endian 1.0\nend_header\n", "bad header: .*format"),
        (b"ply\nelement vertex 1\nproperty float x\nend_header\n1\n", "bad header: .*format"),
        (
            b"ply\nformat ascii 1.0\nelement vertex 1\nproperty float x\nproperty float y\nend_header\n1 2\n",
            "positions: found x, y without z",
        ),
        (
            b"ply\nformat ascii 1.0\nelement face 1\nproperty list uchar int v\nend_header\n3 0 1 2\n",
            "expected a 'vertex' element, got the elements face",
        ),
        (
            b"ply\nformat binary_little_endian 1.0\nelement vertex 5\nproperty float x\nproperty float y\n"
            b"property float z\nend_header\n" + b"\x00" * 12,
            "declares 5 'vertex' rows \\(at least 60 bytes\\), but the file holds 12 bytes after its header",
        ),
        (
            b"ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\nproperty float z\n"
            b"end_header\n1 2 3\n",
            "declares 2 'vertex' rows .*holds 6 bytes after its header",
        ),
        (
            b"ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\nproperty float z\n"
            b"end_header\n1 2 3\n1 2 3 4\n",
            "bad data: .*vertex.*row 1",
        ),
        (
            b"ply\nformat binary_little_endian 1.0\nelement face 1\nproperty list uchar int vertex_indices\n"
            b"end_header\n\x03" + b"\x00" * 8,
            "bad data: .*face.*end-of-file",
        ),
        (b"ply\nformat ascii 1.0\nelement vertex 1\nproperty quad x\nend_header\n", "bad header: .*'quad'"),
        (
            b"ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\nproperty float z\n"
            b"property float radius\nend_header\n0 0 0 1\n1 1 1 -0.5\n",
            "radii: expected values > 0, got a minimum of -0.5",
        ),
        (
            b"ply\nformat ascii 1.0\nelement vertex 2\nproperty float x\nproperty float y\nproperty float z\n"
            b"property float alpha\nend_header\n0 0 0 1\n1 1 1 1.5\n",
            "opacity: expected values in \\[0, 1\\], got \\[1.0, 1.5\\]",
        ),
    ],
)
def test_bad_files_are_clear_errors(data, message):
    with pytest.raises(ValueError, match=message):
        decode_ply(data)


HEADER_XYZ = "property float x\nproperty float y\nproperty float z\n"


@pytest.mark.parametrize(
    "header, data",
    [
        (f"format binary_little_endian 1.0\nelement vertex {10**15}\n{HEADER_XYZ}", b"\x00" * 24),
        (
            f"format binary_big_endian 1.0\nelement face {10**12}\nproperty list uchar int vertex_indices\n"
            f"element vertex 2\n{HEADER_XYZ}",
            b"\x00" * 64,
        ),
        (f"format ascii 1.0\nelement vertex {10**15}\n{HEADER_XYZ}", b"0 0 0\n1 1 1\n"),
    ],
    ids=["vertices_1e15", "faces_first_1e12", "ascii_vertices_1e15"],
)
def test_counts_beyond_the_file_are_a_clear_error_before_any_allocation(tmp_path, header, data, capsys):
    # plyfile would allocate the declared rows first (petabytes): numpy's out-of-memory error.
    content = f"ply\n{header}end_header\n".encode() + data
    with pytest.raises(
        ValueError,
        match=r"ply: the header declares 10{12,15} '(vertex|face)' rows \(at least "
        r"\d+ bytes\).*but the file holds \d+ bytes after its header",
    ):
        decode_ply(content)
    path = tmp_path / "big.ply"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="declares"):
        read_ply(path)
    assert cli_main(["render", "--ply", str(path), "--out", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "declares" in err and "Traceback" not in err, err
    # A file that ends its last ASCII row without a newline is whole.
    assert decode_ply(
        b"ply\nformat ascii 1.0\nelement vertex 1\n" + HEADER_XYZ.encode() + b"end_header\n1 2 3"
    ).positions.tolist() == [[1, 2, 3]]


def test_writer_checks_its_arguments():
    with pytest.raises(ValueError, match="positions"):
        encode_ply(torch.zeros(4, 2))
    with pytest.raises(ValueError, match="colours"):
        encode_ply(torch.zeros(4, 3), colours=torch.zeros(3, 3))
    with pytest.raises(ValueError, match="colour_type"):
        encode_ply(torch.zeros(4, 3), colour_type="half")


# ---------------------------------------------------------------------------------------
# Rendering


def test_render_command_draws_the_cloud(tmp_path, capsys):
    pos, col, rad, _ = _cloud(300)
    col[:] = torch.tensor([0.9, 0.1, 0.1])  # all red
    ply = tmp_path / "cloud.ply"
    write_ply(ply, pos, col, rad * 3)
    out = tmp_path / "out" / "render.png"
    assert cli_main(["render", "--ply", str(ply), "--out", str(out), "--width", "48", "--height", "36"]) == 0
    assert str(out) in capsys.readouterr().out
    image = read_image(out).int()
    assert image.shape == (36, 48, 3)
    white = (image == 255).all(-1)
    assert bool(white[0, 0]) and bool(white[-1, -1])  # background corners
    red = (image[..., 0] > 150) & (image[..., 1] < 80) & (image[..., 2] < 80)
    assert 0.05 < float(red.float().mean()) < 0.9
    assert bool(red[18, 24])  # the cloud is centred


def _marker_cloud(path):
    """Four spheres around the origin (their centre): red at -z, blue at +z, green at +x,
    yellow at -x."""
    write_ply(
        path,
        torch.tensor([[0.0, 0.0, -1.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]]),
        torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [1.0, 1.0, 0.0]]),
        torch.full((4,), 0.35),
    )


def _row_of(image, channel):
    """Mean row of the pixels where ``channel`` dominates."""
    strong = (image[..., channel] > 150) & (image.sum(-1) - image[..., channel] < 150)
    assert bool(strong.any()), channel
    return float(strong.nonzero()[:, 0].float().mean())


def test_render_command_from_straight_above_and_below(tmp_path, capsys):
    ply = tmp_path / "markers.ply"
    _marker_cloud(ply)
    size = ["--width", "40", "--height", "30", "--background", "0,0,0"]
    views = {
        "above": ["--eye", "0,5,0"],
        "below": ["--eye", "0,-5,0", "--target", "0,0,0"],
        "elevation_90": ["--elevation", "90"],
        "elevation_-90": ["--elevation", "-90"],
    }
    for name, camera in views.items():
        out = tmp_path / f"{name}.png"
        assert cli_main(["render", "--ply", str(ply), "--out", str(out), *size, *camera]) == 0, capsys.readouterr().err
        image = read_image(out).int()
        red, blue = _row_of(image, 0), _row_of(image, 2)
        # Looking down (+y up): world -z (red) at the top; looking up: +z (blue) at the top.
        assert (red < blue - 5) if name in ("above", "elevation_90") else (blue < red - 5), (name, red, blue)


def test_render_command_fields_of_view(tmp_path, capsys):
    ply = tmp_path / "markers.ply"
    _marker_cloud(ply)

    def render(*camera):
        out = tmp_path / "fov.png"
        status = cli_main(
            [
                "render",
                "--ply",
                str(ply),
                "--out",
                str(out),
                "--width",
                "40",
                "--height",
                "20",
                "--eye",
                "0,0,6",
                *camera,
            ]
        )
        return status, read_image(out).int() if status == 0 else None, capsys.readouterr().err

    default, vertical = render(), render("--fov-y", "40")
    assert default[0] == vertical[0] == 0 and torch.equal(default[1], vertical[1]) and vertical[2] == ""
    # The horizontal field of view that a 2:1 image has with a vertical one of 40 degrees.
    fov_x = math.degrees(2 * math.atan(2 * math.tan(math.radians(20.0))))
    horizontal = render("--fov-x", f"{fov_x!r}")
    assert horizontal[0] == 0 and int((horizontal[1] - vertical[1]).abs().max()) <= 1
    narrow = render("--fov-y", "20")
    assert int((narrow[1] != 255).any(-1).sum()) > 2 * int((vertical[1] != 255).any(-1).sum())  # drawn larger
    deprecated, explicit = render("--fov", "50"), render("--fov-x", "50")
    assert torch.equal(deprecated[1], explicit[1])
    assert deprecated[2].strip() == (
        "render: warning: --fov is deprecated: it is the horizontal field of view, now "
        "--fov-x (--fov-y gives the vertical one)"
    )
    assert render("--fov-y", "40", "--fov-x", "50")[0] == 2
    assert render("--fov-y", "180")[0] == 2


def test_render_command_says_that_a_meshs_faces_are_ignored(tmp_path, capsys):
    header = (
        "ply\nformat ascii 1.0\nelement vertex 3\nproperty float x\nproperty float y\nproperty float z\n"
        "element face 1\nproperty list uchar int vertex_indices\nend_header\n"
    )
    ply = tmp_path / "mesh.ply"
    ply.write_text(header + "0 0 0\n1 0 0\n0 1 0\n3 0 1 2\n")
    assert (
        cli_main(["render", "--ply", str(ply), "--out", str(tmp_path / "mesh.png"), "--width", "16", "--height", "12"])
        == 0
    )
    assert capsys.readouterr().err.strip() == (
        "render: warning: ply: ignored the file's 1 face: only its 3 vertices "
        "are read, each drawn as a sphere (no mesh surface)"
    )


def test_render_command_errors(tmp_path, capsys):
    assert cli_main(["render", "--ply", str(tmp_path / "none.ply"), "--out", str(tmp_path / "x.png")]) == 1
    assert "--ply" in capsys.readouterr().err
    bad = tmp_path / "bad.ply"
    bad.write_bytes(b"not a ply")
    assert cli_main(["render", "--ply", str(bad), "--out", str(tmp_path / "x.png")]) == 1
    assert "not a PLY" in capsys.readouterr().err
    good = tmp_path / "good.ply"
    write_ply(good, *_cloud(10)[:3])
    assert (
        cli_main(
            [
                "render",
                "--ply",
                str(good),
                "--out",
                str(tmp_path / "x.png"),
                "--eye",
                "0,0,5",
                "--cam-params",
                "0,0,0,0,0,0,1,1",
            ]
        )
        == 2
    )
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
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pulsar_py",
            "render",
            "--ply",
            "c.ply",
            "--out",
            "c.png",
            "--width",
            "32",
            "--height",
            "24",
            "--azimuth",
            "45",
            "--elevation",
            "10",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert read_image(tmp_path / "c.png").shape == (24, 32, 3)


# ---------------------------------------------------------------------------------------
# 3D Gaussian Splatting scenes


def test_gaussian_scene_is_read_with_its_conventions(tmp_path):
    gen = np.random.default_rng(0)
    n = 5
    positions = gen.normal(size=(n, 3))
    f_dc = gen.normal(size=(n, 3))
    f_rest = gen.normal(size=(n, 15, 3))  # degree 3
    log_scales = gen.normal(-2, 0.5, size=(n, 3))
    logit = gen.normal(size=n)
    write_gaussians(tmp_path / "g.ply", positions, f_dc, log_scales, logit, f_rest)
    cloud = read_ply(tmp_path / "g.ply")
    assert len(cloud) == n and cloud.sh_degree == 3 and cloud.sh_coefficients.shape == (n, 16, 3)
    assert torch.allclose(cloud.positions, torch.tensor(positions, dtype=torch.float32))
    assert torch.allclose(cloud.sh_coefficients[:, 0], torch.tensor(f_dc, dtype=torch.float32))
    assert torch.allclose(cloud.sh_coefficients[:, 1:], torch.tensor(f_rest, dtype=torch.float32))
    assert torch.allclose(cloud.opacity, torch.tensor(1 / (1 + np.exp(-logit)), dtype=torch.float32))
    assert torch.allclose(cloud.colours, torch.tensor(np.maximum(SH_C0 * f_dc + 0.5, 0), dtype=torch.float32))
    assert torch.allclose(cloud.radii, gaussian_radius(torch.tensor(log_scales)).float())
    # Degree 1 and 0.
    write_gaussians(tmp_path / "g1.ply", positions, f_dc, log_scales, logit, f_rest[:, :3])
    assert read_ply(tmp_path / "g1.ply").sh_degree == 1
    write_gaussians(tmp_path / "g0.ply", positions, f_dc, log_scales, logit)
    assert read_ply(tmp_path / "g0.ply").sh_degree == 0


def test_gaussian_radius_rule():
    # Round Gaussians: sqrt(2) times the standard deviation.
    s = torch.tensor([0.1, 1.0, 3.0], dtype=torch.float64)
    log_round = torch.log(s)[:, None].expand(3, 3)
    assert torch.allclose(gaussian_radius(log_round), GAUSSIAN_RADIUS_FACTOR * s)
    assert GAUSSIAN_RADIUS_FACTOR == pytest.approx(math.sqrt(2))
    # Elongated and flat ones: a sphere with the ellipsoid's mean projected area (to
    # about 1 %), by direct averaging of the ellipse areas over many directions.
    gen = torch.Generator().manual_seed(0)
    u = torch.nn.functional.normalize(torch.randn(200000, 3, generator=gen, dtype=torch.float64), dim=-1)
    for axes in ((1.0, 1.0, 1e-4), (2.0, 0.5, 0.25), (1.0, 0.2, 0.2)):
        a, b, c = axes
        area = math.pi * torch.sqrt((b * c * u[:, 0]) ** 2 + (a * c * u[:, 1]) ** 2 + (a * b * u[:, 2]) ** 2)
        equal_area_radius = math.sqrt(float(area.mean()) / math.pi)
        radius = float(gaussian_radius(torch.log(torch.tensor(axes, dtype=torch.float64))))
        assert radius == pytest.approx(GAUSSIAN_RADIUS_FACTOR * equal_area_radius, rel=0.015), axes
    # A flat splat keeps its size: the geometric mean would be 0.046 here.
    assert float(gaussian_radius(torch.log(torch.tensor([1.0, 1.0, 1e-4])))) > 0.99


def test_pulsar_py_render_draws_a_gaussian_scene_with_view_dependent_colour(tmp_path, capsys):
    # Two Gaussians with the same coefficients at x = -1 and x = +1, seen from (0, 0, 10):
    # only red's degree-1 coefficient of the x term (f_rest_2 in 3DGS's channel-major
    # layout) is set, so they differ in red alone, by the view direction.
    positions = np.array([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    f_dc = np.array([[0.4, -0.3, 0.0], [0.4, -0.3, 0.0]])
    f_rest = np.zeros((2, 3, 3))
    f_rest[:, 2, 0] = -3.0
    log_scales = np.log(np.full((2, 3), 0.5))
    ply = tmp_path / "scene.ply"
    write_gaussians(ply, positions, f_dc, log_scales, np.full(2, 8.0), f_rest)
    out = tmp_path / "scene.png"
    assert (
        cli_main(
            [
                "render",
                "--ply",
                str(ply),
                "--out",
                str(out),
                "--width",
                "96",
                "--height",
                "64",
                "--eye",
                "0,0,10",
                "--target",
                "0,0,0",
                "--fov",
                "50",
                "--background",
                "0,0,0",
            ]
        )
        == 0
    )
    assert str(out) in capsys.readouterr().out
    image = read_image(out).float() / 255
    assert image.shape == (64, 96, 3)
    eye = torch.tensor([0.0, 0.0, 10.0], dtype=torch.float64)
    coefficients = torch.cat([torch.tensor(f_dc)[:, None], torch.tensor(f_rest)], dim=1)
    expected = sh_to_color(coefficients, torch.tensor(positions) - eye, 1)
    # The spheres' centres: 0.1 / tan(25 deg) of the half width from the image's centre.
    offset = 0.1 / math.tan(math.radians(25)) * 48
    for k, column in enumerate((47.5 - offset, 47.5 + offset)):
        pixel = image[31:33, round(column) - 1 : round(column) + 1].reshape(-1, 3).mean(0)
        assert torch.allclose(pixel.double(), expected[k], atol=4 / 255), (k, pixel, expected[k])
    assert float(expected[1, 0] - expected[0, 0]) > 0.25  # the view direction changes red a lot
    assert float(image[0, 0].max()) == 0.0 and float(image[-1, -1].max()) == 0.0  # background
    # A sphere's radius: sqrt(2) * 0.5 world units = 7.3 pixels at depth 10.
    row = image[32, :, 1] > 0.1
    assert 12 <= int(row[:48].sum()) <= 17


def test_gaussian_scene_without_higher_degrees_renders_its_dc_colour(tmp_path):
    positions = np.zeros((1, 3))
    f_dc = np.array([[1.0, -1.0, 0.2]])
    write_gaussians(tmp_path / "g.ply", positions, f_dc, np.log(np.full((1, 3), 0.3)), np.array([9.0]))
    cloud = read_ply(tmp_path / "g.ply")
    image = render_point_cloud(cloud, 32, 24, background=(0.0, 0.0, 0.0))
    expected = torch.tensor(np.maximum(SH_C0 * f_dc[0] + 0.5, 0.0), dtype=torch.float32)
    assert torch.allclose(image[12, 16], expected, atol=2e-3)


def test_unknown_layout_names_what_was_found_and_what_is_expected(tmp_path, capsys):
    table = np.zeros(3, [("a", "f4"), ("b", "f4"), ("c", "u1")])
    plyfile.PlyData([plyfile.PlyElement.describe(table, "vertex")], text=True).write(str(tmp_path / "u.ply"))
    with pytest.raises(ValueError) as caught:
        read_ply(tmp_path / "u.ply")
    message = str(caught.value)
    assert "no positions (x, y, z)" in message and "the vertex element has the properties a, b, c" in message
    assert "expected a point cloud (x, y, z" in message and "3D Gaussian Splatting scene" in message
    assert cli_main(["render", "--ply", str(tmp_path / "u.ply"), "--out", str(tmp_path / "u.png")]) == 1
    err = capsys.readouterr().err
    assert "the vertex element has the properties a, b, c" in err and "f_dc_0" in err
    assert not (tmp_path / "u.png").exists()


def test_partial_layouts_are_errors(tmp_path):
    positions, f_dc = np.zeros((2, 3)), np.zeros((2, 3))
    log_scales, logit = np.zeros((2, 3)), np.zeros(2)
    write_gaussians(
        tmp_path / "r.ply", positions, f_dc, log_scales, logit, extra=[(f"f_rest_{k}", np.zeros(2)) for k in range(5)]
    )
    with pytest.raises(ValueError, match=r"R = 9, 24 or 45 .* got 5 f_rest properties.*f_rest_4"):
        read_ply(tmp_path / "r.ply")
    table = np.zeros(2, [("x", "f4"), ("y", "f4"), ("z", "f4"), ("f_dc_0", "f4"), ("f_dc_1", "f4")])
    plyfile.PlyData([plyfile.PlyElement.describe(table, "vertex")]).write(str(tmp_path / "d.ply"))
    with pytest.raises(ValueError, match="found f_dc_0, f_dc_1 without f_dc_2; the vertex element has"):
        read_ply(tmp_path / "d.ply")
    table = np.zeros(2, [("x", "f4"), ("y", "f4"), ("z", "f4"), ("red", "u1"), ("green", "u1")])
    plyfile.PlyData([plyfile.PlyElement.describe(table, "vertex")]).write(str(tmp_path / "c.ply"))
    with pytest.raises(ValueError, match="colours: found red, green without blue"):
        read_ply(tmp_path / "c.ply")
