"""Debug snapshots: a failing native call saves its inputs; replay() repeats the call;
replay checks a snapshot before any native code runs and loads it with
torch.load(weights_only=True)."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import DEVICES, fail_native_calls
from scenes import random_scene

from pulsar_py.debug import replay

F64 = torch.float64


def _saved_path(error: Exception) -> str:
    match = re.search(r"saved to (\S+\.pt)", str(error))
    assert match, str(error)
    return match.group(1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stage", ["forward", "backward"])
def test_failure_saves_snapshot_that_replays(device, stage, tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_PY_DEBUG_DIR", str(tmp_path))
    scene = random_scene(4, n_spheres=30)
    renderer = scene.renderer(device, debug=True)
    kwargs = scene.call_kwargs(F64, device)
    for name in ("vert_pos", "vert_col", "vert_rad"):
        kwargs[name] = kwargs[name].clone().requires_grad_()
    expected = renderer(**kwargs)
    grad = torch.rand_like(expected)
    expected.backward(grad)
    expected_grads = {n: kwargs[n].grad.clone() for n in ("vert_pos", "vert_col", "vert_rad")}
    fail_native_calls(monkeypatch, stage)
    with pytest.raises(RuntimeError) as info:
        renderer(**kwargs).backward(grad)
    message = str(info.value)
    assert "simulated" in message and "pulsar_py.replay(" in message
    saved = list(tmp_path.glob(f"pulsar_py_{stage}_*.pt"))
    assert len(saved) == 1 and str(saved[0]) == _saved_path(info.value)
    monkeypatch.undo()
    replayed = replay(str(saved[0]))
    assert torch.equal(replayed["image"].to(device).reshape(expected.shape), expected.detach())
    assert float((replayed["hit_count"] > 0).float().mean()) > 0.2
    if stage == "backward":
        for name, value in expected_grads.items():
            torch.testing.assert_close(replayed[f"grad_{name}"].to(device), value, rtol=1e-12, atol=1e-12)


def test_without_debug_the_error_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_PY_DEBUG_DIR", str(tmp_path))
    monkeypatch.delenv("PULSAR_PY_DEBUG", raising=False)
    scene = random_scene(4, n_spheres=30)
    renderer = scene.renderer()
    fail_native_calls(monkeypatch)
    with pytest.raises(RuntimeError, match="simulated$"):
        renderer(**scene.call_kwargs())
    assert not list(tmp_path.glob("*.pt"))


def test_environment_variable_turns_debugging_on(tmp_path, monkeypatch):
    monkeypatch.setenv("PULSAR_PY_DEBUG_DIR", str(tmp_path))
    monkeypatch.setenv("PULSAR_PY_DEBUG", "1")
    scene = random_scene(4, n_spheres=30)
    renderer = scene.renderer()
    fail_native_calls(monkeypatch)
    with pytest.raises(RuntimeError, match="replay"):
        renderer(**scene.call_kwargs())
    assert len(list(tmp_path.glob("pulsar_py_forward_*.pt"))) == 1


def test_every_failure_gets_a_file_of_its_own(tmp_path, monkeypatch):
    """Two failures in the same second name two files, each holding its own call."""
    monkeypatch.setenv("PULSAR_PY_DEBUG_DIR", str(tmp_path))
    scene = random_scene(4, n_spheres=30)
    renderer = scene.renderer(debug=True)
    fail_native_calls(monkeypatch)
    paths = []
    for radius_scale in (1.0, 0.5):
        kwargs = scene.call_kwargs()
        kwargs["vert_rad"] = kwargs["vert_rad"] * radius_scale
        with pytest.raises(RuntimeError) as info:
            renderer(**kwargs)
        paths.append(_saved_path(info.value))
    assert len(set(paths)) == 2
    radii = [torch.load(p, weights_only=True)["tensors"]["vert_rad"] for p in paths]
    torch.testing.assert_close(radii[1], radii[0] * 0.5)


def _snapshot(tmp_path, monkeypatch, stage: str = "forward") -> str:
    monkeypatch.setenv("PULSAR_PY_DEBUG_DIR", str(tmp_path))
    scene = random_scene(4, n_spheres=30)
    renderer = scene.renderer(debug=True)
    kwargs = scene.call_kwargs()
    kwargs["vert_pos"] = kwargs["vert_pos"].clone().requires_grad_()
    fail_native_calls(monkeypatch, stage)
    with pytest.raises(RuntimeError) as info:
        out = renderer(**kwargs)
        out.sum().backward()
    monkeypatch.undo()
    return _saved_path(info.value)


def _edit(path: str, fn) -> str:
    snap = torch.load(path, weights_only=True)
    fn(snap)
    out = path.replace(".pt", "_edited.pt")
    torch.save(snap, out)
    return out


EDITS = {
    "camera_vector_too_short": (
        lambda s: s["tensors"].__setitem__("cameras", s["tensors"]["cameras"][:, :5]),
        "cameras",
    ),
    "positions_wrong_shape": (
        lambda s: s["tensors"].__setitem__("vert_pos", s["tensors"]["vert_pos"][:, :2]),
        "vert_pos",
    ),
    "colours_fewer_spheres": (
        lambda s: s["tensors"].__setitem__("vert_col", s["tensors"]["vert_col"][:-3]),
        "vert_col",
    ),
    "radii_float32": (lambda s: s["tensors"].__setitem__("vert_rad", s["tensors"]["vert_rad"].float()), "vert_rad"),
    "background_channels": (lambda s: s["tensors"].__setitem__("bg_col", s["tensors"]["bg_col"][:2]), "bg_col"),
    "camera_length_setting": (lambda s: s["settings"].__setitem__("camera_length", 5), "camera_length"),
    "width_setting": (lambda s: s["settings"].__setitem__("width", float("nan")), "settings"),
    "missing_settings": (lambda s: s["settings"].pop("gamma"), "settings"),
    "stage": (lambda s: s.__setitem__("stage", "sideways"), "stage"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_replay_checks_the_snapshot_before_native_code(case, tmp_path, monkeypatch):
    path = _snapshot(tmp_path, monkeypatch)
    edit, name = EDITS[case]
    with pytest.raises(ValueError, match=name):
        replay(_edit(path, edit))


def test_replay_checks_the_backward_gradient_shape(tmp_path, monkeypatch):
    path = _snapshot(tmp_path, monkeypatch, "backward")
    edited = _edit(path, lambda s: s["tensors"].__setitem__("grad_image", s["tensors"]["grad_image"][..., :1, :]))
    with pytest.raises(ValueError, match="grad_image"):
        replay(edited)


class _Payload:
    """An object whose unpickling would run code: torch.load(weights_only=True) refuses it."""

    def __reduce__(self):
        return (print, ("unpickled code ran",))


def test_replay_refuses_a_snapshot_that_would_run_code(tmp_path, monkeypatch, capsys):
    path = _snapshot(tmp_path, monkeypatch)
    crafted = _edit(path, lambda s: s.__setitem__("payload", _Payload()))
    with pytest.raises(Exception, match="[Ww]eights only|weights_only|Unsupported"):
        replay(crafted)
    assert "unpickled code ran" not in capsys.readouterr().out
