"""Edge cases give finite results and finite gradients, on every device and dtype.

Each case is a small hand-built scene at an extreme: no spheres, everything culled, the
camera inside a sphere, a sphere through the near plane, a ray through a sphere's centre,
radii from 1e-6 to 1e4, gamma at both limits, n_track = 128, 64 channels. Every case
checks that the image, the forward info and every gradient are finite; in float64 the
image and the gradients must also equal the reference's (pulsar_py.reference, the
executable spec), and float32 images must agree with it to float32 precision.
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

import pytest
import torch
from helpers import DEVICES
from scenes import Scene, grad_output_like

from pulsar_py import Renderer
from pulsar_py.gradcheck import gradcheck

F64 = torch.float64
GROUPS = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")
DTYPES = [pytest.param(F64, id="f64"), pytest.param(torch.float32, id="f32")]


def make_scene(
    pos,
    rad,
    *,
    focal: float = 0.5,
    sensor: float = 0.5,
    n_channels: int = 3,
    n_track: int = 5,
    gamma: float = 0.1,
    max_depth: float = 20.0,
    min_depth: float = 0.0,
    orthographic: bool = False,
    width: int = 16,
    height: int = 12,
    seed: int = 0,
    cam_position=(0.0, 0.0, 0.0),
) -> Scene:
    """An unrotated camera looking along +z (left-handed) at spheres ``pos`` [N, 3], ``rad`` [N]."""
    pos = torch.tensor(pos, dtype=F64).reshape(-1, 3)
    rad = torch.tensor(rad, dtype=F64).reshape(-1)
    n = pos.shape[0]
    gen = torch.Generator().manual_seed(seed)
    cam = torch.tensor([*cam_position, 0.0, 0.0, 0.0, 0.0 if orthographic else focal, sensor], dtype=F64)
    return Scene(
        width=width,
        height=height,
        n_channels=n_channels,
        orthographic=orthographic,
        right_handed=False,
        n_track=n_track,
        beta=1e-6,
        vert_pos=pos,
        vert_col=torch.rand(n, n_channels, generator=gen, dtype=F64),
        vert_rad=rad,
        opacity=0.3 + 0.6 * torch.rand(n, generator=gen, dtype=F64),
        bg_col=torch.rand(n_channels, generator=gen, dtype=F64),
        cam_params=cam,
        gamma=gamma,
        max_depth=max_depth,
        min_depth=min_depth,
    )


def native_run(
    scene: Scene, device: str, dtype: torch.dtype
) -> Tuple[torch.Tensor, torch.Tensor, Dict[str, torch.Tensor]]:
    """(image, forward info, {group: gradient of sum(image * g)}) on ``device``."""
    renderer = scene.renderer(device)
    leaves = {k: v.requires_grad_(True) for k, v in scene.tensors(dtype, device).items() if v is not None}
    image, info = renderer(**scene.call_kwargs(tensors=leaves), return_forward_info=True)
    grads = torch.autograd.grad(image, list(leaves.values()), grad_output_like(image))
    return image.detach(), info, dict(zip(leaves, grads))


def reference_run(scene: Scene, grad_out: torch.Tensor):
    """(reference result, {group: gradient}) in float64 on the CPU."""
    leaves = {k: v.requires_grad_(True) for k, v in scene.tensors().items() if v is not None}
    ref = scene.reference(leaves)
    grads = torch.autograd.grad((ref.image * grad_out.cpu().double()).sum(), list(leaves.values()), allow_unused=True)
    return ref, {k: (torch.zeros_like(leaves[k]) if g is None else g) for k, g in zip(leaves, grads)}


def check_case(
    scene: Scene,
    device: str,
    dtype: torch.dtype,
    *,
    min_hit_pixels: int = 1,
    nonzero: tuple = ("vert_pos", "vert_col", "bg_col"),
    reference_gradients: bool = True,
) -> Dict[str, torch.Tensor]:
    """Runs the checks every case shares; returns the native gradients.

    ``reference_gradients=False`` checks float64 gradients against finite differences
    (pulsar_py.gradcheck) instead of autograd through the reference.
    """
    image, info, grads = native_run(scene, device, dtype)
    assert image.shape == (scene.height, scene.width, scene.n_channels)
    assert info.shape == (scene.height, scene.width, 3 + 2 * scene.n_track)
    assert bool(torch.isfinite(image).all()), "non-finite image"
    # Forward info: m, D, max zc and the depths are floats; float32 ids are int32 bits.
    floats = torch.cat([info[..., :3], info[..., 4::2]], -1)
    assert bool(torch.isfinite(floats).all()), "non-finite forward info"
    for name, g in grads.items():
        assert g.shape == getattr(scene, name).shape, name
        assert bool(torch.isfinite(g).all()), f"{name}: non-finite gradient"
    for name in nonzero:
        assert float(grads[name].abs().max()) > 0, f"{name}: zero gradient"
    ref, ref_grads = reference_run(scene, grad_output_like(image))
    assert int((ref.hit_count > 0).sum()) >= min_hit_pixels
    if dtype == F64 and not reference_gradients:
        torch.testing.assert_close(image.cpu(), ref.image.detach(), rtol=1e-10, atol=1e-10)
        report = gradcheck(scene.renderer(device), **scene.call_kwargs(F64, device))
        assert report.passed, str(report)
    elif dtype == F64:
        torch.testing.assert_close(image.cpu(), ref.image, rtol=1e-10, atol=1e-10)
        for name, ref_g in ref_grads.items():
            scale = max(float(ref_g.abs().max()), 1e-300)
            torch.testing.assert_close(grads[name].cpu(), ref_g, rtol=1e-7, atol=1e-8 * scale, msg=name)
    else:
        torch.testing.assert_close(image.cpu().double(), ref.image, rtol=0, atol=2e-4)
    return grads


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
def test_no_spheres(batched, dtype, device):
    """N = 0 end to end: the background everywhere, gradient tensors of shape [B?, 0, ...],
    the background's gradient is sum(g), forward info slots empty, render() works."""
    renderer = Renderer(16, 12).to(device)
    lead = (2,) if batched else ()
    like = dict(dtype=dtype, device=device)
    pos = torch.zeros(lead + (0, 3), **like).requires_grad_(True)
    col = torch.zeros(lead + (0, 3), **like).requires_grad_(True)
    rad = torch.zeros(lead + (0,), **like).requires_grad_(True)
    opacity = torch.zeros(lead + (0,), **like).requires_grad_(True)
    bg = torch.tensor([0.1, 0.5, 0.9], **like).requires_grad_(True)
    cam = torch.tensor([0, 0, 0, 0.1, 0.2, 0, 0.5, 0.5], **like).requires_grad_(True)
    image, info = renderer(pos, col, rad, cam, 0.1, 10.0, bg_col=bg, opacity=opacity, return_forward_info=True)
    assert image.shape == lead + (12, 16, 3)
    assert torch.equal(image, bg.detach().expand_as(image))
    ids = Renderer.sphere_ids_from_result_info_nograd(info)
    assert bool((ids == -1).all()) and bool((Renderer.depth_map_from_result_info_nograd(info) == -1).all())
    g = grad_output_like(image)
    grads = torch.autograd.grad(image, [pos, col, rad, opacity, bg, cam], g)
    for leaf, grad in zip([pos, col, rad, opacity], grads):
        assert grad.shape == leaf.shape and grad.numel() == 0
    torch.testing.assert_close(grads[4], g.reshape(-1, 3).sum(0))
    assert bool((grads[5] == 0).all())
    hits = renderer(pos, col, rad, cam, 0.1, 10.0, mode=1)
    assert bool((hits == 0).all())
    result = renderer.render(pos, col, rad, cam, 0.1, 10.0, bg_col=bg)
    assert bool((result.coverage == 0).all()) and bool(torch.isfinite(result.depth).all())
    (result.depth.sum() + result.image.sum()).backward()
    assert pos.grad.shape == pos.shape and bool(torch.isfinite(cam.grad).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("orthographic", [False, True], ids=["persp", "ortho"])
def test_everything_culled(orthographic, dtype, device):
    """Behind the camera, beyond the far plane, through the near plane, off-screen."""
    scene = make_scene(
        [[0, 0, -3.0], [0.2, 0, 30.0], [0, 0.1, 1.2], [40.0, 0, 5.0]],
        [0.5, 1.0, 0.8, 0.5],
        orthographic=orthographic,
        sensor=2.0 if orthographic else 0.5,
        min_depth=1.0,
    )
    grads = check_case(scene, device, dtype, min_hit_pixels=0, nonzero=("bg_col",))
    for name in ("vert_pos", "vert_col", "vert_rad", "opacity", "cam_params"):
        assert bool((grads[name] == 0).all()), name


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("orthographic", [False, True], ids=["persp", "ortho"])
def test_camera_inside_a_sphere(orthographic, dtype, device):
    """A big sphere around the eye (culled: its closest depth is negative) and two seen ones."""
    scene = make_scene(
        [[0.1, 0, 0.3], [0.2, 0.1, 4.0], [-0.3, 0, 6.0]],
        [3.0, 0.8, 1.0],
        orthographic=orthographic,
        sensor=3.0 if orthographic else 0.5,
        min_depth=0.6,
    )
    check_case(scene, device, dtype, min_hit_pixels=20)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("min_depth", [0.0, 2.0])
@pytest.mark.parametrize("orthographic", [False, True], ids=["persp", "ortho"])
def test_sphere_through_the_near_plane(orthographic, min_depth, dtype, device):
    """Sphere 0 straddles the near plane (closest depth < near < centre depth): culled;
    the spheres behind it render and get exact gradients."""
    near = min_depth if min_depth > 0 else (2e-6 if orthographic else 0.5 + 2e-6)
    scene = make_scene(
        [[0.0, 0.05, near + 0.2], [0.2, 0.1, near + 3.0], [-0.3, 0, near + 5.0]],
        [0.5, 0.8, 1.0],
        orthographic=orthographic,
        sensor=3.0 if orthographic else 0.5,
        min_depth=min_depth,
    )
    check_case(scene, device, dtype, min_hit_pixels=20)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("orthographic", [False, True], ids=["persp", "ortho"])
def test_ray_through_a_centre(orthographic, dtype, device):
    """9x7 pixels of 1/32 world units (exact in binary): the centre pixel's ray is the
    optical axis, and passes exactly through the centre of sphere 0 (delta = 0)."""
    if orthographic:
        pos, rad = [[0.0, 0.0, 2.0], [-2 / 32, 1 / 32, 3.0]], [3 / 32, 2 / 32]
    else:
        pos, rad = [[0.0, 0.0, 2.0], [0.3, -0.2, 3.0]], [0.5, 0.4]
    scene = make_scene(pos, rad, orthographic=orthographic, focal=0.25, sensor=9 / 32, width=9, height=7, min_depth=0.5)
    grads = check_case(scene, device, dtype, min_hit_pixels=5)
    assert float(grads["vert_rad"].abs().max()) > 0


RADII = [1e-6, 1e-4, 1e-2, 1.0, 1e2, 1e4]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("radius", RADII, ids=[f"r{r:g}" for r in RADII])
def test_radius_extremes(radius, dtype, device):
    """Sphere 0 has the extreme radius, at a distance where it is large on screen (r >= 1)
    or under one pixel (tiny-sphere rule); sphere 1 is an ordinary sphere."""
    distance = max(4 * radius, 2.0) + radius
    scene = make_scene(
        [[0.3 * radius, 0.0, distance], [0.4, 0.2, 3.0]], [radius, 0.3], max_depth=distance + 2 * radius + 10
    )
    check_case(scene, device, dtype, min_hit_pixels=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gamma", [1e-5, 1.0])
def test_gamma_limits(gamma, dtype, device):
    """At gamma = 1e-5 the blend is nearly hard: geometry gradients are ~0 away from
    silhouettes, colours and background carry the gradient. Its float64 gradients are
    checked by finite differences: autograd through the reference gives NaN there (0 * inf
    in the masked branch of a torch.where; reported)."""
    scene = make_scene([[0.0, 0.0, 3.0], [0.2, 0.1, 3.5], [-0.3, 0.1, 5.0]], [1.0, 0.8, 1.5], gamma=gamma)
    if gamma < 1e-3:
        with pytest.warns(UserWarning, match="gamma"):
            check_case(
                scene, device, dtype, min_hit_pixels=50, nonzero=("vert_col", "bg_col"), reference_gradients=False
            )
    else:
        check_case(scene, device, dtype, min_hit_pixels=50)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_n_track_128(dtype, device):
    """150 overlapping spheres on a 12x9 image: 128 tracked hits per pixel, ids exact."""
    gen = torch.Generator().manual_seed(5)
    n = 150
    pos = torch.stack(
        [
            0.2 * torch.rand(n, generator=gen, dtype=F64) - 0.1,
            0.2 * torch.rand(n, generator=gen, dtype=F64) - 0.1,
            4.0 + 4.0 * torch.rand(n, generator=gen, dtype=F64),
        ],
        -1,
    )
    scene = make_scene(pos.tolist(), [2.5] * n, n_track=128, width=12, height=9, sensor=0.2, gamma=0.5, max_depth=20.0)
    check_case(scene, device, dtype, min_hit_pixels=100)
    image, info, _ = native_run(scene, device, dtype)
    ids = Renderer.sphere_ids_from_result_info_nograd(info)[0].cpu().long()
    assert ids.shape == (9, 12, 128)
    assert bool((ids >= 0).all()), "every pixel has at least 128 hits"
    if dtype == F64:
        ref = scene.reference()
        assert torch.equal(ids, ref.closest_ids)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_64_channels(dtype, device):
    scene = make_scene([[0.0, 0.0, 3.0], [0.2, 0.1, 3.5], [-0.3, 0.1, 5.0]], [1.0, 0.8, 1.5], n_channels=64)
    check_case(scene, device, dtype, min_hit_pixels=50)


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs_are_made_contiguous(device):
    """Strided, transposed and expanded inputs render exactly like contiguous copies."""
    scene = make_scene([[0.0, 0.0, 3.0], [0.2, 0.1, 3.5], [-0.3, 0.1, 5.0]], [1.0, 0.8, 1.5])
    t = scene.tensors(F64, device)
    renderer = scene.renderer(device)
    expected = renderer(**scene.call_kwargs(tensors=t))
    strided = dict(t)
    strided["vert_pos"] = t["vert_pos"].t().contiguous().t()  # column-major
    strided["vert_col"] = torch.stack([t["vert_col"], t["vert_col"]], -1)[..., 0]  # stride 2
    strided["vert_rad"] = torch.stack([t["vert_rad"], t["vert_rad"]], -1)[:, 1]
    strided["opacity"] = t["opacity"].flip(0).flip(0)
    strided["bg_col"] = torch.stack([t["bg_col"], t["bg_col"]], -1)[:, 0]
    strided["cam_params"] = torch.stack([t["cam_params"]] * 3, -1)[:, 2]
    assert not any(v.is_contiguous() for k, v in strided.items() if k not in ("opacity",))
    got = renderer(**scene.call_kwargs(tensors=strided))
    assert torch.equal(got, expected)


BAD_VALUES = {
    "pos_nan": ("vert_pos", (0, 0), math.nan),
    "pos_inf": ("vert_pos", (1, 2), math.inf),
    "rad_nan": ("vert_rad", (0,), math.nan),
    "rad_negative": ("vert_rad", (1,), -0.5),
    "rad_zero": ("vert_rad", (0,), 0.0),
    "opacity_2": ("opacity", (0,), 2.0),
    "opacity_nan": ("opacity", (1,), math.nan),
    "col_nan": ("vert_col", (0, 1), math.nan),
    "bg_inf": ("bg_col", (2,), math.inf),
    "cam_nan": ("cam_params", (0,), math.nan),
    "rotation_nan": ("cam_params", (4,), math.nan),
    "focal_negative": ("cam_params", (6,), -1.0),
    "sensor_zero": ("cam_params", (7,), 0.0),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(BAD_VALUES))
def test_bad_values_with_checks_off_do_not_crash(case, device):
    """check_values = False passes NaN, Inf and out-of-range values to the native code:
    forward and backward must return (garbage in, garbage out, but no crash or hang),
    and the renderer then renders a valid scene exactly as before."""
    scene = make_scene([[0.0, 0.0, 3.0], [0.2, 0.1, 3.5], [-0.3, 0.1, 5.0]], [1.0, 0.8, 1.5])
    renderer = scene.renderer(device)
    good = scene.call_kwargs(F64, device)
    expected = renderer(**good)
    renderer.check_values = False
    name, index, value = BAD_VALUES[case]
    tensors = {k: v.requires_grad_(True) for k, v in scene.tensors(F64, device).items()}
    with torch.no_grad():
        tensors[name][index] = value
    image, info = renderer(**scene.call_kwargs(tensors=tensors), return_forward_info=True)
    hits = renderer(**scene.call_kwargs(tensors=tensors), mode=1)
    assert image.shape == expected.shape and hits.shape == (12, 16, 1)
    grads = torch.autograd.grad(image, list(tensors.values()), torch.ones_like(image))
    assert all(g.shape == t.shape for g, t in zip(grads, tensors.values()))
    assert torch.equal(renderer(**good), expected)
