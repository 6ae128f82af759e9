"""Native renderer vs the pure-PyTorch reference (the executable spec) on random scenes.

Each case is a seeded random scene (tests/scenes.py) exercising some options; together
they cover every option of model.md: projection, handedness, C, opacity, background,
gamma, depth range (min_depth 0 and > 0), early termination, hit cap, n_track, every
cam_params length, first_R_then_T, tiny and culled spheres, off-screen spheres. The image,
the mode-1 hit counts and the forward info (m, D, largest zc, the K closest ids and
depths) are compared.
"""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICES
from scenes import pixel_deltas, random_scene

from pulsar_py import Renderer

# name -> random_scene keyword arguments (the seed is the case's index).
CASES = {
    "persp_default": dict(),
    "ortho": dict(orthographic=True),
    "persp_rh_pp": dict(right_handed=True, cam_length=10),
    "ortho_rh_6d_pp": dict(orthographic=True, right_handed=True, cam_length=13),
    "persp_6d_RthenT": dict(cam_length=11, first_R_then_T=True),
    "persp_rh_6d_pp_RthenT_c8": dict(cam_length=13, first_R_then_T=True, right_handed=True, n_channels=8),
    "c1_no_opacity_no_bg": dict(n_channels=1, with_opacity=False, with_bg=False),
    "c8_gamma1": dict(n_channels=8, gamma=1.0),
    "gamma_1e-3": dict(gamma=1e-3),
    "gamma_1e-2_min_depth0": dict(gamma=1e-2, min_depth=0.0),
    "ortho_min_depth0_gamma_0.3": dict(orthographic=True, min_depth=0.0, gamma=0.3),
    "early_stop_1pct": dict(percent_allowed_difference=0.01, n_spheres=30, radius_px=(3, 8)),
    "early_stop_10pct_gamma0.5": dict(percent_allowed_difference=0.1, gamma=0.5, n_spheres=30, radius_px=(3, 8)),
    "max_hits_1": dict(max_n_hits=1, n_spheres=25, radius_px=(3, 8)),
    "max_hits_3_track16": dict(max_n_hits=3, n_track=16, n_spheres=25, radius_px=(3, 8)),
    "track1": dict(n_track=1, n_spheres=20),
    "track16_dense": dict(n_track=16, n_spheres=40, radius_px=(4, 10)),
    "tiny_persp": dict(n_tiny=8, n_spheres=6),
    "tiny_ortho_pp": dict(orthographic=True, n_tiny=8, n_spheres=6, cam_length=10),
    "culled_persp": dict(n_culled=4),
    "culled_ortho_min_depth0": dict(orthographic=True, n_culled=4, min_depth=0.0),
    "offscreen": dict(film_margin=0.5, radius_px=(4, 9)),
    "ortho_RthenT_pp_early_stop": dict(
        orthographic=True, cam_length=10, first_R_then_T=True, percent_allowed_difference=0.05, n_spheres=25
    ),
    "beta_0.5": dict(beta=0.5, gamma=0.2),
    "ortho_no_opacity_gamma_1e-3_track8": dict(orthographic=True, with_opacity=False, gamma=1e-3, n_track=8),
    "wide_40x30_mixed": dict(
        width=40,
        height=30,
        n_spheres=30,
        n_tiny=4,
        n_culled=2,
        cam_length=13,
        gamma=0.05,
        percent_allowed_difference=0.02,
        max_n_hits=6,
        n_track=3,
    ),
}
SEEDS = {name: 100 + i for i, name in enumerate(CASES)}


def _scene(name):
    return random_scene(SEEDS[name], **CASES[name])


def test_case_list_covers_every_option():
    """The case table itself: every option value the issue lists appears."""
    seen = lambda key, pred: any(pred(c.get(key, DEFAULTS[key])) for c in CASES.values())  # noqa: E731
    DEFAULTS = dict(
        orthographic=False,
        right_handed=False,
        n_channels=3,
        with_opacity=True,
        with_bg=True,
        gamma=0.1,
        min_depth=None,
        percent_allowed_difference=0.0,
        max_n_hits=None,
        n_track=5,
        cam_length=8,
        first_R_then_T=False,
        n_tiny=0,
        n_culled=0,
        film_margin=0.15,
    )
    assert len(CASES) >= 20
    for key, values in dict(
        orthographic=[False, True],
        right_handed=[False, True],
        n_channels=[1, 3, 8],
        with_opacity=[False, True],
        with_bg=[False, True],
        min_depth=[0.0, None],
        max_n_hits=[None, 1],
        n_track=[1, 16],
        cam_length=[8, 10, 11, 13],
        first_R_then_T=[False, True],
    ).items():
        for value in values:
            assert seen(key, lambda v: v == value), (key, value)
    assert seen("gamma", lambda g: g <= 1e-3) and seen("gamma", lambda g: g == 1.0)
    assert seen("percent_allowed_difference", lambda p: p > 0)
    assert seen("n_tiny", lambda n: n > 0) and seen("n_culled", lambda n: n > 0)
    assert seen("film_margin", lambda m: m >= 0.5)


