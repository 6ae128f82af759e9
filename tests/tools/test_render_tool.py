"""pulsar_py.tools.render without files: the fitted camera, the radius estimate, cameras
given three ways."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pulsar_py.cameras.look_at import look_at_params
from pulsar_py.cameras.params import camera_from_params
from pulsar_py.io.ply import PointCloud
from pulsar_py.tools.render import bounding_sphere, estimate_radius, fit_camera, half_angles, render_point_cloud


def _cloud(n=50, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randn(n, 3, generator=gen) * 2
    col = torch.rand(n, 3, generator=gen)
    rad = 0.05 + 0.1 * torch.rand(n, generator=gen)
    opa = torch.rand(n, generator=gen)
    return pos, col, rad, opa


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


def test_render_with_cam_params_and_look_at_agree(tmp_path):
    pos, col, rad, opa = _cloud(100)
    cloud = PointCloud(pos, col, rad, opa)
    eye, target = (0.5, 1.0, 12.0), (0.0, 0.0, 0.0)
    depths = dict(min_depth=2.0, max_depth=20.0)
    # The default field of view: 40 degrees vertically, the sensor (horizontal) 4/3 of that.
    by_eye = render_point_cloud(cloud, 40, 30, eye=eye, target=target, **depths)
    cam = look_at_params(eye, target, sensor_width=2 * np.tan(np.radians(20.0)) * 40 / 30, right_handed=True)
    by_params = render_point_cloud(cloud, 40, 30, cam_params=cam.tolist(), **depths)
    assert torch.allclose(by_eye, by_params, atol=1e-5)
    assert float((by_eye - 1).abs().max()) > 0.5  # something was drawn
    # A horizontal field of view; fov_deg, its former name, warns and gives the same image.
    by_eye = render_point_cloud(cloud, 40, 30, eye=eye, target=target, fov_x_deg=50.0, **depths)
    cam = look_at_params(eye, target, sensor_width=2 * np.tan(np.radians(25.0)), right_handed=True)
    assert torch.allclose(by_eye, render_point_cloud(cloud, 40, 30, cam_params=cam.tolist(), **depths), atol=1e-5)
    with pytest.warns(DeprecationWarning, match="fov_x_deg"):
        assert torch.equal(render_point_cloud(cloud, 40, 30, eye=eye, target=target, fov_deg=50.0, **depths), by_eye)
    with pytest.raises(ValueError, match="fov_y_deg, fov_x_deg"):
        render_point_cloud(cloud, 40, 30, fov_y_deg=40.0, fov_x_deg=50.0)


def test_half_angles_of_either_field_of_view():
    half_h, half_v = half_angles(40, 20, fov_y_deg=40.0)
    assert half_v == pytest.approx(np.radians(20.0)) and np.tan(half_h) == pytest.approx(2 * np.tan(half_v))
    assert half_angles(40, 20, fov_x_deg=np.degrees(2 * half_h)) == pytest.approx((half_h, half_v))
    assert half_angles(40, 20) == half_angles(40, 20, fov_y_deg=40.0)
    with pytest.raises(ValueError, match="fov_x_deg: expected degrees in"):
        half_angles(40, 20, fov_x_deg=180.0)
