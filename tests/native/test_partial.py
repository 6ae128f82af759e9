"""The native partial render (RenderOptions::partial), one share holding every sphere: its
state merged alone gives the plain render's image, hits and gradients, on every backend."""

from __future__ import annotations

import pytest
import torch
from helpers import DEVICES
from scenes import grad_output_like, random_scene

import pulsar_py
from pulsar_py import ops

F32, F64 = torch.float32, torch.float64


class _Captured(pulsar_py.Renderer):
    """A Renderer that keeps the render operator's arguments of its last call."""

    def _render(self, *args):
        self.arguments = args
        return super()._render(*args)


def _merge_alone(partial, state, background, bg_exponent):
    """model.md section 5, "Shares", for one share."""
    m, d_share = state[..., 0], state[..., 1]
    background_weight = torch.exp(bg_exponent - m)
    norm_d = d_share + background_weight
    return (partial + background_weight[..., None] * background) / norm_d[..., None], torch.stack((m, norm_d), -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [F64, F32])
@pytest.mark.parametrize("p", [0.0, 0.02])
def test_one_share_merged_alone_is_the_render(device, dtype, p):
    scene = random_scene(5, width=40, height=30, n_spheres=60, radius_px=(3.0, 12.0), percent_allowed_difference=p)
    renderer = _Captured(
        scene.width,
        scene.height,
        n_channels=scene.n_channels,
        n_track=scene.n_track,
        background_normalized_depth=scene.beta,
    ).to(device)
    tensors = scene.tensors(dtype, device)
    for t in tensors.values():
        t.requires_grad_(True)
    image = renderer(**tensors, **scene.settings())
    grad_image = grad_output_like(image)
    want = torch.autograd.grad(image, list(tensors.values()), grad_image)
    args = renderer.arguments
    assert args[6] is None  # the numbers travel in the settings
    settings = args[7]._replace(outputs=args[7].outputs._replace(partial=True))
    with torch.no_grad():
        (partial, state, counts, _, _), call = ops._render_forward(*args[:6], None, settings)
        plain = ops._render_forward(*args[:6], None, args[7])[0]
    tol = 1e-12 if dtype == F64 else 2e-6
    assert (state[..., 1] >= 0).all()
    merged_image, merged_state = _merge_alone(partial, state, tensors["bg_col"].detach(), scene.beta / scene.gamma)
    assert torch.allclose(merged_image, image.detach(), rtol=tol, atol=tol)
    assert torch.equal(counts, plain[2])  # the background's weight counts in the termination rule
    assert torch.equal(state[..., 0], plain[1][..., 0])
    with torch.no_grad():
        operands = ops.BackwardOperands(
            grad_image, None, *args[:7], merged_image, merged_state, counts, None, settings, [True] * 6
        )
        got = ops._render_backward_impl(operands, call=call)
    for name, g, w in zip(tensors, got, want):
        assert w.abs().max() > 0, name
        error = ((g - w).abs().max() / w.abs().max()).item()
        assert error <= (1e-11 if dtype == F64 else 1e-4), f"{name}: {error:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_a_partial_renders_depth_statistics_of_its_share(device):
    """One share's depth statistics, merged alone (docs/model.md section 5, "Shares"), are
    the plain render's: its mean and variance are those of its hits, and its hits' weight
    is its normaliser without the background."""
    scene = random_scene(6, width=40, height=30, n_spheres=60, radius_px=(3.0, 12.0))
    renderer = _Captured(
        scene.width, scene.height, n_channels=scene.n_channels, background_normalized_depth=scene.beta
    ).to(device)
    renderer.render(
        **{k: v for k, v in scene.call_kwargs(F64, device).items() if k != "cam_params"},
        camera=scene.cam_params.to(device),
    )
    args = renderer.arguments
    settings = args[7]
    assert settings.outputs.want_depth_moments
    with torch.no_grad():
        plain = ops._render_forward(*args[:6], None, settings)[0]
        (_, state, _, _, moments), _ = ops._render_forward(
            *args[:6], None, settings._replace(outputs=settings.outputs._replace(partial=True))
        )
    m, d_share = state[..., 0], state[..., 1]
    total = d_share + torch.exp(scene.beta / scene.gamma - m)
    want = plain[4]
    assert (want[..., 0] > 0.1).any()  # the scene covers pixels
    torch.testing.assert_close(d_share / total, want[..., 0], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(moments[..., 1] + moments[..., 3], want[..., 1] + want[..., 3], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(moments[..., 2], want[..., 2], rtol=1e-10, atol=1e-14)
