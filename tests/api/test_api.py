"""The public API around the render call: build info, the static forward-info helpers,
device moves, renderer reuse across calls, mode 1, max_num_balls, the small-gamma warning,
Pulsar's signatures."""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from helpers import DEVICES
from scenes import random_scene

import pulsar_py
from pulsar_py import Renderer


def _scene(**kwargs):
    defaults = dict(n_spheres=12, n_track=4, gamma=0.1)
    defaults.update(kwargs)
    return random_scene(11, **defaults)


# ---------------------------------------------------------------------------------------
def test_build_info():
    info = pulsar_py.build_info()
    assert {"version", "backends", "compiler"} <= set(info)
    assert info["version"] == pulsar_py.__version__
    assert isinstance(info["version"], str) and info["version"].count(".") >= 1
    assert "cpu" in info["backends"]
    assert isinstance(info["compiler"], str) and info["compiler"]
    # A copy: callers cannot corrupt it.
    info["backends"] = ()
    assert "cpu" in pulsar_py.build_info()["backends"]


def test_signatures_are_pulsars():
    """Names, order and defaults of Pulsar's constructor and forward."""
    init = inspect.signature(Renderer.__init__).parameters
    expected_init = [
        ("width", None),
        ("height", None),
        ("max_num_balls", None),
        ("orthogonal_projection", False),
        ("right_handed_system", False),
        ("background_normalized_depth", 1e-6),
        ("n_channels", 3),
        ("n_track", 5),
    ]
    names = [n for n in init if n != "self"]
    assert names[: len(expected_init)] == [n for n, _ in expected_init]
    for name, default in expected_init[2:]:
        assert init[name].default == default, name
    fwd = inspect.signature(Renderer.forward).parameters
    expected_fwd = [
        ("vert_pos", None),
        ("vert_col", None),
        ("vert_rad", None),
        ("cam_params", None),
        ("gamma", None),
        ("max_depth", None),
        ("min_depth", 0.0),
        ("bg_col", None),
        ("opacity", None),
        ("percent_allowed_difference", 0.01),
        ("max_n_hits", None),
        ("mode", 0),
        ("return_forward_info", False),
        ("first_R_then_T", False),
    ]
    names = [n for n in fwd if n != "self"]
    assert names[: len(expected_fwd)] == [n for n, _ in expected_fwd]
    for name, default in expected_fwd[6:]:
        assert fwd[name].default == default, name
    assert isinstance(Renderer(4, 4), torch.nn.Module)


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_forward_info_helpers(dtype, device):
    scene = _scene(n_track=6)
    ref = scene.reference()
    renderer = scene.renderer(device)
    _, info = renderer(**scene.call_kwargs(dtype, device), return_forward_info=True)
    ids = Renderer.sphere_ids_from_result_info_nograd(info)
    depth = Renderer.depth_map_from_result_info_nograd(info)
    h, w, k = scene.height, scene.width, scene.n_track
    # Pulsar's shapes: ids always batched ([1, ...] here), the depth map as the info.
    assert ids.shape == (1, h, w, k) and ids.dtype == torch.int32 and ids.device == info.device
    assert depth.shape == (h, w) and depth.dtype == dtype
    ids, depth = ids[0].cpu().long(), depth.cpu().double()
    # Both kinds of pixels occur: empty ones and ones with hits.
    hit_count = ref.hit_count
    assert bool((hit_count == 0).any()) and bool((hit_count > 0).any())
    assert bool((ids == -1).any()) and bool((ids >= 0).any())
    # Empty slots are -1: exactly the slots beyond the pixel's processed hits.
    slot = torch.arange(k)
    assert torch.equal(ids == -1, slot >= hit_count[..., None])
    assert bool((depth[hit_count == 0] == -1).all())
    match = (ids == ref.closest_ids).all(-1)
    assert float(match.double().mean()) >= (1.0 if dtype == torch.float64 else 0.99)
    tol = 1e-12 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(depth[match], ref.closest_depths[..., 0][match], rtol=tol, atol=tol)
    # float32 forward info stores the ids as int32 bits (Pulsar's layout).
    if dtype == torch.float32:
        raw = info[..., 3].contiguous().view(torch.int32).cpu().long()
        assert torch.equal(raw, ids[..., 0])


def test_forward_info_helpers_batched():
    scene = _scene(batch=2)
    _, info = scene.renderer()(**scene.call_kwargs(), return_forward_info=True)
    ids = Renderer.sphere_ids_from_result_info_nograd(info)
    depth = Renderer.depth_map_from_result_info_nograd(info)
    assert ids.shape == (2, scene.height, scene.width, scene.n_track) and ids.dtype == torch.int32
    assert depth.shape == (2, scene.height, scene.width)
    assert not depth.requires_grad and not ids.requires_grad
    for b in range(2):
        ref = scene.item(b).reference()
        assert torch.equal(ids[b].long(), ref.closest_ids)


# ---------------------------------------------------------------------------------------
def test_to_cpu_and_cpu_move_the_renderer():
    scene = _scene()
    renderer = scene.renderer()
    expected = renderer(**scene.call_kwargs())
    assert renderer.to("cpu") is renderer
    assert renderer.cpu() is renderer
    assert renderer.to(torch.device("cpu")) is renderer
    assert renderer.device == torch.device("cpu")
    assert torch.equal(renderer(**scene.call_kwargs()), expected)


