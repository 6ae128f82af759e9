"""Settings as data: the numbers a training loop changes from call to call (gamma,
percent_allowed_difference, the depth range), given as 0-dim tensors or traced by
torch.compile, reach the render operator as its values tensor: an annealed setting neither
recompiles nor breaks the graph, and gives what the same numbers give eagerly."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICES, operator_settings
from scenes import scene_in_front

from pulsar_py import Camera, Renderer, ops

F32 = torch.float32

ANNEALED_GAMMA = [0.3 * 0.8**i for i in range(10)]
ANNEALED_MAX_DEPTH = [30.0 + 0.5 * i for i in range(10)]


def _frames(make_step, gammas, max_depths, dynamic=None):
    """(Dynamo graphs compiled, graph breaks, whether every compiled output and gradient
    equals eager's bit for bit). ``make_step()`` gives (step, leaf): step(gamma,
    max_depth) an output that depends on the leaf."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    step, leaf = make_step()
    compiled = torch.compile(step, dynamic=dynamic)
    equal = True
    for gamma, max_depth in zip(gammas, max_depths):
        results = []
        for fn in (compiled, step):
            out = fn(gamma, max_depth)
            (grad,) = torch.autograd.grad(out, leaf, torch.linspace(0.5, 1.5, out.numel()).reshape(out.shape))
            results.append((out.detach(), grad))
        (a, ga), (b, gb) = results
        equal = equal and torch.equal(a, b) and torch.equal(ga, gb)
    counters = torch._dynamo.utils.counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values()), equal


def _render_step(camera_kind="vectors"):
    def make():
        renderer = Renderer(24, 16)
        pos, col, rad, opa, cam = scene_in_front(0, 60, F32, False)
        camera = cam if camera_kind == "vectors" else Camera.from_params(cam, 24, 16)
        col.requires_grad_()

        def step(gamma, max_depth):
            return renderer(pos, col, rad * 2, camera, gamma, max_depth, opacity=opa)

        return step, col

    return make


@pytest.mark.parametrize("camera_kind", ["vectors", "Camera"])
def test_annealed_tensor_settings_compile_one_frame_with_no_graph_break(camera_kind):
    gammas = [torch.tensor(g) for g in ANNEALED_GAMMA]
    depths = [torch.tensor(d) for d in ANNEALED_MAX_DEPTH]
    assert _frames(_render_step(camera_kind), gammas, depths) == (1, 0, True)


def test_a_tensor_changed_in_place_takes_effect_in_a_compiled_call():
    """The recipe of docs/api.md: one tensor, annealed in place between compiled calls."""
    gamma = torch.tensor(0.3, dtype=torch.float64)  # the value the Python floats below have
    step, _ = _render_step()()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(lambda: step(gamma, 30.0))
    for value in ANNEALED_GAMMA[:4]:
        gamma.fill_(value)
        assert torch.equal(compiled(), step(value, 30.0))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


@pytest.mark.parametrize("dynamic, frames", [(True, 1), (None, 2)])
def test_annealed_float_settings_compile_at_most_the_automatic_dynamic_frames(dynamic, frames):
    """Python numbers of a traced call travel in the values tensor, not the settings, so a
    float annealed over ten steps is never a guarded constant: one frame when compiled
    dynamic; by default torch.compile traces the first call with its numbers as constants
    and the second generically (automatic dynamic), and no step after recompiles."""
    assert _frames(_render_step(), ANNEALED_GAMMA, ANNEALED_MAX_DEPTH, dynamic=dynamic) == (frames, 0, True)


def test_numbers_of_a_traced_call_travel_as_values():
    seen = []
    real = ops.render_call

    def spy(*args):
        seen.append(args[6])
        return real(*args)

    renderer = Renderer(24, 16)
    pos, col, rad, opa, cam = scene_in_front(3, 20, F32, False)
    ops.render_call = spy
    try:
        torch._dynamo.reset()
        torch.compile(lambda: renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa))()
    finally:
        ops.render_call = real
    assert isinstance(seen[0], torch.Tensor) and seen[0].device == pos.device


def test_an_annealed_min_depth_compiles_one_frame():
    renderer = Renderer(24, 16)
    pos, col, rad, opa, cam = scene_in_front(1, 60, F32, False)
    col.requires_grad_()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    compiled = torch.compile(lambda near: renderer(pos, col, rad * 2, cam, 0.1, 30.0, min_depth=near, opacity=opa))
    for near in (0.0, 5.0, 7.0, 8.5):
        got = compiled(torch.tensor(near))
        assert torch.equal(got, renderer(pos, col, rad * 2, cam, 0.1, 30.0, min_depth=near, opacity=opa))
    counters = torch._dynamo.utils.counters
    assert (counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())) == (1, 0)


@pytest.mark.parametrize("camera_kind", ["vectors", "Camera"])
def test_tensor_settings_give_the_numbers_results(camera_kind):
    renderer = Renderer(24, 16)
    pos, col, rad, opa, cam = scene_in_front(2, 80, F32, False)
    camera = cam if camera_kind == "vectors" else Camera.from_params(cam, 24, 16)
    kwargs = dict(opacity=opa)
    numbers = renderer(pos, col, rad * 3, camera, 0.05, 31.0, min_depth=6.0, percent_allowed_difference=0.02, **kwargs)
    tensors = renderer(
        pos,
        col,
        rad * 3,
        camera,
        torch.tensor(0.05),
        torch.tensor([31.0]),
        min_depth=torch.tensor(6.0, dtype=torch.float64),
        percent_allowed_difference=torch.tensor(0.02),
        **kwargs,
    )
    assert torch.equal(numbers, tensors)


