"""The renderer as PyTorch sees it: torch.library operators that torch.compile and
torch.export trace without graph breaks, with autograd and fake kernels that agree with
eager; settings read at every call; saved tensors in any layout; double backward and
torch.func refused clearly; renderers that copy, pickle and travel to worker processes."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from helpers import operator_settings
from scenes import random_scene, scene_in_front

import pulsar_py
from pulsar_py import Camera, Renderer, ops

F32 = torch.float32


def _inputs(seed: int = 0, n: int = 40, dtype=F32, requires_grad: bool = False):
    """Fresh leaves of a small scene in front of the camera (scenes.scene_in_front)."""
    return scene_in_front(seed, n, dtype, requires_grad)


class ForwardModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.renderer = Renderer(24, 16)

    def forward(self, pos, col, rad, opa, cam):
        return self.renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa)


class RenderModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.renderer = Renderer(24, 16)

    def forward(self, pos, col, rad, opa, cam):
        result = self.renderer.render(pos, col, rad, cam, 0.1, 30.0, opacity=opa)
        return result.image, result.depth, result.coverage


@pytest.mark.parametrize("module_type", [ForwardModule, RenderModule])
def test_dynamo_sees_no_graph_break(module_type):
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(module_type())(*_inputs())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


def _grads(outputs, leaves):
    loss = sum((o * torch.linspace(0.5, 1.5, o.numel()).reshape(o.shape)).sum() for o in outputs)
    return torch.autograd.grad(loss, leaves)


@pytest.mark.parametrize("module_type", [ForwardModule, RenderModule])
def test_compiled_fullgraph_matches_eager_without_recompiling(module_type):
    torch._dynamo.reset()
    module = module_type()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    frames_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for step in range(20):
        leaves = _inputs(seed=step, requires_grad=True)  # fresh allocations, equal shapes
        got = compiled(*leaves)
        got = got if isinstance(got, tuple) else (got,)
        eager_leaves = [t.detach().clone().requires_grad_() for t in leaves]
        want = module(*eager_leaves)
        want = want if isinstance(want, tuple) else (want,)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
        for a, b in zip(_grads(got, leaves), _grads(want, eager_leaves)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # One graph for the 20 calls: no recompilation after the first.
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames_before == 1


def test_compiled_with_inductor_matches_eager():
    torch._dynamo.reset()
    module = ForwardModule()
    compiled = torch.compile(module, fullgraph=True)
    leaves = _inputs(requires_grad=True)
    eager_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    got, want = compiled(*leaves), module(*eager_leaves)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for a, b in zip(_grads((got,), leaves), _grads((want,), eager_leaves)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("module_type", [ForwardModule, RenderModule])
def test_torch_export(module_type):
    module = module_type()
    exported = torch.export.export(module, tuple(_inputs()))
    ops_in_graph = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "pulsar.render.default" in ops_in_graph
    inputs = _inputs(seed=3)
    got = exported.module()(*inputs)
    want = module(*inputs)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_fake_tensors_give_the_output_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    renderer = Renderer(24, 16, n_track=3)
    with FakeTensorMode():
        pos, col, rad, opa, cam = _inputs()
        image, info = renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa, return_forward_info=True)
        result = renderer.render(pos, col, rad, cam[None].expand(2, -1), 0.1, 30.0)
    assert image.shape == (16, 24, 3) and info.shape == (16, 24, 3 + 2 * 3)
    assert result.image.shape == (2, 16, 24, 3) and result.depth.shape == (2, 16, 24)


def test_operators_pass_opcheck():
    """torch.library.opcheck: schema, fake kernel, autograd registration and dispatch of
    the render and camera operators agree."""
    pos, col, rad, opa, cam = _inputs(dtype=torch.float64, requires_grad=True)
    settings = operator_settings(want_forward_info=True, want_depth_moments=True).encode()
    torch.library.opcheck(
        torch.ops.pulsar.render.default,
        (pos, col, rad, opa, None, cam[None], None, settings),
        test_utils=("test_schema", "test_faketensor", "test_autograd_registration"),
    )
    pack = ops.PackSettings(24, 16, False, False, False, 0.0, 30.0).encode()
    torch.library.opcheck(torch.ops.pulsar.pack_cameras.default, (cam[None], pack))


def test_gamma_tensor_changed_in_place_takes_effect():
    renderer = Renderer(24, 16)
    pos, col, rad, opa, cam = _inputs(n=80)
    rad = rad * 3  # overlapping spheres: early termination changes what a pixel processes
    gamma = torch.tensor(1e-3)
    sharp = renderer(pos, col, rad, cam, gamma, 30.0, opacity=opa)
    gamma.fill_(0.5)  # annealed between calls
    soft = renderer(pos, col, rad, cam, gamma, 30.0, opacity=opa)
    assert torch.equal(soft, renderer(pos, col, rad, cam, 0.5, 30.0, opacity=opa))
    assert not torch.equal(sharp, soft)
    percent = torch.tensor(0.0)
    full = renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa, percent_allowed_difference=percent, mode=1)
    percent.fill_(0.5)
    cut = renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa, percent_allowed_difference=percent, mode=1)
    assert torch.equal(
        cut, renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa, percent_allowed_difference=0.5, mode=1)
    )
    assert float(cut.sum()) < float(full.sum())  # fewer hits processed


def test_gamma_parameter_renders_with_a_one_time_warning():
    renderer = Renderer(24, 16)
    pos, col, rad, opa, cam = _inputs()
    gamma = torch.nn.Parameter(torch.tensor(0.1))
    col.requires_grad_()
    with pytest.warns(UserWarning, match="gamma: .*no gradient"):
        image = renderer(pos, col, rad, cam, gamma, 30.0, opacity=opa)
    assert torch.equal(image, renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa))
    image.sum().backward()
    assert gamma.grad is None and col.grad is not None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per renderer
        renderer(pos, col, rad, cam, gamma, 30.0, opacity=opa)


def test_saved_tensors_in_another_layout_give_the_same_gradients():
    """A saved-tensor hook that hands back transposed-then-transposed (non-contiguous)
    copies, negative-bit views of negated tensors, or other dtypes: the operator's
    backward makes them what the native code reads."""
    renderer = Renderer(24, 16)
    leaves = _inputs(requires_grad=True)
    image = renderer(leaves[0], leaves[1], leaves[2], leaves[4], 0.1, 30.0, opacity=leaves[3])
    want = _grads((image,), leaves)

    def pack(t):
        return t

    def unpack(t):
        if t.dim() >= 2:  # the same values in a non-contiguous layout
            return t.detach().transpose(0, 1).contiguous().transpose(0, 1)
        if t.is_floating_point():  # the same values behind a negative bit
            return torch._neg_view(-t.detach())
        return t

    for hooks in [(pack, unpack), (pack, lambda t: t.double() if t.is_floating_point() else t)]:
        leaves2 = [t.detach().clone().requires_grad_() for t in leaves]
        with torch.autograd.graph.saved_tensors_hooks(*hooks):
            image2 = renderer(leaves2[0], leaves2[1], leaves2[2], leaves2[4], 0.1, 30.0, opacity=leaves2[3])
        for a, b in zip(_grads((image2,), leaves2), want):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_negative_bit_inputs_are_read_by_value():
    renderer = Renderer(24, 16)
    pos, col, rad, opa, cam = _inputs()
    want = renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa)
    got = renderer(torch._neg_view(-pos), torch._neg_view(-col), rad, cam, 0.1, 30.0, opacity=opa)
    assert torch.equal(got, want)
    conj = torch.complex(col, torch.zeros_like(col)).conj()  # a conjugate view's real part
    assert torch.equal(renderer(pos, conj.real, rad, cam, 0.1, 30.0, opacity=opa), want)


def test_double_backward_raises_naming_the_renderer():
    renderer = Renderer(24, 16)
    leaves = _inputs(requires_grad=True)
    image = renderer(leaves[0], leaves[1], leaves[2], leaves[4], 0.1, 30.0, opacity=leaves[3])
    grads = torch.autograd.grad(image.square().sum(), leaves, create_graph=True)
    assert float(grads[0].detach().abs().sum()) > 0  # the first-order gradients are there
    with pytest.raises(RuntimeError, match="pulsar_py.Renderer: .*not differentiable"):
        grads[0].sum().backward()


@pytest.mark.parametrize("transform", ["vmap", "grad"])
def test_torch_func_transforms_get_a_clear_error(transform):
    renderer = Renderer(24, 16)
    pos, col, rad, opa, cam = _inputs()
    if transform == "vmap":
        call = lambda: torch.func.vmap(lambda p: renderer(p, col, rad, cam, 0.1, 30.0))(pos[None])  # noqa: E731
    else:
        call = lambda: torch.func.grad(lambda c: renderer(pos, c, rad, cam, 0.1, 30.0).sum())(col)  # noqa: E731
    with pytest.raises(RuntimeError, match="torch.func transforms .* not supported"):
        call()


def _used_renderer():
    renderer = Renderer(24, 16, n_channels=3)
    pos, col, rad, opa, cam = _inputs()
    image = renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa)
    return renderer, image


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.colours = torch.nn.Parameter(_inputs()[1])
        self.renderer, _ = _used_renderer()

    def forward(self):
        pos, _, rad, opa, cam = _inputs()
        return self.renderer(pos, self.colours, rad, cam, 0.1, 30.0, opacity=opa)


def test_copy_pickle_and_torch_save_after_use():
    renderer, image = _used_renderer()
    pos, col, rad, opa, cam = _inputs()
    copied = copy.deepcopy(renderer)
    unpickled = pickle.loads(pickle.dumps(renderer))
    assert copied._renderer_id != renderer._renderer_id != unpickled._renderer_id
    for other in (copied, unpickled):
        assert torch.equal(other(pos, col, rad, cam, 0.1, 30.0, opacity=opa), image)
    model = _Model()
    expected = model()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert torch.equal(loaded(), expected)
    del renderer  # the original's native renderers go with it; the copies keep theirs
    assert torch.equal(copied(pos, col, rad, cam, 0.1, 30.0, opacity=opa), image)


class _Views(torch.utils.data.Dataset):
    def __init__(self, renderer):
        self.renderer = renderer

    def __len__(self):
        return 2

    def __getitem__(self, i):
        pos, col, rad, opa, cam = _inputs(seed=i)
        return self.renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa)


@pytest.mark.slow
def test_spawn_dataloader_workers_render():
    renderer, _ = _used_renderer()
    loader = torch.utils.data.DataLoader(_Views(renderer), batch_size=1, num_workers=1, multiprocessing_context="spawn")
    images = [batch[0] for batch in loader]
    for i, image in enumerate(images):
        pos, col, rad, opa, cam = _inputs(seed=i)
        assert torch.equal(image, renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa))


def test_one_renderer_from_two_threads_is_refused_not_raced():
    """Calls of one renderer must not overlap: an overlapping call raises RuntimeError
    (the other completes correctly); separate renderers run in parallel."""
    import threading

    renderer = Renderer(64, 48, num_threads=1)
    scene = random_scene(5, width=64, height=48, n_spheres=400, radius_px=(3, 9))
    kwargs = scene.call_kwargs(F32)
    want = renderer(**kwargs)
    errors, results = [], []

    def work():
        for _ in range(30):
            try:
                results.append(renderer(**kwargs))
            except RuntimeError as error:
                errors.append(str(error))

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(r, want) for r in results)
    assert len(results) + len(errors) == 90
    assert all("another call of the same renderer" in e for e in errors)


def test_pulsar_camera_and_vectors_take_one_operator():
    """A Camera and camera vectors reach the same operator (packed cameras, or vectors
    converted natively), with the same image for the same camera."""
    renderer = Renderer(24, 16)
    pos, col, rad, opa, cam = _inputs(dtype=torch.float64)
    camera = Camera.from_params(cam, 24, 16)
    calls = []
    real = ops.render_call

    def spy(*args):
        calls.append(args[5].shape[-1])
        return real(*args)

    ops.render_call = spy
    try:
        a = renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa)
        b = renderer(pos, col, rad, camera, 0.1, 30.0, opacity=opa)
    finally:
        ops.render_call = real
    assert calls == [8, 15]
    torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    assert isinstance(pulsar_py.ops.render, torch._ops.OpOverload)