def test_device_move_round_trip_on_cuda():
    if "cuda" not in DEVICES:
        pytest.skip("needs CUDA")
    scene = _scene()
    renderer = scene.renderer()
    cpu_image = renderer(**scene.call_kwargs())
    gpu_image = renderer.cuda()(**scene.call_kwargs(device="cuda"))
    assert gpu_image.device.type == "cuda"
    torch.testing.assert_close(gpu_image.cpu(), cpu_image, rtol=1e-10, atol=1e-10)
    assert torch.equal(renderer.cpu()(**scene.call_kwargs()), cpu_image)


@pytest.mark.parametrize("device", DEVICES)
def test_reuse_across_growing_and_shrinking_calls(device):
    """One renderer called with changing sphere counts, batch sizes and dtypes gives what a
    fresh renderer gives for each call (buffers are grown and reused correctly)."""
    renderer = Renderer(24, 18, n_track=5).to(device)
    calls = [
        dict(n_spheres=5),
        dict(n_spheres=60, radius_px=(3, 8)),
        dict(n_spheres=8),
        dict(n_spheres=40, batch=3),
        dict(n_spheres=3),
        dict(n_spheres=25, batch=2, shared_spheres=True),
        dict(n_spheres=1),
    ]
    for i, call in enumerate(calls):
        for dtype in (torch.float64, torch.float32):
            scene = random_scene(40 + i, n_track=5, **call)
            kwargs = scene.call_kwargs(dtype, device)
            image, info = renderer(**kwargs, return_forward_info=True)
            fresh_image, fresh_info = scene.renderer(device)(**kwargs, return_forward_info=True)
            assert torch.equal(image, fresh_image), (call, dtype)
            bits = torch.int32 if dtype == torch.float32 else torch.int64
            assert torch.equal(info.contiguous().view(bits), fresh_info.contiguous().view(bits)), (call, dtype)
            assert bool((info[..., 4] > 0).any()), call  # something is drawn (a closest depth exists)


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_inputs(device):
    scene = _scene()
    kwargs = scene.call_kwargs(device=device)
    renderer = scene.renderer(device)
    expected = renderer(**kwargs)
    strided = dict(kwargs)
    strided["vert_pos"] = kwargs["vert_pos"].t().contiguous().t()
    strided["vert_col"] = torch.stack([kwargs["vert_col"]] * 2, -1)[..., 0]
    strided["cam_params"] = torch.stack([kwargs["cam_params"]] * 2, -1)[:, 1]
    assert not strided["vert_pos"].is_contiguous() and not strided["cam_params"].is_contiguous()
    assert torch.equal(renderer(**strided), expected)


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_mode_1_returns_hit_counts(device):
    scene = _scene(percent_allowed_difference=0.02, n_spheres=25)
    ref = scene.reference()
    renderer = scene.renderer(device)
    kwargs = scene.call_kwargs(device=device)
    kwargs["vert_pos"].requires_grad_(True)
    hits = renderer(**kwargs, mode=1)
    assert hits.shape == (scene.height, scene.width, 1) and hits.dtype == torch.float64
    assert not hits.requires_grad
    assert torch.equal(hits[..., 0].cpu().long(), ref.hit_count)
    assert int(hits.max()) >= 2  # overlaps exist, counts are not just coverage
    hits_b = renderer(**_scene(batch=2).call_kwargs(device=device), mode=1)
    assert hits_b.shape == (2, scene.height, scene.width, 1)
    hits_info, info = renderer(**kwargs, mode=1, return_forward_info=True)
    assert torch.equal(hits_info, hits) and info is None  # as Pulsar: no forward info in mode 1


@pytest.mark.parametrize("device", DEVICES)
def test_max_num_balls(device):
    scene = _scene()  # 12 spheres
    kwargs = scene.call_kwargs(device=device)
    assert scene.renderer(device, max_num_balls=12)(**kwargs).shape[-1] == 3
    with pytest.raises(ValueError, match="max_num_balls"):
        scene.renderer(device, max_num_balls=11)(**kwargs)
    # None (the default) is no limit.
    big = random_scene(5, n_spheres=300, radius_px=(1, 3))
    assert big.renderer(device)(**big.call_kwargs(device=device)).shape == (big.height, big.width, 3)


# ---------------------------------------------------------------------------------------
def _small_gamma_call(renderer, scene, grad_names):
    kwargs = scene.call_kwargs()
    for name in grad_names:
        kwargs[name].requires_grad_(True)
    kwargs["gamma"] = 5e-4
    return renderer(**kwargs)


@pytest.mark.parametrize("grad_name", ["vert_pos", "vert_rad", "cam_params"])
def test_small_gamma_warns_once_with_geometry_gradients(grad_name):
    scene = _scene()
    renderer = scene.renderer()
    with pytest.warns(UserWarning, match="gamma"):
        _small_gamma_call(renderer, scene, [grad_name])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _small_gamma_call(renderer, scene, [grad_name])  # second call: silent


def test_small_gamma_is_silent_without_geometry_gradients():
    scene = _scene()
    renderer = scene.renderer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _small_gamma_call(renderer, scene, [])
        _small_gamma_call(renderer, scene, ["vert_col"])
        with torch.no_grad():
            _small_gamma_call(renderer, scene, ["vert_pos"])
    # ... and it still warns once geometry gradients are asked for.
    with pytest.warns(UserWarning, match="gamma"):
        _small_gamma_call(renderer, scene, ["vert_pos"])