def _check_forward_info(info, ref, dtype, gamma, agree):
    """Forward info [H, W, 3 + 2K] against the reference at the pixels in ``agree``."""
    info = info.cpu().double()
    # Relative precision of depths: float32 loses a few digits in z = o1 - h near silhouettes.
    scale = 1e-12 if dtype == torch.float64 else 1e-4
    m, d, zc = info[..., 0], info[..., 1], info[..., 2]
    # m = o (1 - n) / gamma: an error of one rounding in n is eps / gamma in m.
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(m[agree], ref.max_exponent[agree], rtol=scale, atol=100 * eps / gamma)
    # D: sum of kappa o exp(s - m); kappa = 1 - delta / r carries an absolute rounding error.
    torch.testing.assert_close(d[agree], ref.normaliser[agree], rtol=scale + 100 * eps / gamma, atol=100 * eps)
    torch.testing.assert_close(zc[agree], ref.max_closest_depth[agree], rtol=scale, atol=scale)
    ids = Renderer.sphere_ids_from_result_info_nograd(info.to(dtype))[0].long()
    depths = info[..., 4::2]
    assert ids.shape == ref.closest_ids.shape
    same_ids = (ids == ref.closest_ids).all(-1) & agree
    if dtype == torch.float64:
        assert bool(same_ids[agree].all()), f"{int((~same_ids & agree).sum())} pixels with other closest ids"
    else:
        # float32: two hits at nearly equal depth may swap order.
        assert float(same_ids[agree].double().mean()) >= 0.99
    torch.testing.assert_close(depths[same_ids], ref.closest_depths[same_ids], rtol=scale, atol=scale)
    # Empty slots are (-1, -1) in both.
    assert bool((depths[ids == -1] == -1).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name", list(CASES))
def test_native_matches_reference(name, dtype, device):
    scene = _scene(name)
    ref = scene.reference()  # float64, CPU
    renderer = scene.renderer(device)
    kwargs = scene.call_kwargs(dtype, device)
    image, info = renderer(**kwargs, return_forward_info=True)
    hits = renderer(**kwargs, mode=1)
    assert image.shape == (scene.height, scene.width, scene.n_channels) and image.dtype == dtype
    assert hits.shape == (scene.height, scene.width, 1)
    assert info.shape == (scene.height, scene.width, 3 + 2 * scene.n_track)

    # The scene draws something: a good share of pixels is hit.
    assert float((ref.hit_count > 0).double().mean()) >= 0.25

    hits = hits[..., 0].cpu().long()
    image = image.cpu().double()
    if dtype == torch.float64:
        assert torch.equal(hits, ref.hit_count)
        assert float((image - ref.image).abs().max()) <= 1e-6
        agree = torch.ones_like(hits, dtype=torch.bool)
    else:
        agree = hits == ref.hit_count
        assert float(agree.double().mean()) >= 0.995, f"hit counts differ at {int((~agree).sum())} pixels"
        assert float((image - ref.image).abs().max()) <= 1e-4
    _check_forward_info(info, ref, dtype, scene.gamma, agree)


@pytest.mark.parametrize("name", ["tiny_persp", "tiny_ortho_pp"])
def test_tiny_spheres_are_drawn_by_the_tiny_rule(name):
    """The last 8 spheres are tiny (projected radius < 1 px): they hit pixels their disc
    does not cover, only their centre pixel(s) (model.md section 4), and several do."""
    scene = _scene(name)
    renderer = scene.renderer()
    _, info = renderer(**scene.call_kwargs(), return_forward_info=True)
    ids = Renderer.sphere_ids_from_result_info_nograd(info)[0]
    delta = pixel_deltas(scene)  # [N, H, W] world units
    outside = delta > scene.vert_rad[:, None, None]
    n = scene.vert_pos.shape[0]
    by_rule = [((ids == i).any(-1) & outside[i]) for i in range(n)]
    assert sum(int(m.sum()) for m in by_rule[: n - 8]) == 0  # normal spheres: covered pixels only
    assert sum(1 for m in by_rule[n - 8 :] if bool(m.any())) >= 3
    camera = scene.camera()
    pixel = float(camera.pdx.norm())
    for i in range(n - 8, n):
        if scene.orthographic:
            assert int(by_rule[i].sum()) <= 1  # the pixel containing the centre
            assert bool((delta[i][by_rule[i]] < 0.5 * 2**0.5 * pixel).all())
        else:
            t = float((scene.vert_pos[i] - camera.eye[0]).norm())
            delta_px = delta[i] * float(camera.focal[0]) / (t * pixel)
            assert bool((delta_px[by_rule[i]] < 0.75).all())


@pytest.mark.parametrize("name", ["culled_persp", "culled_ortho_min_depth0"])
def test_culled_spheres_are_not_drawn(name):
    """The last 4 spheres face the image but their closest depth is outside [near, far]."""
    scene = _scene(name)
    camera = scene.camera()
    n = scene.vert_pos.shape[0]
    culled = range(n - 4, n)
    # The scene is what it claims: centres in front of the camera, zc out of range.
    c = scene.vert_pos - camera.eye[0]
    axis_depth = c @ camera.optical_axis()[0]
    zc = (axis_depth if scene.orthographic else c.norm(dim=-1)) - scene.vert_rad
    near = float(camera.focal[0]) + 2e-6 if scene.min_depth == 0 else scene.min_depth
    for i in culled:
        assert float(axis_depth[i]) > near
        assert float(zc[i]) < near or float(zc[i]) > scene.max_depth
    renderer = scene.renderer()
    _, info = renderer(**scene.call_kwargs(), return_forward_info=True)
    ids = Renderer.sphere_ids_from_result_info_nograd(info)
    for i in culled:
        assert not bool((ids == i).any()), f"culled sphere {i} was drawn"
    # Moved into the depth range (same film position), they are drawn.
    t = scene.tensors()
    direction = (
        torch.nn.functional.normalize(c, dim=-1) if not scene.orthographic else camera.optical_axis()[0].expand_as(c)
    )
    target = 0.5 * (near + scene.max_depth) + scene.vert_rad
    current = c.norm(dim=-1) if not scene.orthographic else axis_depth
    for i in culled:
        t["vert_pos"][i] += (target[i] - current[i]) * direction[i]
    _, info = renderer(**scene.call_kwargs(tensors=t), return_forward_info=True)
    ids = Renderer.sphere_ids_from_result_info_nograd(info)
    assert sum(bool((ids == i).any()) for i in culled) >= 3


DEPTH_OUTPUTS = ("depth", "coverage", "distortion")


def test_opacity_gradient_at_opacity_zero_with_the_depth_outputs():
    """A sphere of opacity exactly 0 adds no weight, but its weight's derivative is not 0:
    the gradient of depth, coverage and distortion with respect to its opacity is the
    one-sided derivative (opacities lie in [0, 1]), in the reference as in the native
    renderer (float64)."""
    scene = random_scene(3, n_spheres=10, gamma=0.2, radius_px=(4.0, 9.0))
    t = scene.tensors()
    ids = scene.reference(t).closest_ids
    k = int(torch.bincount(ids[ids >= 0], minlength=10).argmax())  # the sphere seen at the most pixels
    t["opacity"][k] = 0.0
    # Pixels whose other hits have weight: there the depth outputs are smooth in o_k (where
    # sphere k is the only hit, its first weight moves the mean depth from 0 to its own).
    mask = (scene.reference(t).coverage > 0).double()
    weights = {
        out: torch.rand(mask.shape, generator=torch.Generator().manual_seed(j), dtype=torch.float64) * 2 - 1
        for j, out in enumerate(DEPTH_OUTPUTS)
    }

    def loss(result) -> torch.Tensor:
        return sum((getattr(result, out) * weights[out] * mask).sum() for out in DEPTH_OUTPUTS)

    opacity = t["opacity"].requires_grad_()
    (reference,) = torch.autograd.grad(loss(scene.reference(t)), opacity)
    kwargs = scene.call_kwargs(tensors=t)
    kwargs["camera"] = kwargs.pop("cam_params")
    (native,) = torch.autograd.grad(loss(scene.renderer().render(**kwargs)), opacity)

    def at(value: float) -> float:
        moved = {name: (None if v is None else v.detach().clone()) for name, v in t.items()}
        moved["opacity"][k] = value
        with torch.no_grad():
            return float(loss(scene.reference(moved)))

    # One-sided differences, Richardson-extrapolated: 2 D(h / 2) - D(h) cancels the O(h) term.
    h = 1e-6
    one_sided = 2 * (at(h / 2) - at(0.0)) / (h / 2) - (at(h) - at(0.0)) / h
    assert abs(float(native[k])) > 1.0, "the scene must give sphere k's opacity a gradient"
    assert float(reference[k]) == pytest.approx(float(native[k]), rel=1e-9)
    assert float(reference[k]) == pytest.approx(one_sided, rel=1e-5)
    torch.testing.assert_close(reference, native, rtol=1e-9, atol=1e-9 * float(native.abs().max()))
