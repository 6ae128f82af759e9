"""Debug snapshots: a failing native call saves its inputs; replay() repeats the call."""

from __future__ import annotations

import pytest
import torch

import pulsar_py
from pulsar_py._autograd import CallSettings, RenderFunction
from pulsar_py.debug import replay

from helpers import DEVICES


class FailingNative:
    """Stands in for the native renderer and fails like a CUDA error would."""

    def __init__(self, real):
        self.config = real.config

    def begin_forward(self, *args):  # the binning's allocation fails
        raise RuntimeError("pulsar: CUDA call cudaMalloc failed: simulated")


def _inputs(device):
    g = torch.Generator().manual_seed(4)
    pos = (torch.rand(30, 3, generator=g, dtype=torch.float64) * 4 - 2 + torch.tensor([0, 0, 12.0], dtype=torch.float64)).to(device)
    col = torch.rand(30, 3, generator=g, dtype=torch.float64).to(device)
    rad = (0.2 + 0.5 * torch.rand(30, generator=g, dtype=torch.float64)).to(device)
    bg = torch.ones(3, dtype=torch.float64, device=device)
    renderer = pulsar_py.Renderer(24, 18).to(device)
    cam = pulsar_py.camera_from_params(torch.tensor([[0, 0, 0, 0, 0, 0, 4.0, 2.0]], dtype=torch.float64, device=device), 24, 18)
    near = cam.focal + 2e-6
    cameras = torch.cat([cam.packed(), near[:, None], torch.full_like(near, 30.0)[:, None]], -1)
    return renderer, (pos, col, rad, None, bg, cameras)


@pytest.mark.parametrize("device", DEVICES)
def test_failure_saves_snapshot_that_replays(device, tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_PY_DEBUG_DIR", str(tmp_path))
    renderer, inputs = _inputs(device)
    real = renderer._native_for(torch.device(device), False)
    settings = CallSettings(gamma=0.2, percent_allowed_difference=0.0, max_n_hits=-1, right_handed=False,
                            want_forward_info=False, debug=True)
    with pytest.raises(RuntimeError) as info:
        RenderFunction.apply(FailingNative(real), settings, *inputs)
    message = str(info.value)
    assert "simulated" in message and "pulsar_py.replay(" in message
    saved = list(tmp_path.glob("pulsar_py_forward_*.pt"))
    assert len(saved) == 1 and str(saved[0]) in message
    replayed = replay(str(saved[0]))
    expected = RenderFunction.apply(real, settings, *inputs)[0]
    assert torch.equal(replayed["image"].to(device), expected)
    assert float((replayed["hit_count"] > 0).float().mean()) > 0.2


def test_without_debug_the_error_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_PY_DEBUG_DIR", str(tmp_path))
    monkeypatch.delenv("PULSAR_PY_DEBUG", raising=False)
    renderer, inputs = _inputs("cpu")
    settings = CallSettings(gamma=0.2, percent_allowed_difference=0.0, max_n_hits=-1, right_handed=False,
                            want_forward_info=False)
    with pytest.raises(RuntimeError, match="simulated$"):
        RenderFunction.apply(FailingNative(renderer._native_for(torch.device("cpu"), False)), settings, *inputs)
    assert not list(tmp_path.glob("*.pt"))


def test_environment_variable_turns_debugging_on(tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_PY_DEBUG_DIR", str(tmp_path))
    monkeypatch.setenv("PULSAR_PY_DEBUG", "1")
    renderer, inputs = _inputs("cpu")
    settings = CallSettings(gamma=0.2, percent_allowed_difference=0.0, max_n_hits=-1, right_handed=False,
                            want_forward_info=False)
    with pytest.raises(RuntimeError, match="replay"):
        RenderFunction.apply(FailingNative(renderer._native_for(torch.device("cpu"), False)), settings, *inputs)
    assert len(list(tmp_path.glob("pulsar_py_forward_*.pt"))) == 1
