"""Switching from PyTorch3D's Pulsar: its gradient scale on request
(``gradient_scaling="pulsar"``), its state-dict buffer, its forward-info helper shapes
and mode-1 outputs, one-element depth tensors, and the three example loops converging
with Pulsar's learning rates under Pulsar's scale (and not without it)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pulsar_examples
import pytest
import torch
from helpers import spy_camera_conversions
from scenes import scene_in_front

import pulsar_py
from pulsar_py import Renderer

F64 = torch.float64


def _scene(seed: int = 0, n: int = 30, dtype=F64):
    """Leaves requiring grad of a scene in front of the camera (scenes.scene_in_front)."""
    return scene_in_front(seed, n, dtype, requires_grad=True)


def _grads(mode: str, leaves, width=64, height=48, n_track=5, **call):
    """Image, forward info and gradients of (pos, col, rad, opa, cam) for a fixed loss."""
    pos, col, rad, opa, cam = leaves
    renderer = Renderer(width, height, n_track=n_track, gradient_scaling=mode)
    image, info = renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa, return_forward_info=True, **call)
    target = torch.linspace(0, 1, image.numel(), dtype=image.dtype).reshape(image.shape)
    grads = torch.autograd.grad(((image - target) ** 2).sum(), leaves)
    return image.detach(), info, grads


def _tracked_counts(info: torch.Tensor, n: int) -> torch.Tensor:
    """[B, N] pixels per camera whose forward info lists each sphere."""
    ids = Renderer.sphere_ids_from_result_info_nograd(info).long()
    return torch.stack([torch.bincount(i[i >= 0], minlength=n) for i in ids])


# ----------------------------------------------------------------------- gradient scaling
@pytest.mark.parametrize("value", ["Pulsar", "approximate", "", None, 1, True])
def test_gradient_scaling_values_are_checked(value):
    with pytest.raises(ValueError, match="gradient_scaling"):
        Renderer(8, 8, gradient_scaling=value)
    renderer = Renderer(8, 8)
    with pytest.raises(ValueError, match="gradient_scaling"):
        renderer.gradient_scaling = value
    assert renderer.gradient_scaling == "exact"


def test_pulsar_scaling_divides_sphere_gradients_by_their_tracked_pixels():
    pos, col, rad, opa, cam = (t.detach() for t in _scene())
    # A last sphere hidden right behind the first: blended into its pixels, never the closest.
    eye = cam[:3]
    behind = pos[0] + 1.0 * (pos[0] - eye) / (pos[0] - eye).norm()
    pos, rad = torch.cat([pos, behind[None]]), torch.cat([rad, rad[:1] * 0.5])
    col, opa = torch.cat([col, col[:1]]), torch.cat([opa, opa[:1]])
    leaves = [t.requires_grad_() for t in (pos, col, rad, opa, cam)]
    image_exact, info, exact = _grads("exact", leaves, n_track=1)
    image_pulsar, info_pulsar, pulsar = _grads("pulsar", leaves, n_track=1)
    assert torch.equal(image_exact, image_pulsar) and torch.equal(info, info_pulsar)  # forward unchanged
    counts = _tracked_counts(info, leaves[0].shape[0])[0].to(F64)
    tracked = counts > 0
    assert bool(tracked.any()) and bool((~tracked).any())
    for name, e, p in zip(["pos", "col", "rad", "opa"], exact, pulsar):
        per_sphere = counts.reshape((-1,) + (1,) * (e.dim() - 1))
        torch.testing.assert_close(p[tracked] * per_sphere[tracked], e[tracked], rtol=1e-12, atol=1e-15, msg=name)
        # Pulsar gives untracked spheres nothing, though they blend into pixels.
        assert bool((p[~tracked] == 0).all()), name
    assert float(exact[1][~tracked].abs().sum()) > 0


def test_pulsar_scaling_keeps_the_camera_gradient_direction():
    leaves = _scene(seed=1)
    _, _, exact = _grads("exact", leaves)
    _, _, pulsar = _grads("pulsar", leaves)
    factor = float(pulsar[4].norm() / exact[4].norm())
    assert 0 < factor < 1e-3  # Pulsar's camera gradients are far smaller than the exact sum
    torch.testing.assert_close(pulsar[4], exact[4] * factor, rtol=1e-10, atol=1e-15)


def test_pulsar_scaling_converts_camera_vectors_once(monkeypatch):
    """The render and the camera factors share one conversion (pulsar::pack_cameras); the
    render takes the packed cameras."""
    leaves = _scene(seed=3)
    conversions, render_cameras = spy_camera_conversions(monkeypatch)
    _, _, grads = _grads("pulsar", leaves)
    assert (len(conversions), render_cameras) == (1, [15])
    assert float(grads[4].abs().max()) > 0


def _box_extent(centre_px: float, half_px: float, size: int) -> float:
    """Pixel extent of Pulsar's screen box [floor(lo), ceil(hi) + 1) clipped to the image."""
    low = math.floor(max(centre_px - half_px, 0.0))
    high = min(math.ceil(centre_px + half_px) + 1, size)
    return float(high - low)


