"""Bad input raises ValueError or TypeError naming the argument, before any native code.

Each case changes one argument of a valid call (or of the constructor) and checks the
exception type and that its message names the argument. A valid call is checked first,
so a case can only pass by rejecting its own bad value.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import DEVICES, HAS_CUDA
from scenes import random_scene

import pulsar_py
from pulsar_py import Renderer

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
    "beta_str": (dict(background_normalized_depth="0.5"), "background_normalized_depth"),
    "n_channels_float": (dict(n_channels=3.0), "n_channels"),
    "n_track_str": (dict(n_track="5"), "n_track"),
    "n_track_bool": (dict(n_track=True), "n_track"),
    "num_threads_negative": (dict(num_threads=-1), "num_threads"),
    "max_num_balls_float": (dict(max_num_balls=10.5), "max_num_balls"),
    # Flags are bools: 1, "yes" or None are rejected, not guessed.
    "orthogonal_projection_int": (dict(orthogonal_projection=1), "orthogonal_projection"),
    "orthogonal_projection_str": (dict(orthogonal_projection="yes"), "orthogonal_projection"),
    "right_handed_system_none": (dict(right_handed_system=None), "right_handed_system"),
    "deterministic_str": (dict(deterministic="no"), "deterministic"),
    "debug_int": (dict(debug=1), "debug"),
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
    # more types
    "col_half": (_edit("vert_col", lambda t: t.half()), "vert_col"),
    "rad_list": (_edit("vert_rad", lambda t: t.tolist()), "vert_rad"),
    "opacity_list": (_edit("opacity", lambda t: t.tolist()), "opacity"),
    "bg_int": (_edit("bg_col", lambda t: (t * 10).int()), "bg_col"),
    "cam_int": (_edit("cam_params", lambda t: t.long()), "cam_params"),
    "cam_list": (_edit("cam_params", lambda t: t.tolist()), "cam_params"),
    "opacity_3d": (_edit("opacity", lambda t: t[None, None]), "opacity"),
    # devices ("meta" stands for any other device, on every machine)
    "pos_other_device": (_edit("vert_pos", lambda t: t.to("meta")), "vert_pos"),
    "col_other_device": (_edit("vert_col", lambda t: t.to("meta")), "vert_col"),
    "rad_other_device": (_edit("vert_rad", lambda t: t.to("meta")), "vert_rad"),
    "opacity_other_device": (_edit("opacity", lambda t: t.to("meta")), "opacity"),
    "bg_other_device": (_edit("bg_col", lambda t: t.to("meta")), "bg_col"),
    "cam_other_device": (_edit("cam_params", lambda t: t.to("meta")), "cam_params"),
    # magnitudes whose squares overflow (float64 limit ~1.3e151)
    "pos_huge": (_edit("vert_pos", _nan_at(5, 1e200)), "vert_pos"),
    "rad_huge": (_edit("vert_rad", _nan_at(1, 1e200)), "vert_rad"),
    "cam_position_huge": (_edit("cam_params", _nan_at(2, -1e200)), "cam_params"),
    "cam_inf": (_edit("cam_params", _nan_at(7, math.inf)), "cam_params"),
    # batches: empty, or more images than the native limit of 2^31 - 1 tiles per call
    "pos_empty_batch": (lambda kw: _empty_batch(kw), "vert_pos"),
    "cam_empty_batch": (_edit("cam_params", lambda t: t[None][:0]), "cam_params"),
    # 6D rotations: Gram-Schmidt needs two non-zero, non-parallel rows
    "cam_6d_zero_row": (lambda kw: _with_6d(kw, [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]), "cam_params"),
    "cam_6d_parallel_rows": (lambda kw: _with_6d(kw, [1.0, 2.0, 0.5], [2.0, 4.0, 1.0]), "cam_params"),
    # scalar settings
    "gamma_tensor_2_values": (_set("gamma", torch.tensor([0.1, 0.2])), "gamma"),
    "gamma_bool": (_set("gamma", True), "gamma"),
    "gamma_none": (_set("gamma", None), "gamma"),
    "percent_str": (_set("percent_allowed_difference", "0.01"), "percent_allowed_difference"),
    "percent_nan": (_set("percent_allowed_difference", math.nan), "percent_allowed_difference"),
    "max_depth_str": (_set("max_depth", "10"), "max_depth"),
    "max_depth_none": (_set("max_depth", None), "max_depth"),
    "max_depth_bool": (_set("max_depth", True), "max_depth"),
    "max_depth_nan": (_set("max_depth", math.nan), "max_depth"),
    "max_depth_tensor_1d": (_set("max_depth", torch.tensor([10.0, 11.0], dtype=torch.float64)), "max_depth"),
    "max_depth_tensor_nan": (_set("max_depth", torch.tensor(math.nan, dtype=torch.float64)), "max_depth"),
    "max_depth_tensor_int": (_set("max_depth", torch.tensor(10)), "max_depth"),
    "max_depth_tensor_below_min_depth": (
        _set("max_depth", lambda kw: torch.tensor(kw["min_depth"] - 0.1, dtype=torch.float64)),
        "max_depth",
    ),
    "min_depth_nan": (_set("min_depth", math.nan), "min_depth"),
    "min_depth_str": (_set("min_depth", "0"), "min_depth"),
    "min_depth_tensor_negative": (_set("min_depth", torch.tensor(-1.0, dtype=torch.float64)), "min_depth"),
    "min_depth_tensor_below_focal": (_set("min_depth", lambda kw: 0.5 * kw["cam_params"][6].clone()), "min_depth"),
    "min_depth_0_far_below_focal": (
        lambda kw: {**kw, "min_depth": 0.0, "max_depth": 0.5 * float(kw["cam_params"][6])},
        "max_depth",
    ),
    "mode_str": (_set("mode", "0"), "mode"),
    "mode_float": (_set("mode", 0.0), "mode"),
    "mode_bool": (_set("mode", False), "mode"),
    "max_n_hits_bool": (_set("max_n_hits", True), "max_n_hits"),
    "max_n_hits_str": (_set("max_n_hits", "5"), "max_n_hits"),
    "return_forward_info_int": (_set("return_forward_info", 1), "return_forward_info"),
    "return_forward_info_str": (_set("return_forward_info", "yes"), "return_forward_info"),
    "first_R_then_T_none": (_set("first_R_then_T", None), "first_R_then_T"),
    "first_R_then_T_int": (_set("first_R_then_T", 0), "first_R_then_T"),
}


def _empty_batch(kw):
    for name in ("vert_pos", "vert_col", "vert_rad", "opacity"):
        kw[name] = kw[name][None][:0]
    return kw


def _with_6d(kw, row1, row2):
    """cam_params [11]: position, a 6D rotation of the given rows, focal, sensor width."""
    cam = kw["cam_params"]
    kw["cam_params"] = torch.cat([cam[:3], torch.tensor(row1 + row2, dtype=cam.dtype, device=cam.device), cam[6:8]])
    return kw


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


@pytest.mark.parametrize("case", list(FORWARD_CASES))
def test_forward_rejects_after_a_valid_call(case):
    """After a valid call every bad input is still rejected, an equal value of another
    type (mode False for 0, first_R_then_T 0 for False) included: nothing of a call is
    reused for the next."""
    _, renderer, kwargs = _valid()
    kwargs["mode"] = 0
    renderer(**kwargs)
    with pytest.raises(BAD_INPUT, match=FORWARD_CASES[case][1]):
        renderer(**FORWARD_CASES[case][0](dict(kwargs)))


def test_hot_path_reuse_follows_the_renderer_attributes():
    """A call after the renderer's handedness changed renders as a renderer made with it:
    the native renderers are keyed on every attribute they are made from."""
    scene, renderer, kwargs = _valid()
    before = renderer(**kwargs)
    renderer.right_handed_system = True
    flipped = renderer(**kwargs)
    fresh = random_scene(3, n_spheres=6, width=16, height=12).renderer("cpu")
    fresh.right_handed_system = True
    assert torch.equal(flipped, fresh(**kwargs)) and not torch.equal(flipped, before)


# Bad types, shapes and devices of the sphere tensors and camera vectors: rejected with
# or without value checks.
SHAPE_AND_TYPE_CASES = [
    "pos_2_coords",
    "pos_4d",
    "pos_1d",
    "col_wrong_n",
    "col_n_channels_mismatch",
    "rad_wrong_n",
    "rad_2d",
    "opacity_wrong_n",
    "col_batch_mismatch",
    "pos_list",
    "pos_int",
    "pos_half",
    "col_float32",
    "rad_float32",
    "opacity_float32",
    "col_half",
    "rad_list",
    "opacity_list",
    "opacity_3d",
    "pos_other_device",
    "col_other_device",
    "rad_other_device",
    "opacity_other_device",
    "pos_empty_batch",
    "cam_3d",
    "cam_length_9",
    "cam_length_7",
    "cam_batch_mismatch",
    "cam_float32",
    "cam_int",
    "cam_list",
    "cam_other_device",
    "cam_empty_batch",
]


@pytest.mark.parametrize(
    "case,check_values",
    [(c, True) for c in sorted(FORWARD_CASES) if not c.startswith("bg_")] + [(c, False) for c in SHAPE_AND_TYPE_CASES],
)
@pytest.mark.parametrize("device", DEVICES)
def test_forward_rejects_with_the_default_background(case, check_values, device):
    # Without bg_col, check_scene first tries its one-function test of the common call
    # (_checks._plain_scene); each bad input must fail it and meet the full checks.
    edit, name = FORWARD_CASES[case]
    _, renderer, kwargs = _valid(device)
    renderer.check_values = check_values
    kwargs["mode"] = 0
    edited = edit(kwargs)
    edited.pop("bg_col")
    with pytest.raises(BAD_INPUT, match=name):
        renderer(**edited)


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


# ---------------------------------------------------------------------------------------
# Limits that need their own set-up.
def test_too_many_tiles_per_call_is_rejected_before_any_allocation():
    """16384 x 16384 pixels are 2^20 tiles: 2047 cameras fit in 2^31 - 1 tiles, 2048 do not.
    The check comes before outputs are allocated (2048 such images would need TBs)."""
    from pulsar_py import _checks

    _checks.check_batch(2047, 16384, 16384)
    with pytest.raises(ValueError, match="batch"):
        _checks.check_batch(2048, 16384, 16384)
    scene, _, kwargs = _valid()
    renderer = Renderer(16384, 16384, n_channels=3)
    kwargs["cam_params"] = kwargs["cam_params"][None].repeat(2048, 1)
    with pytest.raises(ValueError, match="batch size.*2048"):
        renderer(**kwargs)


def test_sphere_count_limit_is_checked():
    """N must fit sphere ids in int32; an expanded (stride-0) tensor makes a huge N cheap."""
    renderer = Renderer(16, 12)
    n = 2**31
    pos = torch.zeros(1, 3, dtype=torch.float64).expand(n, 3)
    col = torch.zeros(1, 3, dtype=torch.float64).expand(n, 3)
    rad = torch.ones(1, dtype=torch.float64).expand(n)
    cam = torch.tensor([0, 0, 0, 0, 0, 0, 1.0, 1.0], dtype=torch.float64)
    with pytest.raises(ValueError, match="vert_pos.*2\\^31"):
        renderer(pos, col, rad, cam, 0.1, 10.0)


INFO_CASES = {
    "list": ([[0.0] * 5], TypeError),
    "int_dtype": (torch.zeros(4, 5, 7, dtype=torch.int32), TypeError),
    "even_width": (torch.zeros(4, 5, 8), ValueError),
    "too_narrow": (torch.zeros(4, 5, 3), ValueError),
    "2d": (torch.zeros(5, 7), ValueError),
}


@pytest.mark.parametrize("case", list(INFO_CASES))
@pytest.mark.parametrize("method", ["sphere_ids_from_result_info_nograd", "depth_map_from_result_info_nograd"])
def test_forward_info_helpers_reject(method, case):
    info, error = INFO_CASES[case]
    with pytest.raises(error, match="result_info"):
        getattr(Renderer, method)(info)


# ---------------------------------------------------------------------------------------
# Renderer.render goes through the same checks (a few representative cases).
RENDER_CASES = {
    "rad_negative": (_edit("vert_rad", _nan_at(2, -0.1)), "vert_rad"),
    "pos_nan": (_edit("vert_pos", _nan_at(4)), "vert_pos"),
    "col_float32": (_edit("vert_col", lambda t: t.float()), "vert_col"),
    "opacity_above_1": (_edit("opacity", _nan_at(2, 1.01)), "opacity"),
    "camera_str": (_set("camera", "front"), "camera"),
    "camera_nan": (_edit("camera", _nan_at(0)), "camera"),
    "gamma_above_1": (_set("gamma", 1.5), "gamma"),
    "max_depth_str": (_set("max_depth", "10"), "max_depth"),
    "percent_1": (_set("percent_allowed_difference", 1.0), "percent_allowed_difference"),
    "max_n_hits_0": (_set("max_n_hits", 0), "max_n_hits"),
    "return_forward_info_int": (_set("return_forward_info", 1), "return_forward_info"),
    "first_R_then_T_str": (_set("first_R_then_T", "no"), "first_R_then_T"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(RENDER_CASES))
def test_render_rejects(case, device):
    edit, name = RENDER_CASES[case]
    _, renderer, kwargs = _valid(device)
    kwargs["camera"] = kwargs.pop("cam_params")
    result = renderer.render(**kwargs)
    assert bool(torch.isfinite(result.image).all())
    with pytest.raises(BAD_INPUT, match=name):
        renderer.render(**edit(dict(kwargs)))


# ---------------------------------------------------------------------------------------
# check_values: the switch for the checks that read tensor contents.
VALUE_ONLY_CASES = [
    "pos_nan",
    "rad_negative",
    "opacity_above_1",
    "sensor_width_zero",
    "cam_nan",
    "min_depth_below_focal",
    "pos_huge",
    "cam_6d_zero_row",
]
STRUCTURAL_CASES = [
    "pos_int",
    "col_wrong_n",
    "gamma_0",
    "max_depth_inf",
    "mode_2",
    "pos_other_device",
    "return_forward_info_int",
    "cam_length_9",
]


@pytest.mark.parametrize("case", VALUE_ONLY_CASES + STRUCTURAL_CASES)
def test_check_values_false_skips_only_the_value_checks(case):
    """Value checks (which would sync a GPU) are skipped, and such input then reaches the
    native code without crashing it; checks of types, shapes, devices and Python numbers
    stay on."""
    edit, name = FORWARD_CASES[case]
    _, renderer, kwargs = _valid()
    renderer.check_values = False
    if case in STRUCTURAL_CASES:
        with pytest.raises(BAD_INPUT, match=name):
            renderer(**edit(kwargs))
    else:
        image = renderer(**edit(kwargs))
        assert image.shape == (12, 16, 3)


class _ReadCounter:
    """Counts reads of tensor contents into Python (each one a device sync on CUDA)."""

    READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy", "cpu")

    def __init__(self, monkeypatch):
        self.counts = {}
        for name in self.READS:
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, _name=name, **kwargs):
                self.counts[_name] = self.counts.get(_name, 0) + 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry", ["forward", "render"])
def test_a_valid_call_reads_tensor_values_once(entry, device, monkeypatch):
    """Every value check of a call is read back in one batch (one sync on CUDA), and
    backward reads nothing; with check_values = False a call reads nothing."""
    _, renderer, kwargs = _valid(device)
    kwargs["vert_pos"].requires_grad_(True)
    if entry == "render":
        kwargs["camera"] = kwargs.pop("cam_params")
    call = renderer if entry == "forward" else (lambda **kw: renderer.render(**kw).image)
    reads = _ReadCounter(monkeypatch)
    image = call(**kwargs)
    assert reads.counts == {"tolist": 1}
    reads.counts.clear()
    image.sum().backward()
    assert reads.counts == {}
    renderer.check_values = False
    call(**kwargs)
    assert reads.counts == {}
    assert float(kwargs["vert_pos"].grad.abs().max()) > 0


def test_numpy_scalars_are_accepted():
    """Numbers may come from NumPy (numbers.Real / numbers.Integral); bools are not numbers."""
    np = pytest.importorskip("numpy")
    scene, _, kwargs = _valid()
    renderer = Renderer(
        np.int64(16),
        np.int32(12),
        n_track=np.int64(5),
        orthogonal_projection=np.bool_(False),
        background_normalized_depth=np.float64(scene.beta),
    )
    expected = scene.renderer()(**kwargs)
    kwargs.update(
        gamma=np.float64(kwargs["gamma"]),
        max_depth=np.float64(kwargs["max_depth"]),
        min_depth=np.float64(kwargs["min_depth"]),
        max_n_hits=np.int64(1000),
        mode=np.int64(0),
        return_forward_info=np.bool_(False),
    )
    torch.testing.assert_close(renderer(**kwargs), expected, rtol=0, atol=0)
