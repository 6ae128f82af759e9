"""Renderer.render: image, expected depth, coverage and depth distortion in one
call; batches of up to 64 cameras or scenes; padding with a mask.

* Values against the reference renderer (model.md section 7) and against forward().
* Gradients of losses on depth, coverage and distortion: exact against autograd through
  the reference (float64), and central finite differences (positions, radii, opacity,
  camera vectors and Camera fields), non-zero.
* Batches equal per-item renders (B = 64 included); padded + masked scenes equal the
  unpadded ones, values and gradients, whatever the padding holds.
"""

from __future__ import annotations

import pytest
import torch
from camera_scenes import (
    assert_nonzero,
    fixed_weights,
    gradient_setup,
    place_spheres,
    random_camera,
    sphere_attributes,
    uniform,
)
from helpers import DEVICES, spy_camera_conversions
from scenes import Scene, random_scene

from pulsar_py import Camera, Renderer, RenderResult

F64 = torch.float64
OUTPUTS = ("image", "depth", "coverage", "distortion")
DEPTH_OUTPUTS = ("depth", "coverage", "distortion")

CASES = {
    "persp": dict(),
    "ortho": dict(orthographic=True),
    "persp_rh_pp13": dict(right_handed=True, cam_length=13),
    "min_depth0": dict(min_depth=0.0, gamma=0.05),
    "early_stop": dict(percent_allowed_difference=0.02, n_spheres=20, radius_px=(3, 8)),
    "tiny_and_culled": dict(n_tiny=4, n_culled=2),
    "batched": dict(batch=2, cam_length=10),
    "shared_spheres": dict(batch=3, shared_spheres=True, orthographic=True),
    "one_camera": dict(batch=2, shared_camera=True, right_handed=True),
}


def _render_kwargs(scene: Scene, tensors=None) -> dict:
    kwargs = scene.call_kwargs(tensors=tensors)
    kwargs["camera"] = kwargs.pop("cam_params")
    return kwargs


def _items(scene: Scene):
    return [scene.item(b) for b in range(scene.batch_size)] if scene.batch_size else [scene]


@pytest.mark.parametrize("name", list(CASES))
def test_render_matches_forward_and_reference(name):
    scene = random_scene(300 + list(CASES).index(name), **CASES[name])
    renderer = scene.renderer()
    result = renderer.render(**_render_kwargs(scene), return_forward_info=True)
    assert isinstance(result, RenderResult)
    image, info = renderer(**scene.call_kwargs(), return_forward_info=True)
    hits = renderer(**scene.call_kwargs(), mode=1)
    assert torch.equal(result.image, image)
    assert torch.equal(result.forward_info, info)
    assert torch.equal(result.hit_count, hits[..., 0].to(torch.int32))
    lead = (scene.batch_size,) if scene.batch_size else ()
    for out in DEPTH_OUTPUTS:
        assert getattr(result, out).shape == lead + (scene.height, scene.width), out
    flat = lambda t: t if scene.batch_size else t[None]  # noqa: E731
    for b, item in enumerate(_items(scene)):
        ref = item.reference()
        for out in OUTPUTS:
            torch.testing.assert_close(
                flat(getattr(result, out))[b], getattr(ref, out), rtol=1e-10, atol=1e-10, msg=lambda m: f"{out}: {m}"
            )
        assert float(ref.coverage.max()) > 0.5 and float(ref.distortion.max()) > 0  # overlaps exist
    assert renderer.render(**_render_kwargs(scene)).forward_info is None


GRADIENT_CASES = {
    "persp": dict(),
    "ortho_rh": dict(orthographic=True, right_handed=True),
    "min_depth0_pp": dict(min_depth=0.0, cam_length=13, gamma=0.3),
    "batched": dict(batch=2, cam_length=10),
}
GROUPS = ("vert_pos", "vert_rad", "opacity", "cam_params")
UNBATCHED_DIMS = dict(vert_pos=2, vert_col=2, vert_rad=1, opacity=1, bg_col=1, cam_params=1)


def _depth_loss(result, weights) -> torch.Tensor:
    return sum((getattr(result, out) * weights[out]).sum() for out in DEPTH_OUTPUTS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("name", list(CASES))
def test_render_image_equals_forward_bit_for_bit(name, dtype, device):
    # Without forward_info, render() (depth moments) and forward() (none) run different
    # CUDA forward kernels; the image must not depend on which.
    scene = random_scene(300 + list(CASES).index(name), **CASES[name])
    renderer = scene.renderer(device)
    tensors = scene.tensors(dtype, device)
    result = renderer.render(**_render_kwargs(scene, tensors))
    image = renderer(**scene.call_kwargs(tensors=tensors))
    assert result.image.abs().sum() > 0
    assert torch.equal(result.image, image)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(GRADIENT_CASES))