def test_pulsar_camera_factor_weighs_large_spheres_by_box_area():
    """One large sphere on the optical axis and one sub-pixel sphere between pixel centres:
    factor = 1e-3 * A_large / (M * (n_large + n_small)) with M = 1 + n_small (the small
    sphere counts with its pixels, the large one once)."""
    width, height, focal, sensor = 40, 30, 4.0, 2.0
    step = sensor / width  # world size of a pixel on the sensor
    depth, radius = 10.0, 1.0
    # Small sphere: centre projects half a pixel right and below a pixel centre.
    u_px, v_px = 30.5, 4.5  # film pixel coordinates (pixel (0, 0) centred at 0)
    cx, cy = (width - 1) / 2, (height - 1) / 2
    small_depth, small_radius = 12.0, 0.2 * step * 12.0 / focal  # 0.2 px projected
    small = [(u_px - cx) * step * small_depth / focal, (v_px - cy) * step * small_depth / focal, small_depth]
    pos = torch.tensor([[0.0, 0.0, depth], small], dtype=F64, requires_grad=True)
    col = torch.tensor([[0.2, 0.4, 0.6], [0.9, 0.1, 0.3]], dtype=F64, requires_grad=True)
    rad = torch.tensor([radius, small_radius], dtype=F64, requires_grad=True)
    cam = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, focal, sensor], dtype=F64, requires_grad=True)
    grads = {}
    for mode in ("exact", "pulsar"):
        renderer = Renderer(width, height, gradient_scaling=mode)
        image, info = renderer(pos, col, rad, cam, 0.5, 30.0, return_forward_info=True)
        grads[mode] = torch.autograd.grad(image[..., 0].sum() - image[..., 2].sum(), cam)[0]
    n_large, n_small = (float(c) for c in _tracked_counts(info, 2)[0])
    assert n_large > 9 and n_small >= 1
    half = math.tan(math.asin(radius / depth)) * focal / step  # tangent-cone half extent, pixels
    area = _box_extent(cx, half, width) * _box_extent(cy, half, height)
    expected = 1e-3 * area / ((1 + n_small) * (n_large + n_small))
    torch.testing.assert_close(grads["pulsar"], grads["exact"] * expected, rtol=1e-10, atol=1e-15)


