"""How far a reader follows a camera: the package's functions that receive the camera a
user passed, in call order, grouped into stays (consecutive calls in one file). A call
path that leaves a file and comes back makes the reader switch back; the camera's path
from the public entry points to the operator stays within four files and comes back to a
file already left at most twice."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, List, Tuple

import pytest
import torch

import pulsar_py
from pulsar_py import Camera, Renderer

PACKAGE = Path(pulsar_py.__file__).resolve().parent


def _camera_path(call: Callable[[], object], camera: object) -> List[Tuple[str, List[str]]]:
    """[(file relative to the package, [function names])] of the package functions whose
    arguments or locals hold ``camera`` itself when they are entered."""
    stays: List[Tuple[str, List[str]]] = []

    def on_event(frame, event, _arg):
        if event != "call":
            return
        path = Path(frame.f_code.co_filename)
        if PACKAGE not in path.parents or not any(v is camera for v in frame.f_locals.values()):
            return
        name = str(path.relative_to(PACKAGE))
        if stays and stays[-1][0] == name:
            stays[-1][1].append(frame.f_code.co_name)
        else:
            stays.append((name, [frame.f_code.co_name]))

    sys.setprofile(on_event)
    try:
        call()
    finally:
        sys.setprofile(None)
    return stays


def _scene():
    g = torch.Generator().manual_seed(0)
    pos = torch.rand(20, 3, generator=g) + torch.tensor([-0.5, -0.5, 8.0])
    return pos, torch.rand(20, 3, generator=g), torch.full((20,), 0.3)


CAMERA = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 2.0]


@pytest.mark.parametrize("entry", ["forward", "render with a Camera", "render with camera vectors"])
def test_the_camera_path_stays_in_four_files_with_at_most_two_returns(entry):
    renderer = Renderer(24, 16)
    pos, col, rad = _scene()
    vectors = torch.tensor(CAMERA)
    if entry == "forward":
        camera = vectors
        call = lambda: renderer(pos, col, rad, camera, 0.1, 30.0)  # noqa: E731
    else:
        camera = Camera.from_params(vectors, 24, 16) if entry == "render with a Camera" else vectors
        call = lambda: renderer.render(pos, col, rad, camera, 0.1, 30.0)  # noqa: E731
    stays = _camera_path(call, camera)
    files = [name for name, _ in stays]
    returns = sum(1 for i, name in enumerate(files) if name in files[:i])
    described = " | ".join(f"{name}: {' > '.join(calls)}" for name, calls in stays)
    assert stays and stays[0][0] == "renderer.py", described
    assert len(set(files)) <= 4, described
    assert returns <= 2, described