def test_depth_coverage_distortion_gradients_match_reference(name, device):
    scene = random_scene(350 + list(GRADIENT_CASES).index(name), **GRADIENT_CASES[name])
    shape = ((scene.batch_size,) if scene.batch_size else ()) + (scene.height, scene.width)
    weights = {out: fixed_weights(shape, seed=k) for k, out in enumerate(DEPTH_OUTPUTS)}
    tensors = scene.tensors(F64, device)
    leaves = [tensors[n].requires_grad_(True) for n in GROUPS]
    result = scene.renderer(device).render(**_render_kwargs(scene, tensors))
    grads = torch.autograd.grad(_depth_loss(result, {k: w.to(device) for k, w in weights.items()}), leaves)
    ref_tensors = scene.tensors()
    ref_leaves = [ref_tensors[n].requires_grad_(True) for n in GROUPS]
    loss = 0.0
    for b, item in enumerate(_items(scene)):
        picked = {n: (t[b] if (t is not None and t.dim() > UNBATCHED_DIMS[n]) else t) for n, t in ref_tensors.items()}
        ref = item.reference(picked)
        loss = loss + _depth_loss(ref, {k: (w[b] if scene.batch_size else w) for k, w in weights.items()})
    ref_grads = torch.autograd.grad(loss, ref_leaves)
    assert_nonzero(dict(zip(GROUPS, ref_grads)))
    for group, got, want in zip(GROUPS, grads, ref_grads):
        torch.testing.assert_close(
            got.cpu(), want, rtol=1e-8, atol=1e-10 * float(want.abs().max()), msg=lambda m: f"{group}: {m}"
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("output", DEPTH_OUTPUTS)
def test_depth_outputs_match_finite_differences(output, device):
    """Each output alone, through a Camera (pose and intrinsics) and the spheres."""
    camera, pos, rad, col, opacity = gradient_setup("perspective", "axis_angle", seed=31)
    renderer = Renderer(camera.width, camera.height).to(device)
    weights = fixed_weights((camera.height, camera.width), seed=9, device=device)
    names = ("vert_pos", "vert_rad", "opacity", "rotation", "translation", "fx", "cy")
    col = col.to(device)

    def loss(pos, rad, opacity, rotation, translation, fx, cy):
        cam = Camera(
            rotation,
            translation,
            fx,
            camera.fy[0].to(device),
            camera.cx[0].to(device),
            cy,
            camera.image_size,
            rotation_repr="axis_angle",
        )
        result = renderer.render(pos, col, rad, cam, gamma=0.3, max_depth=8.0, min_depth=0.5, opacity=opacity)
        return (getattr(result, output) * weights).sum()

    inputs = [
        t.detach().clone().to(device).requires_grad_(True)
        for t in (pos, rad, opacity, camera.rotation[0], camera.translation[0], camera.fx[0], camera.cy[0])
    ]
    grads = torch.autograd.grad(loss(*inputs), inputs)
    assert_nonzero(dict(zip(names, grads)))
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)


# ---------------------------------------------------------------------------------------
# Batches.
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["64_cameras_shared_spheres", "64_scenes_one_camera"])
def test_batch_of_64_equals_items(layout, device):
    gen = torch.Generator().manual_seed(64)
    width, height, n = 20, 15, 12
    base = random_camera(9, width, height)
    if layout == "64_cameras_shared_spheres":
        pos, rad = place_spheres(base, gen, n)
        col, opacity = sphere_attributes(gen, n)
        centre = base.centre()[0]
        # 64 look-at cameras around the scene's middle.
        target = pos.mean(0)
        offsets = uniform(gen, -0.3, 0.3, (64, 3))
        camera = Camera.look_at(centre + offsets, target.expand(64, 3), image_size=(height, width), fov_y=60.0)
    else:
        sets = [place_spheres(base, gen, n) for _ in range(64)]
        pos, rad = torch.stack([s[0] for s in sets]), torch.stack([s[1] for s in sets])
        col, opacity = (torch.stack(t) for t in zip(*[sphere_attributes(gen, n) for _ in range(64)]))
        camera = base
    like = dict(device=device)
    renderer = Renderer(width, height).to(device)
    settings = dict(gamma=0.2, max_depth=10.0, min_depth=0.5)
    result = renderer.render(
        pos.to(**like), col.to(**like), rad.to(**like), camera.to(**like), opacity=opacity.to(**like), **settings
    )
    assert result.image.shape == (64, height, width, 3)
    drawn = 0
    for b in range(64):
        cam_b = camera[b] if camera.batched else camera
        pos_b = pos[b] if pos.dim() == 3 else pos
        one = renderer.render(
            pos_b.to(**like),
            (col[b] if col.dim() == 3 else col).to(**like),
            (rad[b] if rad.dim() == 2 else rad).to(**like),
            cam_b.to(**like),
            opacity=(opacity[b] if opacity.dim() == 2 else opacity).to(**like),
            **settings,
        )
        for out in OUTPUTS + ("hit_count",):
            assert torch.equal(getattr(result, out)[b], getattr(one, out)), (b, out)
        drawn += int(one.hit_count.sum() > 0)
    assert drawn >= 60
    assert not torch.equal(result.image[0], result.image[1])


