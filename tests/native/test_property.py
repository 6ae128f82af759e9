"""Property-based tests (hypothesis) over random valid scenes.

Hypothesis draws every option of a scene (image size down to 1x1, sphere count down to
0, channels, projection, handedness, camera vector length, first_R_then_T, opacity,
background, gamma over its whole range, depth range, early termination, hit cap,
n_track, tiny, culled and off-screen spheres, batches) and the seed of
``scenes.random_scene``, which places spheres through the camera so that most scenes draw
something. Properties:

* float64: image, forward info and every gradient equal the reference's (the
  executable spec) to 1e-8 relative;
* float32 (and float64 at the extremes of gamma and radius): outputs and gradients are
  finite, on every device.

Examples are derandomised (the same ones every run) and few, so the file runs in seconds.
"""

from __future__ import annotations

from typing import Dict

import pytest
import torch
from helpers import DEVICES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scenes import Scene, grad_output_like, random_scene

from pulsar_py import Renderer

F64 = torch.float64
GROUPS = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")
UNBATCHED_DIMS = dict(vert_pos=2, vert_col=2, vert_rad=1, opacity=1, bg_col=1, cam_params=1)
COMMON = dict(
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@st.composite
def scene_options(draw, *, extreme: bool = False) -> dict:
    """Keyword arguments of ``random_scene`` (all valid)."""
    batch = draw(st.sampled_from([None, None, None, 2, 3]))
    opts = dict(
        seed=draw(st.integers(0, 2**31 - 1)),
        width=draw(st.integers(1, 24)),
        height=draw(st.integers(1, 20)),
        n_spheres=draw(st.integers(0, 10)),
        n_channels=draw(st.integers(1, 5)),
        orthographic=draw(st.booleans()),
        right_handed=draw(st.booleans()),
        cam_length=draw(st.sampled_from([8, 10, 11, 13])),
        first_R_then_T=draw(st.booleans()),
        with_opacity=draw(st.booleans()),
        with_bg=draw(st.booleans()),
        min_depth=draw(st.sampled_from([None, 0.0])),
        percent_allowed_difference=draw(st.sampled_from([0.0, 0.0, 0.01, 0.1])),
        max_n_hits=draw(st.sampled_from([None, None, 1, 3])),
        n_track=draw(st.integers(1, 8)),
        n_tiny=draw(st.integers(0, 3)),
        n_culled=draw(st.integers(0, 2)),
        film_margin=draw(st.sampled_from([0.0, 0.15, 0.5])),
        batch=batch,
    )
    if extreme:
        opts["gamma"] = draw(st.sampled_from([1e-5, 1e-4, 1.0]))
        low = draw(st.sampled_from([0.3, 1.0, 10.0]))
        opts["radius_px"] = (low, low * draw(st.sampled_from([1.0, 3.0, 30.0])))
        opts["opacity_range"] = draw(st.sampled_from([(0.0, 0.0), (1.0, 1.0), (0.0, 1.0)]))
    else:
        # Well inside the range where reference autograd is exact (gamma >= 1e-3).
        opts["gamma"] = draw(st.floats(1e-2, 1.0))
        opts["radius_px"] = (draw(st.floats(0.5, 4.0)), draw(st.floats(4.0, 9.0)))
        opts["opacity_range"] = (draw(st.floats(0.0, 0.5)), draw(st.floats(0.5, 1.0)))
    if batch is not None:
        opts["shared_spheres"], opts["shared_camera"] = draw(
            st.sampled_from([(False, False), (True, False), (False, True)])
        )
    return opts


def _leaves(scene: Scene, device: str, dtype) -> Dict[str, torch.Tensor]:
    return {k: v.requires_grad_(True) for k, v in scene.tensors(dtype, device).items() if v is not None}


def native(scene: Scene, device: str, dtype):
    """(image, forward info, {group: gradient of sum(image * g)})."""
    renderer = scene.renderer(device)
    leaves = _leaves(scene, device, dtype)
    image, info = renderer(**scene.call_kwargs(tensors={n: leaves.get(n) for n in GROUPS}), return_forward_info=True)
    grads = torch.autograd.grad(image, list(leaves.values()), grad_output_like(image))
    return image.detach(), info, dict(zip(leaves, grads))


def reference(scene: Scene, grad_out: torch.Tensor):
    """(images [B?, H, W, C], {group: gradient}) by autograd through the reference, item by item."""
    leaves = _leaves(scene, "cpu", F64)
    batch = scene.batch_size
    loss, images = 0.0, []
    for b in range(batch or 1):
        item = {
            n: (t[b] if t.dim() > UNBATCHED_DIMS[n] else t) if batch is not None else t
            for n, t in ((n, leaves.get(n)) for n in GROUPS)
            if t is not None
        }
        item.setdefault("opacity", None)
        item.setdefault("bg_col", None)
        ref = (scene.item(b) if batch is not None else scene).reference(item)
        images.append(ref.image.detach())
        loss = loss + (ref.image * (grad_out[b] if batch is not None else grad_out).cpu()).sum()
    if not loss.requires_grad:  # nothing depends on the inputs (no spheres, default background)
        grads = [None] * len(leaves)
    else:
        grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    image = torch.stack(images) if batch is not None else images[0]
    return image, {n: torch.zeros_like(leaves[n]) if g is None else g for n, g in zip(leaves, grads)}


def assert_finite(image, info, grads, dtype) -> None:
    assert bool(torch.isfinite(image).all()), "non-finite image"
    # float32 forward info stores sphere ids as int32 bits (-1 reads as NaN): skip them.
    floats = info if dtype == F64 else torch.cat([info[..., :3], info[..., 4::2]], -1)
    assert bool(torch.isfinite(floats).all()), "non-finite forward info"
    for name, g in grads.items():
        assert bool(torch.isfinite(g).all()), f"{name}: non-finite gradient"


@pytest.mark.parametrize("device", DEVICES)
def test_float64_matches_the_reference(device):
    @settings(max_examples=60, **COMMON)
    @given(opts=scene_options())
    def check(opts):
        scene = random_scene(**opts)
        image, info, grads = native(scene, device, F64)
        assert_finite(image, info, grads, F64)
        ref_image, ref_grads = reference(scene, grad_output_like(image))
        torch.testing.assert_close(image.cpu(), ref_image, rtol=1e-8, atol=1e-10)
        for name, ref_g in ref_grads.items():
            got = grads[name].cpu()
            assert got.shape == ref_g.shape, name
            scale = float(ref_g.abs().max()) if ref_g.numel() else 0.0
            torch.testing.assert_close(got, ref_g, rtol=1e-7, atol=1e-9 * max(scale, 1.0), msg=name)

    check()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [F64, torch.float32], ids=["f64", "f32"])
