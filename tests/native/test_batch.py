"""Batches: a batch equals its items rendered one by one; shared spheres equal repeated ones.

Three batch layouts: batched spheres with batched cameras, shared spheres [N, ...] with
batched cameras, batched spheres with one camera. Each item has its own opacities and
colours, so a renderer that used item 0's values for every item fails.
"""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICES
from scenes import grad_output_like, random_scene

B = 3
LAYOUTS = {
    "batched_spheres_batched_cameras": dict(batch=B),
    "shared_spheres_batched_cameras": dict(batch=B, shared_spheres=True),
    "batched_spheres_one_camera": dict(batch=B, shared_camera=True),
}
DIFFERENTIABLE = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")


def _scene(layout: str, **extra):
    kwargs = dict(LAYOUTS[layout], n_spheres=10, cam_length=13, right_handed=True, gamma=0.2)
    kwargs.update(extra)
    return random_scene(7 + len(layout), **kwargs)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32 if t.dtype == torch.float32 else torch.int64)


def _render_all(renderer, scene, kwargs):
    image, info = renderer(**kwargs, return_forward_info=True)
    hits = renderer(**kwargs, mode=1)
    return image, hits, info


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_batch_equals_items(layout, dtype, device):
    scene = _scene(layout)
    renderer = scene.renderer(device)
    image, hits, info = _render_all(renderer, scene, scene.call_kwargs(dtype, device))
    assert image.shape == (B, scene.height, scene.width, scene.n_channels)
    assert hits.shape == (B, scene.height, scene.width, 1)
    assert info.shape == (B, scene.height, scene.width, 3 + 2 * scene.n_track)
    for b in range(B):
        item = scene.item(b)
        assert item.batch_size is None
        image_b, hits_b, info_b = _render_all(renderer, item, item.call_kwargs(dtype, device))
        assert torch.equal(image[b], image_b)
        assert torch.equal(hits[b], hits_b)
        assert torch.equal(_bits(info[b]), _bits(info_b))  # float32 ids are int32 bits (-1 is a NaN)
        assert float((hits_b > 0).double().mean()) >= 0.25  # the item draws something
    # The items differ (their cameras or spheres differ): the batch is not one item repeated.
    assert not torch.equal(image[0], image[1])


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_batch_items_match_reference(layout):
    scene = _scene(layout)
    image = scene.renderer()(**scene.call_kwargs())
    for b in range(B):
        ref = scene.item(b).reference()
        assert float((image[b] - ref.image).abs().max()) <= 1e-10


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_batch_gradients_equal_item_gradients(layout, device):
    """Gradients of a batched call = per-item gradients (summed over items for shared inputs)."""
    scene = _scene(layout)
    renderer = scene.renderer(device)
    inputs = scene.tensors(torch.float64, device)
    for t in inputs.values():
        t.requires_grad_(True)
    image = renderer(**scene.call_kwargs(tensors=inputs))
    grad_out = grad_output_like(image)
    grads = torch.autograd.grad(image, [inputs[k] for k in DIFFERENTIABLE], grad_out)
    batched = dict(zip(DIFFERENTIABLE, grads))

    summed = {k: torch.zeros_like(v) for k, v in batched.items()}
    for b in range(B):
        item = scene.item(b)
        item_inputs = item.tensors(torch.float64, device)
        for t in item_inputs.values():
            t.requires_grad_(True)
        image_b = renderer(**item.call_kwargs(tensors=item_inputs))
        grads_b = torch.autograd.grad(image_b, [item_inputs[k] for k in DIFFERENTIABLE], grad_out[b])
        for name, g in zip(DIFFERENTIABLE, grads_b):
            assert bool(g.abs().sum() > 0), f"{name}: zero gradient for item {b}"
            if batched[name].dim() > g.dim():  # batched input: its slice b
                torch.testing.assert_close(batched[name][b], g, rtol=1e-12, atol=1e-12)
            else:
                summed[name] += g
    for name, g in summed.items():
        if batched[name].dim() == g.dim() and bool(g.abs().sum() > 0):
            torch.testing.assert_close(batched[name], g, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_shared_spheres_equal_repeated_spheres(dtype, device):
    """Spheres [N, ...] with B cameras render and differentiate like the spheres repeated B
    times; the shared spheres' gradient is the sum over the batch of the repeated ones'."""
    scene = _scene("shared_spheres_batched_cameras")
    renderer = scene.renderer(device)
    shared = scene.tensors(dtype, device)
    repeated = dict(shared)
    for name in ("vert_pos", "vert_col", "vert_rad", "opacity"):
        repeated[name] = shared[name][None].repeat_interleave(B, 0).contiguous()
    for t in list(shared.values()) + list(repeated.values()):
        t.requires_grad_(True)
    image_shared = renderer(**scene.call_kwargs(tensors=shared))
    image_repeated = renderer(**scene.call_kwargs(tensors=repeated))
    assert torch.equal(image_shared, image_repeated)

    grad_out = grad_output_like(image_shared)
    names = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")
    g_shared = torch.autograd.grad(image_shared, [shared[k] for k in names], grad_out)
    g_repeated = torch.autograd.grad(image_repeated, [repeated[k] for k in names], grad_out)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    for name, gs, gr in zip(names, g_shared, g_repeated):
        assert bool(gs.abs().sum() > 0), f"{name}: zero gradient"
        expected = gr.sum(0) if gr.dim() > gs.dim() else gr
        if name in ("vert_pos", "vert_col", "vert_rad", "opacity"):
            assert gr.dim() == gs.dim() + 1
            # Every item contributes (the cameras all see the spheres).
            assert all(bool(gr[b].abs().sum() > 0) for b in range(B))
        torch.testing.assert_close(gs, expected, **tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("layout", ["one_view"] + list(LAYOUTS))
def test_cpu_thread_count_invariance(layout, dtype):
    """The CPU backend splits a camera's binning and a sphere set's gradient reduction over
    its workers once the scene is large enough: outputs and gradients are bitwise the
    same for any thread count, with depth ties (duplicated spheres) in the sort."""
    n = 36000
    kwargs = dict(n_spheres=n, width=48, height=40, radius_px=(1.0, 4.0), percent_allowed_difference=0.01)
    scene = random_scene(11, **kwargs) if layout == "one_view" else _scene(layout, **kwargs)
    base = scene.tensors(dtype)
    dim = base["vert_rad"].dim() - 1  # the sphere dimension
    for name in ("vert_pos", "vert_rad"):  # the second half repeats the first: equal depths
        base[name].narrow(dim, n // 2, n // 2).copy_(base[name].narrow(dim, 0, n // 2))
    results = []
    for threads in (1, 2, 7):  # one view: 2 parts; B = 3: 2 parts at 7 threads
        renderer = scene.renderer(num_threads=threads)
        inputs = {k: None if v is None else v.clone().requires_grad_(k in DIFFERENTIABLE) for k, v in base.items()}
        call = scene.call_kwargs(tensors=inputs)
        image, info = renderer(**call, return_forward_info=True)
        hits = renderer(**call, mode=1)
        grads = torch.autograd.grad(image, [inputs[k] for k in DIFFERENTIABLE], grad_output_like(image))
        results.append([image, info, hits, *grads])
    assert bool(results[0][3].abs().sum() > 0)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(_bits(a), _bits(b))