def _padded_batch(seed: int, counts, n_pad: int, batched_cameras: bool):
    """Scenes of different sizes padded to n_pad: the valid spheres of scene b sit at
    random slots (holes included); the padding holds NaN, zero radii, invalid opacity."""
    gen = torch.Generator().manual_seed(seed)
    base = random_camera(seed, 20, 15)
    b_count = len(counts)
    if batched_cameras:
        rotations = torch.stack([base.rotation[0]] * b_count)
        translations = base.translation + uniform(gen, -0.05, 0.05, (b_count, 3))
        camera = Camera(rotations, translations, base.fx, base.fy, base.cx, base.cy, base.image_size)
    else:
        camera = base
    pos = torch.full((b_count, n_pad, 3), float("nan"), dtype=F64)
    rad = torch.zeros(b_count, n_pad, dtype=F64)
    col = torch.full((b_count, n_pad, 3), float("nan"), dtype=F64)
    opacity = torch.full((b_count, n_pad), 7.0, dtype=F64)
    mask = torch.zeros(b_count, n_pad, dtype=torch.bool)
    slots = []
    for b, count in enumerate(counts):
        idx = torch.sort(torch.randperm(n_pad, generator=gen)[:count]).values
        p, r = place_spheres(base, gen, count)
        c, o = sphere_attributes(gen, count)
        pos[b, idx], rad[b, idx], col[b, idx], opacity[b, idx] = p, r, c, o
        mask[b, idx] = True
        slots.append(idx)
    return camera, pos, rad, col, opacity, mask, slots


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batched_cameras", [False, True], ids=["one_camera", "batched_cameras"])
def test_padded_and_masked_equals_unpadded(batched_cameras, device):
    counts = (5, 9, 3)
    camera, pos, rad, col, opacity, mask, slots = _padded_batch(11, counts, 10, batched_cameras)
    renderer = Renderer(20, 15, n_track=4).to(device)
    settings = dict(gamma=0.2, max_depth=10.0, min_depth=0.5, return_forward_info=True)
    leaves = [t.clone().to(device).requires_grad_(True) for t in (pos, rad, col, opacity)]
    cam_leaf = camera.to(device).detach().requires_grad_()
    result = renderer.render(
        leaves[0], leaves[2], leaves[1], cam_leaf, opacity=leaves[3], mask=mask.to(device), **settings
    )
    weights = {out: fixed_weights(getattr(result, out).shape, seed=k, device=device) for k, out in enumerate(OUTPUTS)}
    loss = sum((getattr(result, out) * weights[out]).sum() for out in OUTPUTS)
    grads = torch.autograd.grad(loss, leaves + cam_leaf.parameters())
    cam_grad_sum = [torch.zeros_like(g) for g in grads[4:]]
    ids = Renderer.sphere_ids_from_result_info_nograd(result.forward_info)
    for b, idx in enumerate(slots):
        item_leaves = [t[b, idx].clone().to(device).requires_grad_(True) for t in (pos, rad, col, opacity)]
        cam_b = (camera[b] if batched_cameras else camera).to(device).detach().requires_grad_()
        one = renderer.render(item_leaves[0], item_leaves[2], item_leaves[1], cam_b, opacity=item_leaves[3], **settings)
        for out in OUTPUTS + ("hit_count",):
            torch.testing.assert_close(
                getattr(result, out)[b],
                getattr(one, out),
                rtol=1e-12,
                atol=1e-12,
                msg=lambda m: f"scene {b} {out}: {m}",
            )
        # Forward info: the same hits, ids refer to the padded slots.
        one_ids = Renderer.sphere_ids_from_result_info_nograd(one.forward_info)[0].long()
        mapped = torch.where(one_ids >= 0, idx.to(device)[one_ids.clamp_min(0)], one_ids)
        assert torch.equal(ids[b].long(), mapped)
        assert float(one.hit_count.sum()) > 0
        loss_b = sum((getattr(one, out) * weights[out][b]).sum() for out in OUTPUTS)
        grads_b = torch.autograd.grad(loss_b, item_leaves + cam_b.parameters())
        for name, full, got in zip(("pos", "rad", "col", "opacity"), grads[:4], grads_b[:4]):
            torch.testing.assert_close(full[b, idx], got, rtol=1e-10, atol=1e-13, msg=lambda m: f"{name}: {m}")
            padding = torch.ones(full.shape[1], dtype=torch.bool, device=device)
            padding[idx.to(device)] = False
            assert bool((full[b, padding] == 0).all()), f"{name}: padding got a gradient"
        for k, g in enumerate(grads_b[4:]):
            if batched_cameras:
                torch.testing.assert_close(grads[4 + k][b], g[0], rtol=1e-9, atol=1e-12)
            else:
                cam_grad_sum[k] += g
    if not batched_cameras:  # one camera shared by the scenes: its gradient sums theirs
        for got, want in zip(grads[4:], cam_grad_sum):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert_nonzero({"pos": grads[0], "rad": grads[1], "col": grads[2], "opacity": grads[3], "camera": grads[5]})