def test_outputs_and_gradients_are_finite(dtype, device):
    """Also at gamma 1e-5 and 1, opacities exactly 0 or 1, sub-pixel to huge radii."""

    @settings(max_examples=40, **COMMON)
    @given(opts=st.one_of(scene_options(), scene_options(extreme=True)))
    def check(opts):
        scene = random_scene(**opts)
        with torch.autograd.set_grad_enabled(True), _quiet():
            image, info, grads = native(scene, device, dtype)
        assert_finite(image, info, grads, dtype)
        expected_shape = ((scene.batch_size,) if scene.batch_size else ()) + (
            scene.height,
            scene.width,
            scene.n_channels,
        )
        assert tuple(image.shape) == expected_shape
        for name, g in grads.items():
            assert g.shape == getattr(scene, name).shape, name

    check()


@pytest.mark.parametrize("device", DEVICES)
def test_images_stay_in_the_convex_hull_of_colours_and_background(device):
    """The pixel colour is a convex combination of the hit spheres' features and the
    background: each channel lies between their minimum and maximum."""

    @settings(max_examples=30, **COMMON)
    @given(opts=st.one_of(scene_options(), scene_options(extreme=True)))
    def check(opts):
        scene = random_scene(**opts)
        t = scene.tensors(F64, device)
        with _quiet():
            image = scene.renderer(device)(**scene.call_kwargs(tensors=t))
        bg = t["bg_col"] if t["bg_col"] is not None else torch.ones(scene.n_channels, dtype=F64, device=device)
        cols = t["vert_col"].reshape(-1, scene.n_channels)
        low = torch.minimum(cols.min(0).values if cols.numel() else bg, bg)
        high = torch.maximum(cols.max(0).values if cols.numel() else bg, bg)
        flat = image.reshape(-1, scene.n_channels)
        assert bool((flat >= low - 1e-12).all()) and bool((flat <= high + 1e-12).all())

    check()


def _quiet():
    """Silence the small-gamma warning (expected at the extremes)."""
    import warnings

    manager = warnings.catch_warnings()

    class _Ctx:
        def __enter__(self):
            manager.__enter__()
            warnings.simplefilter("ignore", UserWarning)

        def __exit__(self, *exc):
            return manager.__exit__(*exc)

    return _Ctx()


def test_renderer_accepts_its_constructor_range():
    """Constructor arguments drawn over their whole valid range build a working renderer."""

    @settings(max_examples=30, **COMMON)
    @given(
        width=st.integers(1, 40),
        height=st.integers(1, 40),
        n_channels=st.integers(1, 70),
        n_track=st.integers(1, 128),
        beta=st.floats(1e-9, 0.999, exclude_max=True),
        ortho=st.booleans(),
        rh=st.booleans(),
    )
    def check(width, height, n_channels, n_track, beta, ortho, rh):
        renderer = Renderer(
            width,
            height,
            orthogonal_projection=ortho,
            right_handed_system=rh,
            background_normalized_depth=beta,
            n_channels=n_channels,
            n_track=n_track,
        )
        pos = torch.tensor([[0.0, 0.0, 3.0]], dtype=F64)
        col = torch.rand(1, n_channels, dtype=F64, generator=torch.Generator().manual_seed(0))
        rad = torch.tensor([1.0], dtype=F64)
        cam = torch.tensor([0, 0, 0, 0, 0, 0, 0.0 if ortho else 1.0, 2.0], dtype=F64)
        image, info = renderer(pos, col, rad, cam, 0.1, 10.0, return_forward_info=True)
        assert image.shape == (height, width, n_channels) and info.shape == (height, width, 3 + 2 * n_track)
        assert bool(torch.isfinite(image).all())

    check()