def test_pulsar_scaling_for_a_batch_of_cameras_sharing_spheres():
    pos, col, rad, opa, cam = _scene(seed=2)
    cams = torch.stack([cam.detach(), cam.detach() + torch.tensor([0.3, 0.1, 0.2, 0, 0, 0.05, 0, 0], dtype=F64)])
    cams.requires_grad_()
    leaves = [pos, col, rad, opa, cams]
    _, info, exact = _grads("exact", leaves)
    _, _, pulsar = _grads("pulsar", leaves)
    counts = _tracked_counts(info, pos.shape[0]).sum(0).to(F64)  # over both cameras
    tracked = counts > 0
    torch.testing.assert_close(pulsar[1][tracked] * counts[tracked, None], exact[1][tracked], rtol=1e-12, atol=0)
    # Each camera row has its own factor, the one a call with that camera alone gives.
    for b in range(2):
        one = cams[b].detach().clone().requires_grad_()
        _, _, alone_exact = _grads("exact", [pos, col, rad, opa, one])
        _, _, alone_pulsar = _grads("pulsar", [pos, col, rad, opa, one])
        factor = alone_pulsar[4].norm() / alone_exact[4].norm()
        torch.testing.assert_close(pulsar[4][b], exact[4][b] * factor, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("orthographic", [False, True])
def test_pulsar_scaling_with_a_camera_object(orthographic):
    pos, col, rad, opa, _ = (t.detach() for t in _scene(seed=4))
    eye, target = torch.tensor([0.3, 0.2, 0.0], dtype=F64), torch.tensor([0.0, 0.0, 9.0], dtype=F64)
    extra = dict(fx=6.0) if orthographic else dict(fov_y=40.0)
    grads = {}
    for mode in ("exact", "pulsar"):
        camera = pulsar_py.Camera.look_at(
            eye, target, image_size=(24, 32), orthographic=orthographic, right_handed=False, **extra
        ).requires_grad_()
        image = Renderer(32, 24, gradient_scaling=mode).render(pos, col, rad, camera, 0.1, 30.0, opacity=opa).image
        grads[mode] = torch.cat([g.reshape(-1) for g in torch.autograd.grad(image.square().sum(), camera.parameters())])
    factor = grads["pulsar"].norm() / grads["exact"].norm()
    assert 0 < float(factor) < 1e-2
    torch.testing.assert_close(grads["pulsar"], grads["exact"] * factor, rtol=1e-10, atol=1e-15)


def test_pulsar_scaling_through_render_and_without_gradients():
    pos, col, rad, opa, cam = _scene(seed=3)
    renderer = Renderer(32, 24, gradient_scaling="pulsar")
    result = renderer.render(pos, col, rad, cam, 0.1, 30.0, opacity=opa)
    assert result.forward_info is None  # computed for the scaling, not returned unasked
    (g_pulsar,) = torch.autograd.grad(result.depth.sum() + result.image.sum(), col)
    exact = Renderer(32, 24).render(pos, col, rad, cam, 0.1, 30.0, opacity=opa, return_forward_info=True)
    (g_exact,) = torch.autograd.grad(exact.depth.sum() + exact.image.sum(), col)
    counts = _tracked_counts(exact.forward_info, pos.shape[0])[0].to(F64)
    tracked = counts > 0
    torch.testing.assert_close(g_pulsar[tracked] * counts[tracked, None], g_exact[tracked], rtol=1e-12, atol=0)
    with torch.no_grad():
        assert torch.equal(renderer(pos, col, rad, cam, 0.1, 30.0), Renderer(32, 24)(pos, col, rad, cam, 0.1, 30.0))


def test_pulsar_scaling_under_torch_compile_runs_eagerly_with_the_same_gradients():
    # The scaling fills its factors in after the forward: torch.compile runs it eagerly
    # (torch.compiler.disable, applied at its first call), with eager's values and gradients.
    torch._dynamo.reset()
    renderer = Renderer(32, 24, gradient_scaling="pulsar")

    def image_of(pos, col, rad, opa, cam):
        return renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa)

    compiled = torch.compile(image_of, backend="aot_eager")
    grads = {}
    for name, function in (("eager", image_of), ("compiled", compiled)):
        leaves = [t.detach().clone().requires_grad_() for t in _scene(seed=5)]
        image = function(*leaves)
        grads[name] = (
            image.detach(),
            *torch.autograd.grad((image * torch.linspace(0.5, 1.5, image.numel()).reshape(image.shape)).sum(), leaves),
        )
    assert all(float(g.abs().max()) > 0 for g in grads["eager"][1:])
    for got, want in zip(grads["compiled"], grads["eager"]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


def test_exact_mode_never_reaches_the_scaling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the scaling ran in exact mode")

    monkeypatch.setattr(pulsar_py.renderer, "scaled_render_call", refuse)
    pos, col, rad, opa, cam = _scene()
    renderer = Renderer(16, 12)
    renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa).sum().backward()
    renderer.gradient_scaling = "pulsar"  # switchable between calls
    with pytest.raises(AssertionError, match="scaling ran"):
        renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa)