@pytest.mark.parametrize("device", DEVICES)
def test_unbatched_mask_with_shared_spheres_and_batched_cameras(device):
    gen = torch.Generator().manual_seed(5)
    base = random_camera(5, 20, 15)
    pos, rad = place_spheres(base, gen, 8)
    col, opacity = sphere_attributes(gen, 8)
    mask = torch.tensor([True, False, True, True, False, True, True, True])
    camera = Camera(
        base.rotation.expand(2, 3, 3),
        base.translation + torch.tensor([[0.0, 0, 0], [0.05, 0, 0]], dtype=F64),
        base.fx,
        base.fy,
        base.cx,
        base.cy,
        base.image_size,
    )
    renderer = Renderer(20, 15).to(device)
    settings = dict(gamma=0.2, max_depth=10.0, min_depth=0.5)
    to = lambda t: t.to(device)  # noqa: E731
    masked = renderer.render(
        to(pos), to(col), to(rad), camera.to(device), opacity=to(opacity), mask=to(mask), **settings
    )
    subset = renderer.render(
        to(pos[mask]), to(col[mask]), to(rad[mask]), camera.to(device), opacity=to(opacity[mask]), **settings
    )
    for out in OUTPUTS + ("hit_count",):
        torch.testing.assert_close(getattr(masked, out), getattr(subset, out), rtol=1e-12, atol=1e-12)
    # Unbatched everything: unbatched outputs.
    single = renderer.render(to(pos), to(col), to(rad), base.to(device), mask=to(mask), **settings)
    assert single.image.shape == (15, 20, 3) and single.depth.shape == (15, 20)


# ---------------------------------------------------------------------------------------
def test_render_errors_name_the_argument():
    camera, pos, rad, col, opacity = gradient_setup("perspective", "matrix")
    renderer = Renderer(camera.width, camera.height)
    kwargs = dict(gamma=0.2, max_depth=10.0, min_depth=0.5)
    n = pos.shape[0]
    cases = [
        (dict(mask=torch.ones(n)), TypeError, "mask: expected dtype torch.bool"),
        (dict(mask=torch.ones(n + 1, dtype=torch.bool)), ValueError, "mask: expected shape"),
        (dict(mask=[True] * n), TypeError, "mask"),
        (dict(sh_degree=4), ValueError, "sh_degree"),
        (dict(sh_degree=1), ValueError, "vert_col: expected"),
        (dict(vert_rad=rad[:-1]), ValueError, "vert_rad"),
        (dict(camera="front"), TypeError, "camera"),
        (dict(camera=camera.to(torch.float32)), TypeError, "camera"),
        (dict(vert_rad=-rad), ValueError, "vert_rad"),
    ]
    for override, error, message in cases:
        args = dict(vert_pos=pos, vert_col=col, vert_rad=rad, camera=camera, **kwargs)
        args.update(override)
        with pytest.raises(error, match=message):
            renderer.render(**args)


