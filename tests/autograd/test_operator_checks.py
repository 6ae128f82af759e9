"""pulsar::render called directly (not through the Renderer) checks its operands' structure
before any native code runs: a wrong shape, rank, dtype or camera count is a ValueError or
TypeError naming the operator's argument, in eager calls and when traced (fake kernel)."""

from __future__ import annotations

import pytest
import torch
from helpers import operator_settings
from scenes import scene_in_front
from torch._subclasses.fake_tensor import FakeTensorMode

from pulsar_py import ops

F32, F64 = torch.float32, torch.float64


def _settings(camera_length=8, batch_dim=True):
    return operator_settings(percent_allowed_difference=0.01, camera_length=camera_length, batch_dim=batch_dim).encode()


def _operands():
    pos, col, rad, opa, cam = scene_in_front(0, 20, F32, False)
    return dict(positions=pos, features=col, radii=rad, opacities=opa, background=torch.ones(3), cameras=cam[None])


def _call(operands, settings=None):
    o = operands
    return ops.render(
        o["positions"], o["features"], o["radii"], o["opacities"], o["background"], o["cameras"], None,
        settings or _settings(),
    )  # fmt: skip


def test_plain_operands_render():
    image = _call(_operands())[0]
    assert image.shape == (1, 16, 24, 3) and image.isfinite().all()


@pytest.mark.parametrize(
    "name, make, error, match",
    [
        ("positions", lambda o: o["positions"][:, :2], ValueError, r"positions: expected a last dimension of 3"),
        ("positions", lambda o: o["positions"].to(torch.int32), TypeError, r"positions: expected dtype float32 or"),
        ("features", lambda o: o["features"][:5], ValueError, r"features: expected shape \(20, 3\)"),
        ("features", lambda o: o["features"].double(), TypeError, r"features: expected dtype torch.float32 like pos"),
        ("radii", lambda o: o["radii"][None], ValueError, r"radii: expected 1 dimension, got shape \(1, 20\)"),
        ("radii", lambda o: o["radii"][:19], ValueError, r"radii: expected shape \(20,\) to match positions"),
        ("opacities", lambda o: o["opacities"][:3], ValueError, r"opacities: expected shape \(20,\)"),
        ("background", lambda o: torch.ones(4), ValueError, r"background: expected a last dimension of 3"),
        ("cameras", lambda o: torch.zeros(1, 10), ValueError, r"cameras: expected a last dimension of 8"),
        ("cameras", lambda o: torch.zeros(0, 8), ValueError, r"cameras: expected at least 1 cameras"),
        ("cameras", lambda o: o["cameras"][None], ValueError, r"cameras: expected 1 or 2 dimensions"),
    ],
)
def test_a_wrong_operand_is_refused_naming_it(name, make, error, match):
    operands = _operands()
    operands[name] = make(operands)
    with pytest.raises(error, match=match):
        _call(operands)


def test_batched_spheres_take_one_camera_per_set():
    operands = _operands()
    for key in ("positions", "features", "radii", "opacities"):
        operands[key] = torch.stack([operands[key]] * 2)
    assert _call(dict(operands, cameras=operands["cameras"].expand(2, -1).contiguous()))[0].shape == (2, 16, 24, 3)
    with pytest.raises(ValueError, match=r"cameras: expected 2 \(one per sphere set of positions\) cameras"):
        _call(operands)


def test_outputs_without_a_batch_take_one_camera():
    operands = _operands()
    two = dict(operands, cameras=operands["cameras"].expand(2, -1).contiguous())
    with pytest.raises(ValueError, match="cameras: expected 1 camera for outputs without a batch dimension, got 2"):
        _call(two, _settings(batch_dim=False))


def test_packed_cameras_take_fifteen_values():
    with pytest.raises(ValueError, match="cameras: expected a last dimension of 15"):
        _call(_operands(), _settings(camera_length=0))


def test_the_fake_kernel_refuses_what_the_kernel_refuses():
    operands = _operands()
    operands["radii"] = operands["radii"][:19]
    with FakeTensorMode() as mode:
        fake = {k: mode.from_tensor(v) for k, v in operands.items()}
        with pytest.raises(ValueError, match=r"radii: expected shape \(20,\) to match positions"):
            _call(fake)
