"""Bad input raises ValueError or TypeError naming the argument, before any native code.

Each case changes one argument of a valid call (or of the constructor) and checks the
exception type and that its message names the argument. A valid call is checked first,
so a case can only pass by rejecting its own bad value.
"""

from __future__ import annotations

import math

import pytest
import torch

import pulsar_py
from pulsar_py import Renderer

from helpers import DEVICES, HAS_CUDA
from scenes import random_scene

BAD_INPUT = (ValueError, TypeError)


def _valid(device: str = "cpu", dtype=torch.float64, **scene_kwargs):
    scene = random_scene(3, n_spheres=6, width=16, height=12, **scene_kwargs)
    return scene, scene.renderer(device), scene.call_kwargs(dtype, device)


@pytest.mark.parametrize("device", DEVICES)
def test_the_valid_call_works(device):
    _, renderer, kwargs = _valid(device)
    image = renderer(**kwargs)
    assert image.shape == (12, 16, 3) and bool(torch.isfinite(image).all())


# ---------------------------------------------------------------------------------------
# Constructor.
CONSTRUCTOR_CASES = {
    "width_0": (dict(width=0), "width"),
    "width_too_large": (dict(width=16385), "width"),
    "height_0": (dict(height=0), "height"),
    "height_too_large": (dict(height=16385), "height"),
    "width_float": (dict(width=16.5), "width"),
    "width_str": (dict(width="16"), "width"),
    "n_channels_0": (dict(n_channels=0), "n_channels"),
    "n_track_0": (dict(n_track=0), "n_track"),
    "n_track_129": (dict(n_track=129), "n_track"),
    "max_num_balls_0": (dict(max_num_balls=0), "max_num_balls"),
    "beta_0": (dict(background_normalized_depth=0.0), "background_normalized_depth"),
    "beta_1": (dict(background_normalized_depth=1.0), "background_normalized_depth"),
    "beta_nan": (dict(background_normalized_depth=math.nan), "background_normalized_depth"),
}


@pytest.mark.parametrize("case", list(CONSTRUCTOR_CASES))
def test_constructor_rejects(case):
    overrides, name = CONSTRUCTOR_CASES[case]
    kwargs = dict(width=16, height=12)
    kwargs.update(overrides)
    with pytest.raises(BAD_INPUT, match=name):
        Renderer(**kwargs)


def test_constructor_limits_are_accepted():
    """The bounds themselves are valid (the rejections above are about the bounds)."""
    Renderer(width=1, height=1, n_track=1)
    Renderer(width=16384, height=1, n_track=128)


# ---------------------------------------------------------------------------------------
# forward: each case maps the valid kwargs to bad ones.
def _set(name, value):
    def apply(kw):
        kw[name] = value(kw) if callable(value) else value
        return kw
    return apply


def _edit(name, fn):
    """Change a tensor argument by fn(tensor) (on a clone)."""
    def apply(kw):
        kw[name] = fn(kw[name].clone())
        return kw
    return apply


def _nan_at(index, value=math.nan):
    def fn(t):
        t.view(-1)[index] = value
        return t
    return fn


