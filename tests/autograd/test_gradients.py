"""Exact gradients: native backward vs autograd through the reference, and
``torch.autograd.gradcheck`` on the native op, on random scenes covering every option;
no NaN/Inf at the degenerate points; determinism; only requested gradients computed.

Gradients are of L = sum(image * grad_out) for a fixed random grad_out, with respect to
every differentiable input: vert_pos, vert_col, vert_rad, opacity, bg_col, cam_params.
"""

from __future__ import annotations

from typing import Dict, Optional

import pytest
import torch
from helpers import DEVICES
from scenes import Scene, grad_output_like, min_silhouette_distance, random_scene

from pulsar_py import Renderer, ops

GROUPS = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")
F64 = torch.float64
UNBATCHED_DIMS = dict(vert_pos=2, vert_col=2, vert_rad=1, opacity=1, bg_col=1, cam_params=1)


def _leaves(scene: Scene, device: str = "cpu", dtype=F64) -> Dict[str, torch.Tensor]:
    tensors = scene.tensors(dtype, device)
    return {k: v.requires_grad_(True) for k, v in tensors.items() if v is not None}


def native_gradients(
    scene: Scene,
    grad_out: Optional[torch.Tensor] = None,
    device: str = "cpu",
    dtype=F64,
    renderer: Optional[Renderer] = None,
):
    """(image, {group: gradient}) of the native renderer."""
    renderer = renderer or scene.renderer(device)
    leaves = _leaves(scene, device, dtype)
    image = renderer(**scene.call_kwargs(tensors={n: leaves.get(n) for n in GROUPS}))
    grad_out = grad_output_like(image) if grad_out is None else grad_out.to(image)
    grads = torch.autograd.grad(image, list(leaves.values()), grad_out)
    return image, dict(zip(leaves, grads))


