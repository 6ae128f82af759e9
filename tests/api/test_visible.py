"""Renderer.visible: culling plus a conservative image-bounds test, against what
the native renderer draws.

For every sphere: drawn into some pixel (it appears in the forward info of a renderer
tracking all N hits) => visible; and visible => drawn into an image widened by a margin
of a few pixels on every side (the test is conservative, but not much). Scenes mix
on-screen, off-screen, tiny, near-culled and far-culled spheres.
"""

from __future__ import annotations

import pytest
import torch
from camera_scenes import place_spheres, random_camera
from helpers import DEVICES
from scenes import random_scene

from pulsar_py import Camera, Renderer

F64 = torch.float64
MARGIN_PX = 5  # widening of the image for the converse: just above the largest projected radius


def _drawn(renderer: Renderer, pos, rad, camera, **settings) -> torch.Tensor:
    """bool [B?, N]: spheres that appear in some pixel's forward info (n_track >= N,
    no early termination: every processed hit is listed)."""
    n = pos.shape[-2]
    col = torch.ones(pos.shape[:-1] + (renderer.n_channels,), dtype=pos.dtype, device=pos.device)
    _, info = renderer(pos, col, rad, camera, percent_allowed_difference=0.0, return_forward_info=True, **settings)
    ids = Renderer.sphere_ids_from_result_info_nograd(info).long()
    flat = ids.reshape(ids.shape[0], -1)  # ids are [B, H, W, K], B = 1 for unbatched info
    drawn = torch.zeros(flat.shape[0], n + 1, dtype=torch.bool, device=pos.device)
    drawn.scatter_(1, torch.where(flat < 0, n, flat), True)
    drawn = drawn[:, :n]
    return drawn if info.dim() == 4 else drawn[0]


def _widened(camera: Camera, margin: int) -> Camera:
    """The same camera on an image larger by ``margin`` pixels on every side."""
    height, width = camera.image_size
    return Camera(
        camera.rotation,
        camera.translation,
        camera.fx,
        camera.fy,
        camera.cx + margin,
        camera.cy + margin,
        (height + 2 * margin, width + 2 * margin),
        rotation_repr=camera.rotation_repr,
        orthographic=camera.orthographic,
        right_handed=camera.right_handed,
        film_distance=camera.film_distance,
    )


CASES = {
    "persp": dict(),
    "ortho": dict(orthographic=True),
    "persp_rh_pp": dict(right_handed=True, cam_length=10),
    "ortho_rh_6d_pp": dict(orthographic=True, right_handed=True, cam_length=13),
    "min_depth0": dict(min_depth=0.0),
    "batched": dict(batch=3),
    "shared_spheres": dict(batch=2, shared_spheres=True, cam_length=13),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_visible_brackets_what_is_drawn(name, device):
    # Wide film margin: many spheres off-screen; tiny and culled ones too.
    scene = random_scene(
        700 + list(CASES).index(name),
        n_spheres=40,
        n_tiny=8,
        n_culled=6,
        film_margin=0.6,
        radius_px=(0.8, 4.0),
        **CASES[name],
    )
    renderer = scene.renderer(device, n_track=scene.vert_pos.shape[-2])
    t = scene.tensors(F64, device)
    settings = dict(gamma=scene.gamma, max_depth=scene.max_depth, min_depth=scene.min_depth)
    visible = renderer.visible(
        t["vert_pos"], t["vert_rad"], t["cam_params"], max_depth=scene.max_depth, min_depth=scene.min_depth
    )
    drawn = _drawn(renderer, t["vert_pos"], t["vert_rad"], t["cam_params"], **settings)
    assert visible.dtype == torch.bool and visible.shape == drawn.shape
    assert bool((drawn <= visible).all()), "a drawn sphere was reported invisible"
    # The converse through a Camera on a widened image.
    cams = t["cam_params"] if t["cam_params"].dim() == 2 else t["cam_params"][None]
    camera = Camera.from_params(cams, scene.width, scene.height, scene.orthographic, scene.right_handed)
    if t["cam_params"].dim() == 1:
        camera = camera[0]
    wide = _widened(camera, MARGIN_PX)
    wide_renderer = Renderer(wide.width, wide.height, n_track=scene.vert_pos.shape[-2]).to(device)
    drawn_wide = _drawn(wide_renderer, t["vert_pos"], t["vert_rad"], wide, **settings)
    assert bool((visible <= drawn_wide).all()), "a visible sphere is not drawn even near the image"
    # Camera and camera vectors agree.
    assert torch.equal(
        renderer.visible(t["vert_pos"], t["vert_rad"], camera, max_depth=scene.max_depth, min_depth=scene.min_depth),
        visible,
    )
    # Non-trivial: both kinds occur.
    assert int(visible.sum()) >= 10 and int((~visible).sum()) >= 10


@pytest.mark.parametrize("orthographic", [False, True], ids=["perspective", "orthographic"])
def test_culled_spheres_are_invisible(orthographic):
    camera = random_camera(3, 20, 15, orthographic=orthographic)
    gen = torch.Generator().manual_seed(3)
    pos, rad = place_spheres(camera, gen, 4, depth=(2.0, 3.0), margin=0.0)
    axis = camera.native(20, 15).optical_axis()[0]
    centre = camera.centre()[0]
    pos = torch.stack(
        [
            pos[0],  # in view
            pos[1] + 20.0 * axis,  # beyond max_depth
            centre + 0.4 * rad[2] * axis if not orthographic else pos[2] - 2.5 * axis,  # through near
            centre - (pos[3] - centre),
        ]
    )  # behind the camera (mirrored through the eye)
    renderer = Renderer(20, 15)
    visible = renderer.visible(pos, rad, camera, max_depth=10.0, min_depth=0.5)
    assert visible.tolist() == [True, False, False, False]
    # Without max_depth, only the far one comes back.
    assert renderer.visible(pos, rad, camera, min_depth=0.5).tolist() == [True, True, False, False]


def test_visible_has_no_gradient_and_batch_shapes():
    camera = random_camera(4, 20, 15)
    gen = torch.Generator().manual_seed(4)
    pos, rad = place_spheres(camera, gen, 6, margin=1.0)
    pos.requires_grad_(True)
    renderer = Renderer(20, 15)
    visible = renderer.visible(pos, rad, camera, max_depth=10.0)
    assert visible.shape == (6,) and not visible.requires_grad
    batched = renderer.visible(pos.expand(3, 6, 3), rad.expand(3, 6), camera, max_depth=10.0)
    assert batched.shape == (3, 6) and torch.equal(batched[1], visible)
    with pytest.raises(ValueError, match="vert_rad"):
        renderer.visible(pos, rad[:-1], camera)