def test_numbers_of_an_eager_call_travel_in_the_settings():
    """An eager call with Python numbers makes no values tensor (its host path is the one
    it always was); a tensor setting makes one."""
    seen = []
    real = ops.render_call

    class Spy(Renderer):
        def _render(self, *args):
            seen.append(args[6])
            return super()._render(*args)

    renderer = Spy(24, 16)
    pos, col, rad, opa, cam = scene_in_front(3, 20, F32, False)
    renderer(pos, col, rad, cam, 0.1, 30.0, opacity=opa)
    renderer(pos, col, rad, cam, torch.tensor(0.1), 30.0, opacity=opa)
    assert seen[0] is None
    assert seen[1].dtype == torch.float64 and seen[1].tolist()[: ops.CallValue.COUNT] == pytest.approx(
        [0.1, 0.01, 0.0, 30.0]
    )
    assert ops.render_call is real


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(gamma=torch.tensor(2.0)), "gamma"),
        (dict(gamma=torch.tensor(float("nan"))), "gamma"),
        (dict(percent_allowed_difference=torch.tensor(1.5)), "percent_allowed_difference"),
        (dict(max_depth=torch.tensor(-1.0)), "max_depth"),
        (dict(max_depth=torch.tensor(float("inf"))), "max_depth"),
        (dict(min_depth=torch.tensor(40.0)), "max_depth: expected > min_depth"),
    ],
)
@pytest.mark.parametrize("camera_kind", ["vectors", "Camera"])
def test_tensor_settings_out_of_range_are_refused_naming_them(kwargs, name, camera_kind):
    renderer = Renderer(24, 16)
    pos, col, rad, opa, cam = scene_in_front(0, 20, F32, False)
    camera = cam if camera_kind == "vectors" else Camera.from_params(cam, 24, 16)
    call = {"gamma": 0.1, "max_depth": 30.0, **kwargs}
    with pytest.raises(ValueError, match=name):
        renderer(pos, col, rad, camera, **call)
    renderer.check_values = False  # the settings' values are checked whatever this says
    with pytest.raises(ValueError, match=name):
        renderer(pos, col, rad, camera, **call)


def test_tensor_settings_of_a_wrong_shape_or_dtype_are_refused_naming_them():
    renderer = Renderer(24, 16)
    pos, col, rad, opa, cam = scene_in_front(0, 20, F32, False)
    with pytest.raises(ValueError, match=r"gamma: expected a float or a one-element floating tensor .*\(2,\)"):
        renderer(pos, col, rad, cam, torch.tensor([0.1, 0.2]), 30.0)
    with pytest.raises(TypeError, match="max_depth: expected a float or a one-element floating tensor .*int64"):
        renderer(pos, col, rad, cam, 0.1, torch.tensor(30))


def test_values_of_a_wrong_form_are_refused_by_the_operator():
    pos, col, rad, opa, cam = scene_in_front(0, 20, F32, False)
    settings = operator_settings(gamma=0.0, max_depth=0.0, batch_dim=False).encode()
    with pytest.raises(ValueError, match=r"values: expected a float64 tensor of shape \[4\]"):
        ops.render(pos, col, rad, opa, None, cam[None], torch.tensor([0.1, 0.01, 0.0, 30.0]), settings)
    strided = torch.tensor([0.1, 0, 0.01, 0, 0.0, 0, 30.0, 0], dtype=torch.float64)[::2]
    with pytest.raises(ValueError, match=r"values: expected a contiguous tensor .* strides \(2,\)"):
        ops.render(pos, col, rad, opa, None, cam[None], strided, settings)
    image = ops.render(
        pos, col, rad, opa, None, cam[None], torch.tensor([0.1, 0.01, 0.0, 30.0], dtype=torch.float64), settings
    )[0]
    assert image.shape == (16, 24, 3) and image.isfinite().all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("camera_kind", ["vectors", "Camera"])
def test_values_the_kernels_read_unchecked_give_the_numbers_results_or_nan(device, camera_kind, monkeypatch):
    """Values the host does not read (a CUDA call with value checks off, or captured) reach
    the kernels as they are: the numbers' results bit for bit when in range (the depth
    range of camera vectors and early termination included). Out of range, a NaN image
    and NaN gradients on CUDA; the CPU's native call refuses them."""
    renderer = Renderer(24, 16).to(device)
    renderer.check_values = False  # as a CUDA call that leaves the values to the kernels
    pos, col, rad, opa, cam = (t.to(device) for t in scene_in_front(4, 80, F32, False))
    camera = cam if camera_kind == "vectors" else Camera.from_params(cam, 24, 16)
    col.requires_grad_()

    def render(gamma, percent, near, far):
        image = renderer(pos, col, rad * 3, camera, gamma, far, min_depth=near, percent_allowed_difference=percent)
        return image.detach(), torch.autograd.grad((image * image).sum(), col)[0]

    monkeypatch.setattr(ops, "read_values", lambda *args: False)
    as_tensors = lambda numbers: [torch.tensor(v, dtype=torch.float64) for v in numbers]  # noqa: E731  (exact)
    for numbers in ((0.05, 0.0, 0.0, 31.0), (0.2, 0.02, 6.0, 12.0), (1e-3, 0.1, 7.0, 30.0)):
        want = render(*numbers)
        got = render(*as_tensors(numbers))
        assert want[1].abs().max() > 0
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), numbers
    for bad in ((2.0, 0.0, 0.0, 31.0), (0.1, 1.5, 0.0, 31.0), (0.1, 0.0, 9.0, 8.0), (float("nan"), 0.0, 0.0, 31.0)):
        if device == "cpu":
            with pytest.raises(ValueError, match="values: expected gamma in"):
                render(*as_tensors(bad))
            continue
        image, grad = render(*as_tensors(bad))
        assert image.isnan().all() and grad.isnan().all(), bad