# ----------------------------------------------------------------------- state dicts
class _PulsarShaped(torch.nn.Module):
    """What a PyTorch3D Pulsar Renderer holds in its state dict: one persistent buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("device_tracker", torch.zeros(1))


class _Model(torch.nn.Module):
    def __init__(self, renderer: torch.nn.Module):
        super().__init__()
        self.weights = torch.nn.Parameter(torch.arange(3.0))
        self.renderer = renderer


def test_state_dict_has_pulsars_buffer():
    state = Renderer(8, 8).state_dict()
    assert list(state) == ["device_tracker"]
    assert state["device_tracker"].shape == (1,) and state["device_tracker"].dtype == torch.float32


def test_docs_name_what_the_state_dict_holds():
    keys = list(Renderer(8, 8).state_dict())
    docs = Path(__file__).resolve().parents[2] / "docs"
    paragraphs = [
        p for page in sorted(docs.glob("*.md")) for p in page.read_text().split("\n\n") if "state_dict()" in p
    ]
    assert paragraphs, "no page documents Renderer.state_dict()"
    for paragraph in paragraphs:
        assert "empty" not in paragraph and all(f"`{key}`" in paragraph for key in keys), paragraph


def test_state_dicts_load_strictly_both_ways():
    ours = _Model(Renderer(8, 8))
    theirs = _Model(_PulsarShaped())
    theirs.weights.data += 1
    ours.load_state_dict(theirs.state_dict(), strict=True)
    assert torch.equal(ours.weights, theirs.weights)
    ours.weights.data *= 2
    theirs.load_state_dict(ours.state_dict(), strict=True)
    assert torch.equal(ours.weights, theirs.weights)
    # A dictionary written out by hand as Pulsar saves it.
    ours.load_state_dict({"weights": torch.ones(3), "renderer.device_tracker": torch.zeros(1)}, strict=True)
    # One saved without the buffer (it carries nothing) loads too.
    Renderer(8, 8).load_state_dict({}, strict=True)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        Renderer(8, 8).load_state_dict({"device_tracker": torch.zeros(1), "other": torch.zeros(1)})


def test_device_follows_the_module():
    renderer = Renderer(8, 8)
    assert renderer.device == torch.device("cpu")
    renderer.cpu()
    assert renderer.device == torch.device("cpu") and renderer.device_tracker.device == torch.device("cpu")
    renderer.load_state_dict({"device_tracker": torch.zeros(1)})
    assert renderer.device == torch.device("cpu")
    assert copy.deepcopy(renderer).device == torch.device("cpu")
    renderer.to("meta")
    assert renderer.device == torch.device("meta")


# ------------------------------------------------------------- Pulsar's shapes and inputs
def test_forward_info_helpers_and_mode_1_have_pulsars_shapes():
    pos, col, rad, opa, cam = (t.detach() for t in _scene())
    renderer = Renderer(20, 16, n_track=4)
    image, info = renderer(pos, col, rad, cam, 0.1, 30.0, return_forward_info=True)
    assert image.shape == (16, 20, 3) and info.shape == (16, 20, 3 + 2 * 4)
    ids = Renderer.sphere_ids_from_result_info_nograd(info)
    assert ids.shape == (1, 16, 20, 4) and ids.dtype == torch.int32
    assert torch.equal(ids[0], info[..., 3::2].round().to(torch.int32))  # [0] is the image, not a row
    assert Renderer.depth_map_from_result_info_nograd(info).shape == (16, 20)
    batched = torch.stack([info, info])
    assert Renderer.sphere_ids_from_result_info_nograd(batched).shape == (2, 16, 20, 4)
    assert Renderer.depth_map_from_result_info_nograd(batched).shape == (2, 16, 20)
    hits, none = renderer(pos, col, rad, cam, 0.1, 30.0, mode=1, return_forward_info=True)
    assert none is None and hits.shape == (16, 20, 1)
    assert torch.equal(hits, renderer(pos, col, rad, cam, 0.1, 30.0, mode=1))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_one_element_depth_tensors_render_as_floats(requires_grad):
    pos, col, rad, opa, cam = (t.detach() for t in _scene())
    renderer = Renderer(24, 16)
    expected = renderer(pos, col, rad, cam, 0.1, 30.0, min_depth=5.0)
    far = torch.tensor([30.0], dtype=F64, requires_grad=requires_grad)
    near = torch.tensor([5.0], dtype=F64, requires_grad=requires_grad)
    image = renderer(pos, col, rad, cam, 0.1, far, min_depth=near)
    if requires_grad:  # the depths stay in the graph (packed cameras)
        torch.testing.assert_close(image, expected, rtol=0, atol=1e-12)
        far_grad, near_grad = torch.autograd.grad(image.sum(), [far, near])
        assert far_grad.shape == (1,) and near_grad.shape == (1,)
    else:
        assert torch.equal(image, expected)


# ------------------------------------------------------------------ the example loops
# Reduced sizes (about a second each on two cores; tests/pulsar_examples.py says how the
# sizes shrink and runs the loops at full size). Without the scaling, the examples' SGD
# learning rates make steps hundreds of times too large: the runs stall or oscillate.
def test_cam_example_converges_with_pulsar_scaling_only():
    pulsar = pulsar_examples.cam_loop(size=100, steps=100)
    assert not pulsar.error and pulsar.converged_ratio < 0.02, pulsar.losses[::10]
    exact = pulsar_examples.cam_loop(size=100, steps=30, gradient_scaling="exact")
    assert exact.converged_ratio > 0.5, exact.losses


def test_optimisation_example_converges_with_pulsar_scaling_only():
    pulsar = pulsar_examples.optimisation_loop(size=200, steps=40)
    assert not pulsar.error and pulsar.converged_ratio < 0.05, pulsar.losses[::5]
    exact = pulsar_examples.optimisation_loop(size=200, steps=40, gradient_scaling="exact")
    assert exact.converged_ratio > 0.1, exact.losses[::5]


def test_multiview_example_converges_with_pulsar_scaling_only():
    pulsar = pulsar_examples.multiview_loop(size=200, steps=15)
    assert not pulsar.error and pulsar.converged_ratio < 0.25, pulsar.losses
    exact = pulsar_examples.multiview_loop(size=200, steps=15, gradient_scaling="exact")
    assert exact.converged_ratio > 0.5, exact.losses