# ---------------------------------------------------------------------------------------
# z-depth: the expected depth along the optical axis.
@pytest.mark.parametrize("orthographic", [False, True])
def test_z_depth_is_the_camera_space_z_of_what_a_pixel_sees(orthographic):
    """A small sphere off the axis: at the pixel its centre projects to, z_depth is the
    camera-space z of the near surface along that pixel's ray, while depth is
    the distance along that pixel's ray (longer by 1 / cos of the ray's angle)."""
    H, W = 48, 64
    cam = Camera.look_at(
        torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64),
        torch.tensor([0.0, 0.0, 10.0], dtype=torch.float64),
        image_size=(H, W),
        fov_y=None if orthographic else 70.0,
        fx=8.0 if orthographic else None,
        orthographic=orthographic,
    )
    centre = torch.tensor([[2.2, -1.4, 9.0]], dtype=torch.float64)
    radius = torch.tensor([0.3], dtype=torch.float64)  # over a pixel: the surface, not the tiny-sphere rule
    renderer = Renderer(W, H, n_channels=1, orthogonal_projection=orthographic)
    result = renderer.render(
        centre,
        torch.ones(1, 1, dtype=torch.float64),
        radius,
        cam,
        0.01,
        30.0,
        z_depth=True,
        percent_allowed_difference=0.0,
    )
    uv, z_cam = cam.project(centre)
    i, j = int(round(float(uv[0, 0, 0]))), int(round(float(uv[0, 0, 1])))
    z_cam = z_cam[0]
    assert float(result.coverage[j, i]) > 0.5  # the pixel sees the sphere
    # The ray through the centre meets the surface at distance |c| - r: its z is
    # (|c| - r) z_c / |c| (perspective), z_c - r (orthographic).
    distance = float(centre.norm())
    near_z = float(z_cam[0]) - (0.3 * float(z_cam[0]) / distance if not orthographic else 0.3)
    assert abs(float(result.z_depth[j, i]) - near_z) < 0.02
    if not orthographic:
        assert float(result.depth[j, i]) > float(result.z_depth[j, i]) + 0.1  # an oblique ray
    else:
        torch.testing.assert_close(result.z_depth, result.depth)


def test_z_depth_gradients_match_finite_differences():
    scene = random_scene(31, n_spheres=12, width=20, height=14)
    renderer = scene.renderer()
    kwargs = scene.call_kwargs(torch.float64)
    camera = kwargs.pop("cam_params")
    pos, rad = kwargs.pop("vert_pos"), kwargs.pop("vert_rad")
    for name in ("mode",):
        kwargs.pop(name, None)

    def z_depth(p, r, c):
        return renderer.render(
            p,
            kwargs["vert_col"],
            r,
            c,
            kwargs["gamma"],
            kwargs["max_depth"],
            kwargs["min_depth"],
            opacity=kwargs.get("opacity"),
            percent_allowed_difference=0.0,
            z_depth=True,
        ).z_depth

    inputs = (pos.clone().requires_grad_(), rad.clone().requires_grad_(), camera.clone().requires_grad_())
    value = z_depth(*inputs)
    grads = torch.autograd.grad(
        (value * torch.linspace(0.5, 1.5, value.numel(), dtype=torch.float64).reshape(value.shape)).sum(), inputs
    )
    assert all(float(g.abs().max()) > 0 for g in grads)
    assert torch.autograd.gradcheck(z_depth, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_z_depth_and_the_render_share_one_camera_conversion(monkeypatch):
    """Camera vectors with z_depth: converted once (pulsar::pack_cameras), the render takes
    the packed cameras; image and depth are those of the call without z_depth."""
    scene = random_scene(33, n_spheres=12, width=20, height=14)
    renderer = scene.renderer()
    kwargs = scene.call_kwargs(torch.float64)
    args = [kwargs[n] for n in ("vert_pos", "vert_col", "vert_rad", "cam_params", "gamma", "max_depth", "min_depth")]
    plain = renderer.render(*args, opacity=kwargs.get("opacity"))
    conversions, render_cameras = spy_camera_conversions(monkeypatch)
    result = renderer.render(*args, opacity=kwargs.get("opacity"), z_depth=True)
    assert (len(conversions), render_cameras) == (1, [15])
    assert torch.equal(result.image, plain.image) and torch.equal(result.depth, plain.depth)
    assert result.z_depth is not None and result.z_depth.isfinite().all()