FORWARD_CASES = {
    # shapes
    "pos_2_coords": (_edit("vert_pos", lambda t: t[:, :2]), "vert_pos"),
    "pos_4d": (_edit("vert_pos", lambda t: t[None, None]), "vert_pos"),
    "pos_1d": (_edit("vert_pos", lambda t: t.reshape(-1)), "vert_pos"),
    "col_wrong_n": (_edit("vert_col", lambda t: t[:-1]), "vert_col"),
    "col_n_channels_mismatch": (_edit("vert_col", lambda t: torch.cat([t, t[:, :1]], 1)), "vert_col"),
    "rad_wrong_n": (_edit("vert_rad", lambda t: t[:-1]), "vert_rad"),
    "rad_2d": (_edit("vert_rad", lambda t: t[:, None]), "vert_rad"),
    "opacity_wrong_n": (_edit("opacity", lambda t: t[:-1]), "opacity"),
    "bg_wrong_channels": (_edit("bg_col", lambda t: t[:2]), "bg_col"),
    "bg_2d": (_edit("bg_col", lambda t: t[None]), "bg_col"),
    "cam_3d": (_edit("cam_params", lambda t: t[None, None]), "cam_params"),
    "cam_length_9": (_edit("cam_params", lambda t: torch.cat([t, t[:1]])), "cam_params"),
    "cam_length_7": (_edit("cam_params", lambda t: t[:7]), "cam_params"),
    "cam_batch_mismatch": (lambda kw: _batch(kw, n_cams=3), "cam_params"),
    "col_batch_mismatch": (lambda kw: _batch(kw, n_cams=2, col_batch=3), "vert_col"),
    # types and dtypes
    "pos_list": (_edit("vert_pos", lambda t: t.tolist()), "vert_pos"),
    "pos_int": (_edit("vert_pos", lambda t: t.long()), "vert_pos"),
    "pos_half": (_edit("vert_pos", lambda t: t.half()), "vert_pos"),
    "col_float32": (_edit("vert_col", lambda t: t.float()), "vert_col"),
    "rad_float32": (_edit("vert_rad", lambda t: t.float()), "vert_rad"),
    "opacity_float32": (_edit("opacity", lambda t: t.float()), "opacity"),
    "bg_float32": (_edit("bg_col", lambda t: t.float()), "bg_col"),
    "cam_float32": (_edit("cam_params", lambda t: t.float()), "cam_params"),
    # non-finite values
    "pos_nan": (_edit("vert_pos", _nan_at(4)), "vert_pos"),
    "pos_inf": (_edit("vert_pos", _nan_at(2, math.inf)), "vert_pos"),
    "col_nan": (_edit("vert_col", _nan_at(1)), "vert_col"),
    "rad_inf": (_edit("vert_rad", _nan_at(0, math.inf)), "vert_rad"),
    "opacity_nan": (_edit("opacity", _nan_at(3)), "opacity"),
    "bg_inf": (_edit("bg_col", _nan_at(0, -math.inf)), "bg_col"),
    "cam_nan": (_edit("cam_params", _nan_at(1)), "cam_params"),
    # value ranges
    "rad_zero": (_edit("vert_rad", _nan_at(2, 0.0)), "vert_rad"),
    "rad_negative": (_edit("vert_rad", _nan_at(2, -0.1)), "vert_rad"),
    "opacity_negative": (_edit("opacity", _nan_at(2, -0.01)), "opacity"),
    "opacity_above_1": (_edit("opacity", _nan_at(2, 1.01)), "opacity"),
    "sensor_width_zero": (_edit("cam_params", _nan_at(7, 0.0)), "cam_params"),
    "sensor_width_negative": (_edit("cam_params", _nan_at(7, -1.0)), "cam_params"),
    "focal_zero_perspective": (_edit("cam_params", _nan_at(6, 0.0)), "cam_params"),
    "gamma_0": (_set("gamma", 0.0), "gamma"),
    "gamma_below_1e-5": (_set("gamma", 5e-6), "gamma"),
    "gamma_above_1": (_set("gamma", 1.5), "gamma"),
    "gamma_nan": (_set("gamma", math.nan), "gamma"),
    "gamma_str": (_set("gamma", "0.1"), "gamma"),
    "max_depth_equal_min_depth": (_set("max_depth", lambda kw: kw["min_depth"]), "max_depth"),
    "max_depth_below_min_depth": (_set("max_depth", lambda kw: kw["min_depth"] - 0.1), "max_depth"),
    "max_depth_inf": (_set("max_depth", math.inf), "max_depth"),
    "min_depth_equal_focal": (_set("min_depth", lambda kw: float(kw["cam_params"][6])), "min_depth"),
    "min_depth_below_focal": (_set("min_depth", lambda kw: 0.5 * float(kw["cam_params"][6])), "min_depth"),
    "min_depth_negative": (_set("min_depth", -1.0), "min_depth"),
    "mode_2": (_set("mode", 2), "mode"),
    "mode_negative": (_set("mode", -1), "mode"),
    "max_n_hits_0": (_set("max_n_hits", 0), "max_n_hits"),
    "max_n_hits_negative": (_set("max_n_hits", -3), "max_n_hits"),
    "max_n_hits_float": (_set("max_n_hits", 2.5), "max_n_hits"),
    "percent_1": (_set("percent_allowed_difference", 1.0), "percent_allowed_difference"),
    "percent_negative": (_set("percent_allowed_difference", -0.01), "percent_allowed_difference"),
}


def _batch(kw, n_cams, col_batch=None):
    """Batched spheres (B=2) with a mismatching camera or colour batch."""
    kw["vert_pos"] = kw["vert_pos"][None].repeat(2, 1, 1)
    kw["vert_rad"] = kw["vert_rad"][None].repeat(2, 1)
    kw["opacity"] = kw["opacity"][None].repeat(2, 1)
    kw["vert_col"] = kw["vert_col"][None].repeat(col_batch or 2, 1, 1)
    kw["cam_params"] = kw["cam_params"][None].repeat(n_cams, 1)
    return kw


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward_rejects(case, device):
    edit, name = FORWARD_CASES[case]
    _, renderer, kwargs = _valid(device)
    kwargs["mode"] = 0
    with pytest.raises(BAD_INPUT, match=name):
        renderer(**edit(kwargs))
    # The renderer stays usable after a rejected call.
    _, _, good = _valid(device)
    assert bool(torch.isfinite(renderer(**good)).all())


def test_orthographic_rejects_nonzero_focal_length():
    _, renderer, kwargs = _valid(orthographic=True)
    kwargs["cam_params"] = kwargs["cam_params"].clone()
    kwargs["cam_params"][6] = 0.2
    with pytest.raises(BAD_INPUT, match="cam_params"):
        renderer(**kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_max_num_balls_is_a_limit_when_given(device):
    scene, _, kwargs = _valid(device)
    renderer = scene.renderer(device, max_num_balls=5)  # the scene has 6 spheres
    with pytest.raises(ValueError, match="max_num_balls"):
        renderer(**kwargs)


def test_cuda_requested_without_cuda_is_rejected():
    """CUDA asked for where this build or machine has none: ValueError naming the device."""
    if HAS_CUDA:
        pytest.skip("CUDA is available here: there is nothing to reject")
    renderer = Renderer(16, 12)
    if torch.cuda.is_available():
        # torch has CUDA, pulsar_py was built without it: the call names the device.
        assert "cuda" not in pulsar_py.build_info()["backends"]
        scene, _, kwargs = _valid("cpu")
        kwargs = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        with pytest.raises(ValueError, match="(?i)cuda"):
            renderer.to("cuda")(**kwargs)
    else:
        # No CUDA anywhere: moving the renderer there must say so in pulsar_py's terms.
        with pytest.raises(BAD_INPUT, match="(?i)device|cuda"):
            renderer.to("cuda")
        with pytest.raises(BAD_INPUT, match="(?i)device|cuda"):
            Renderer(16, 12).cuda()
