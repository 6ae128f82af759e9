"""The renderer inside torch.autocast: float32 computation and outputs, gradients equal to
the float32 call's and passed back to low-precision producers; outside autocast a
low-precision argument stays a TypeError naming it."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICES
from scenes import scene_in_front

from pulsar_py import Renderer

LOW = {"cpu": [torch.bfloat16], "cuda": [torch.float16, torch.bfloat16]}


def _setup(device):
    pos, col, rad, opa, cam = (t.to(device) for t in scene_in_front(0, 60, torch.float32, False))
    net = torch.nn.Linear(3, 3).to(device)  # predicts the colours (in low precision under autocast)
    with torch.no_grad():
        net.weight.copy_(torch.eye(3) * 0.9)
        net.bias.fill_(0.05)
    return pos, col, rad, opa, cam, net


def _loss(image):
    weights = torch.linspace(0.5, 1.5, image.numel(), device=image.device).reshape(image.shape)
    return (image * weights).sum()


def _cases(device):
    return [(device, dtype) for dtype in LOW[device]]


@pytest.mark.parametrize("device,dtype", [c for d in DEVICES for c in _cases(d)])
@pytest.mark.parametrize("entry", ["forward", "render"])
def test_autocast_renders_in_float32_with_the_float32_gradients(device, dtype, entry):
    renderer = Renderer(24, 16).to(device)
    pos, col, rad, opa, cam, net = _setup(device)

    def call(colours, positions):
        if entry == "forward":
            return renderer(positions, colours, rad, cam, 0.1, 30.0, opacity=opa)
        return renderer.render(positions, colours, rad, cam, 0.1, 30.0, opacity=opa).image

    positions = pos.clone().requires_grad_()
    with torch.autocast(device_type=device, dtype=dtype):
        colours = net(col)
        assert colours.dtype == dtype  # the producer runs in low precision
        image = call(colours, positions)
    assert image.dtype == torch.float32
    _loss(image).backward()
    # The float32 call on the very colours the network produced.
    reference_colours = colours.detach().float().requires_grad_()
    reference_positions = pos.clone().requires_grad_()
    reference = call(reference_colours, reference_positions)
    _loss(reference).backward()
    assert torch.equal(image.detach(), reference.detach())
    assert torch.equal(positions.grad, reference_positions.grad)
    assert positions.grad.abs().max() > 0
    # The producer's parameters get a gradient through the cast (in their own dtype).
    assert net.weight.grad is not None and net.weight.grad.dtype == torch.float32
    assert net.weight.grad.abs().max() > 0


@pytest.mark.parametrize("device", DEVICES)
def test_visible_under_autocast_equals_float32(device):
    renderer = Renderer(24, 16).to(device)
    pos, col, rad, opa, cam, _ = _setup(device)
    dtype = LOW[device][0]
    with torch.autocast(device_type=device, dtype=dtype):
        got = renderer.visible(pos.to(dtype), rad.to(dtype), cam)
    assert torch.equal(got, renderer.visible(pos.to(dtype).float(), rad.to(dtype).float(), cam))


@pytest.mark.parametrize("device", DEVICES)
def test_low_precision_outside_autocast_is_a_type_error_naming_the_argument(device):
    renderer = Renderer(24, 16).to(device)
    pos, col, rad, opa, cam, _ = _setup(device)
    with pytest.raises(TypeError, match="vert_col: expected dtype float32 or float64, got torch.bfloat16"):
        renderer(pos, col.to(torch.bfloat16), rad, cam, 0.1, 30.0)


@pytest.mark.parametrize("device,dtype", [c for d in DEVICES for c in _cases(d)])
def test_autocast_under_torch_compile_matches_eager(device, dtype):
    renderer = Renderer(24, 16).to(device)
    pos, col, rad, opa, cam, net = _setup(device)

    def step(colours_in, positions):
        with torch.autocast(device_type=device, dtype=dtype):
            return renderer(positions, net(colours_in), rad, cam, 0.1, 30.0, opacity=opa)

    def image_and_gradients(fn):
        positions = pos.clone().requires_grad_()
        net.zero_grad()
        image = fn(col, positions)
        _loss(image).backward()
        return image.detach(), positions.grad, net.weight.grad.clone()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    got, want = image_and_gradients(compiled), image_and_gradients(step)
    assert got[0].dtype == torch.float32
    assert want[1].abs().max() > 0 and want[2].abs().max() > 0
    for g, w in zip(got, want):  # the image, dL/dpositions, dL/d(the producer's weights)
        torch.testing.assert_close(g, w, rtol=0, atol=0)