def reference_gradients(scene: Scene, grad_out: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Autograd through the reference, item by item for batches (float64, CPU)."""
    leaves = _leaves(scene)
    batch = scene.batch_size
    loss = 0.0
    for b in range(batch or 1):
        item = {}
        for name in GROUPS:
            t = leaves.get(name)
            item[name] = t[b] if (t is not None and t.dim() > UNBATCHED_DIMS[name]) else t
        scene_b = scene.item(b) if batch is not None else scene
        ref = scene_b.reference(item)
        loss = loss + (ref.image * (grad_out[b] if batch is not None else grad_out).cpu()).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return dict(zip(leaves, grads))


def assert_nonzero(grads: Dict[str, torch.Tensor]) -> None:
    for name, g in grads.items():
        assert bool(torch.isfinite(g).all()), f"{name}: non-finite gradient"
        assert float(g.abs().max()) > 0, f"{name}: zero gradient"


# ---------------------------------------------------------------------------------------
# Native backward vs autograd through the reference, 1e-8 relative in float64.
REFERENCE_CASES = {
    "persp": dict(),
    "ortho": dict(orthographic=True),
    "persp_rh_pp10": dict(right_handed=True, cam_length=10),
    "ortho_rh_6d_pp13": dict(orthographic=True, right_handed=True, cam_length=13),
    "persp_6d_RthenT": dict(cam_length=11, first_R_then_T=True),
    "ortho_pp10_RthenT": dict(orthographic=True, cam_length=10, first_R_then_T=True),
    "persp_rh_6d_pp13_RthenT": dict(cam_length=13, first_R_then_T=True, right_handed=True),
    "c1_no_opacity_no_bg": dict(n_channels=1, with_opacity=False, with_bg=False),
    "c8_gamma1": dict(n_channels=8, gamma=1.0),
    "gamma_0.05": dict(gamma=0.05),
    "gamma_0.01_min_depth0": dict(gamma=0.01, min_depth=0.0),
    "min_depth0_6d": dict(min_depth=0.0, cam_length=13, gamma=0.3),
    "ortho_min_depth0": dict(orthographic=True, min_depth=0.0),
    "early_stop": dict(percent_allowed_difference=0.02, n_spheres=25, radius_px=(3, 8)),
    "max_hits_2": dict(max_n_hits=2, n_spheres=20, radius_px=(3, 8)),
    "tiny_and_culled": dict(n_tiny=5, n_culled=2),
    "batched": dict(batch=2, cam_length=13),
    "batched_shared_spheres_ortho": dict(batch=3, shared_spheres=True, orthographic=True, cam_length=10),
    "batched_one_camera_c8": dict(batch=2, shared_camera=True, n_channels=8, right_handed=True),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(REFERENCE_CASES))
def test_native_gradients_match_reference(name, device):
    scene = random_scene(500 + list(REFERENCE_CASES).index(name), **REFERENCE_CASES[name])
    image, native = native_gradients(scene, device=device)
    reference = reference_gradients(scene, grad_output_like(image).cpu())
    assert set(native) == set(reference)
    assert_nonzero(reference)
    for group, ref in reference.items():
        got = native[group].cpu()
        assert got.shape == ref.shape, group
        err = float((got - ref).abs().max()) / float(ref.abs().max())
        assert err <= 1e-8, f"{group}: max abs error {err:.3g} relative to the largest entry"
        # Entry-wise too: small entries are not hidden behind the group's largest.
        torch.testing.assert_close(got, ref, rtol=1e-8, atol=1e-10 * float(ref.abs().max()))


def test_focal_length_gradient_flows_through_min_depth_0():
    """min_depth = 0 means focal + 2e-6: the near plane moves with the focal length, so
    its gradient differs from the one with the same near plane given as a constant."""
    scene = random_scene(77, min_depth=0.0, gamma=0.05)
    focal = float(scene.cam_params[6])
    image_rule, rule = native_gradients(scene)
    const = Scene(**{**scene.__dict__, "min_depth": focal + 2e-6})
    image_const, fixed = native_gradients(const)
    torch.testing.assert_close(image_rule, image_const, rtol=0, atol=1e-12)
    diff = float((rule["cam_params"][6] - fixed["cam_params"][6]).abs())
    assert diff > 1e-3 * float(rule["cam_params"][6].abs()), "focal gradient ignores the near plane"
    # Everything else agrees.
    torch.testing.assert_close(rule["cam_params"][:6], fixed["cam_params"][:6], rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(rule["vert_pos"], fixed["vert_pos"], rtol=1e-10, atol=1e-12)
    # And the reference agrees with the rule's focal gradient.
    ref = reference_gradients(scene, grad_output_like(image_rule))
    torch.testing.assert_close(rule["cam_params"], ref["cam_params"], rtol=1e-8, atol=1e-10)


# ---------------------------------------------------------------------------------------
# torch.autograd.gradcheck on the native op (float64, full Jacobian).
GRADCHECK_CASES = {
    "persp_c3_gamma0.1": dict(),
    "ortho": dict(orthographic=True, gamma=0.2),
    "persp_rh_pp10": dict(right_handed=True, cam_length=10, gamma=0.3),
    "ortho_rh_6d_pp13": dict(orthographic=True, right_handed=True, cam_length=13, gamma=0.5),
    "persp_6d_RthenT_min_depth0": dict(cam_length=11, first_R_then_T=True, min_depth=0.0),
    "persp_rh_6d_pp13_c8_gamma1": dict(cam_length=13, right_handed=True, n_channels=8, gamma=1.0),
    "c1_no_opacity_gamma0.05": dict(n_channels=1, with_opacity=False, gamma=0.05),
    "ortho_c8_no_opacity_pp10": dict(orthographic=True, n_channels=8, with_opacity=False, cam_length=10),
    "batched_persp_6d": dict(batch=2, cam_length=11, gamma=0.2),
    "batched_shared_spheres_ortho_pp": dict(batch=2, shared_spheres=True, orthographic=True, cam_length=10),
}
GRADCHECK_SEEDS = {name: 900 + i for i, name in enumerate(GRADCHECK_CASES)}


def gradcheck_scene(name: str) -> Scene:
    """Few, well-separated mid-size spheres on a small image: the full Jacobian is cheap,
    and no pixel centre lies within the finite-difference step of a silhouette."""
    kwargs = dict(width=12, height=9, n_spheres=5, radius_px=(1.5, 3.5), opacity_range=(0.3, 0.9))
    kwargs.update(GRADCHECK_CASES[name])
    return random_scene(GRADCHECK_SEEDS[name], **kwargs)


def _cam_free_indices(scene: Scene):
    """Entries of cam_params gradcheck perturbs: all but the focal length of an
    orthographic camera (it must stay exactly 0 there)."""
    length = scene.cam_params.shape[-1]
    focal = 9 if length in (11, 13) else 6
    return [i for i in range(length) if not (scene.orthographic and i == focal)]


def _gradcheck_function(scene: Scene, renderer: Renderer, device: str):
    """(f, inputs): f(*inputs) -> image for torch.autograd.gradcheck."""
    leaves = _leaves(scene, device)
    free = _cam_free_indices(scene)
    cam_full = leaves.pop("cam_params").detach()
    leaves["cam_free"] = cam_full[..., free].clone().requires_grad_(True)
    names = list(leaves)
    settings = scene.settings()

    def f(*inputs):
        t = dict(zip(names, inputs))
        cam = cam_full.clone()
        cam[..., free] = t.pop("cam_free")
        return renderer(**{n: t.get(n) for n in GROUPS if n != "cam_params"}, cam_params=cam, **settings)

    return f, [leaves[n] for n in names], names


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(GRADCHECK_CASES))
def test_autograd_gradcheck(name, device):
    scene = gradcheck_scene(name)
    renderer = scene.renderer(device)
    # The scene is away from the kinks of kappa at silhouettes: an eps = 1e-6 step moves a
    # silhouette by at most ~1e-5 of its radius (rotations: eps * distance / radius).
    for b in range(scene.batch_size or 1):
        item = scene.item(b) if scene.batch_size else scene
        assert min_silhouette_distance(item) > 1e-4
    f, inputs, names = _gradcheck_function(scene, renderer, device)
    image = f(*inputs)
    assert float((image - image.mean()).abs().max().detach()) > 0.05  # not a flat background
    grads = torch.autograd.grad(image, inputs, grad_output_like(image))
    assert_nonzero(dict(zip(names, grads)))
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=False)


def test_gradcheck_detects_a_wrong_gradient():
    """The gradcheck settings above are meaningful: a 1 % error in one input fails them."""
    scene = gradcheck_scene("persp_c3_gamma0.1")
    renderer = scene.renderer()
    f, inputs, names = _gradcheck_function(scene, renderer, "cpu")

    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            return 1.01 * g

    def wrong(*xs):
        xs = list(xs)
        xs[names.index("vert_rad")] = Scale.apply(xs[names.index("vert_rad")])
        return f(*xs)

    assert not torch.autograd.gradcheck(wrong, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, raise_exception=False)


# ---------------------------------------------------------------------------------------
# Degenerate points: finite gradients.
def _axis_scene(orthographic: bool, vert_pos, vert_rad) -> Scene:
    """An unrotated camera at the origin on a 9x7 image with pixel size 1/32 (exact in
    binary): the centre pixel's ray is exactly the optical axis (0, 0, 1)."""
    width, height = 9, 7
    focal = 0.0 if orthographic else 0.25
    cam = torch.tensor([0, 0, 0, 0, 0, 0, focal, width / 32], dtype=F64)
    n = len(vert_rad)
    gen = torch.Generator().manual_seed(0)
    return Scene(
        width=width,
        height=height,
        n_channels=3,
        orthographic=orthographic,
        right_handed=False,
        n_track=3,
        beta=1e-6,
        vert_pos=torch.tensor(vert_pos, dtype=F64),
        vert_col=torch.rand(n, 3, generator=gen, dtype=F64),
        vert_rad=torch.tensor(vert_rad, dtype=F64),
        opacity=torch.full((n,), 0.8, dtype=F64),
        bg_col=torch.tensor([0.1, 0.2, 0.3], dtype=F64),
        cam_params=cam,
        gamma=0.1,
        max_depth=20.0,
        min_depth=0.5,
    )


DEGENERATE = {
    # A perspective ray exactly through a sphere centre (delta = 0 at the centre pixel).
    "persp_ray_through_centre": (False, [[0.0, 0.0, 5.0], [0.3, -0.2, 6.0]], [0.4, 0.3]),
    # Orthographic: the centre pixel's ray is tangent to sphere 0 (l = delta = r, half
    # chord 0), and the ray of pixel (7, 3) passes through its centre.
    "ortho_tangent_and_through_centre": (True, [[3 / 32, 0.0, 2.0], [-2 / 32, 1 / 32, 3.0]], [3 / 32, 2 / 32]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(DEGENERATE))
def test_finite_gradients_at_degenerate_points(name, device):
    scene = _axis_scene(*DEGENERATE[name])
    hits = scene.renderer(device)(**scene.call_kwargs(device=device), mode=1)
    assert int(hits[3, 4, 0]) >= 1  # the degenerate pixel is hit
    image, native = native_gradients(scene, device=device)
    assert_nonzero(native)
    # Where the function is differentiable the values are the reference's (which takes
    # the subgradient 0 at delta = 0 and the inside branch at delta = r, like the native).
    reference = reference_gradients(scene, grad_output_like(image).cpu())
    for group, ref in reference.items():
        torch.testing.assert_close(native[group].cpu(), ref, rtol=1e-8, atol=1e-10 * float(ref.abs().max()))


def test_finite_gradients_for_a_silhouette_through_a_pixel_centre():
    """Perspective: a sphere whose radius equals delta at one pixel (kappa = 0 there)."""
    base = random_scene(31, n_spheres=4)
    from scenes import pixel_deltas

    delta = pixel_deltas(base)
    rad = base.vert_rad.clone()
    rad[0] = delta[0, base.height // 2, base.width // 2]  # sphere 0's silhouette through the centre pixel
    scene = Scene(**{**base.__dict__, "vert_rad": rad})
    image, native = native_gradients(scene)
    assert_nonzero(native)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("where", ["behind_camera", "beyond_far_plane", "off_screen"])
def test_nothing_visible_gives_zero_not_nan(where, device):
    scene = random_scene(41, n_spheres=6)
    pos = scene.vert_pos.clone()
    camera = scene.camera()
    eye = camera.eye[0]
    if where == "behind_camera":
        pos = eye - (pos - eye)
    elif where == "beyond_far_plane":
        pos = eye + (pos - eye) * (3 * scene.max_depth / (pos - eye).norm(dim=-1, keepdim=True))
    else:
        pos = pos + 50.0 * camera.pdx[0] / camera.pdx[0].norm()  # far to the side
    scene = Scene(**{**scene.__dict__, "vert_pos": pos})
    hits = scene.renderer(device)(**scene.call_kwargs(device=device), mode=1)
    assert int(hits.sum()) == 0
    image, native = native_gradients(scene, device=device)
    for name, g in native.items():
        assert bool(torch.isfinite(g).all()), name
    for name in ("vert_pos", "vert_col", "vert_rad", "opacity", "cam_params"):
        assert bool((native[name] == 0).all()), name
    # The background gets its gradient: it is all there is.
    assert float(native["bg_col"].abs().max()) > 0


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=["f64", "f32"])
def test_backward_is_deterministic(dtype, device):
    """Bitwise identical gradients run to run, on a scene large enough for every thread."""
    scene = random_scene(
        61, width=64, height=48, n_spheres=60, radius_px=(2, 9), batch=2, percent_allowed_difference=0.01
    )
    renderer = scene.renderer(device)
    first_image, first = native_gradients(scene, device=device, dtype=dtype, renderer=renderer)
    assert_nonzero(first)
    for _ in range(2):
        image, again = native_gradients(scene, device=device, dtype=dtype, renderer=renderer)
        assert torch.equal(image, first_image)
        for name in first:
            assert torch.equal(again[name], first[name]), name


@pytest.mark.parametrize("device", DEVICES)
def test_only_requested_gradients_are_computed(device, monkeypatch):
    """needs_input_grad reaches the native backward: only the colour gradient is
    allocated and computed (the other gradient pointers are null)."""
    scene = random_scene(71)
    requested = []
    real = ops.native_renderer

    class Spy:
        def __init__(self, native):
            self._native = native

        def forward(self, *args):
            return self._native.forward(*args)

        def backward(self, scene_args, options, args, grads):
            requested.append(
                {
                    n: getattr(grads, n) != 0
                    for n in ("positions", "features", "radii", "opacities", "background", "cameras")
                }
            )
            return self._native.backward(scene_args, options, args, grads)

    monkeypatch.setattr(ops, "native_renderer", lambda *a: Spy(real(*a)))
    tensors = scene.tensors(F64, device)
    tensors["vert_col"].requires_grad_(True)
    image = scene.renderer(device)(**scene.call_kwargs(tensors=tensors))
    (image * grad_output_like(image)).sum().backward()
    assert float(tensors["vert_col"].grad.abs().max()) > 0
    for name in ("vert_pos", "vert_rad", "opacity", "bg_col", "cam_params"):
        assert tensors[name].grad is None, name
    assert requested == [
        dict(positions=False, features=True, radii=False, opacities=False, background=False, cameras=False)
    ]
