"""Shared test helpers: devices to run on, random scenes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import torch

import pulsar_py

HAS_CUDA = torch.cuda.is_available() and "cuda" in pulsar_py.build_info()["backends"]
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def cxx_compiler() -> str | None:
    """The system C++ compiler (CXX, c++, g++ or clang++), for the tests that build a
    small harness over include/pulsar; None when there is none."""
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def build_cxx_check(tmp_path_factory, source: Path, include: Path, what: str) -> Path:
    """The executable of a small C++ harness ``source`` built with the system compiler
    (-std=c++17 -O2, headers from ``include``) in a fresh temporary folder; skips the test
    when there is no compiler, fails it when the build fails. ``what`` names it in both."""
    import pytest

    cxx = cxx_compiler()
    if cxx is None:
        pytest.skip(f"no C++ compiler (CXX, c++, g++ or clang++) on PATH to build the {what}")
    exe = tmp_path_factory.mktemp(source.parent.name) / source.stem
    built = subprocess.run(
        [cxx, "-std=c++17", "-O2", f"-I{include}", str(source), "-o", str(exe)], capture_output=True, text=True
    )
    assert built.returncode == 0, f"compiling the {what} failed:\n{built.stderr}"
    return exe


def run_cxx_check(exe: Path, *args: object) -> str:
    """The standard output of a harness built by ``build_cxx_check``, run with ``args``;
    fails the test when it exits non-zero."""
    done = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True)
    assert done.returncode == 0, f"{exe.name} exited {done.returncode}:\n{done.stderr}"
    return done.stdout


def native_of(renderer):
    """The one native renderer a Renderer module has made so far (diagnostics: scratch)."""
    from pulsar_py import ops

    natives = ops.natives_of(renderer._renderer_id)
    assert len(natives) == 1, f"expected one native renderer, found {len(natives)}"
    return natives[0]


def spy_camera_conversions(monkeypatch):
    """Records the calls' camera conversions: (conversions, render_cameras), lists that get
    a 1 per pulsar::pack_cameras call and the camera width (15: packed) each
    ops.render_call renders with."""
    from pulsar_py import ops

    conversions, render_cameras = [], []
    pack, render_call = ops.pack_cameras, ops.render_call
    monkeypatch.setattr(ops, "pack_cameras", lambda *a: conversions.append(1) or pack(*a))
    monkeypatch.setattr(ops, "render_call", lambda *a: render_cameras.append(a[5].shape[-1]) or render_call(*a))
    return conversions, render_cameras


class FailingNative:
    """Stands in for a native renderer whose ``stage`` call ("forward" or "backward")
    fails like a CUDA error would; the other call runs on the real one."""

    def __init__(self, real, stage: str = "forward"):
        self._real, self._stage = real, stage
        self.config = real.config

    def forward(self, scene, options, make_outputs):
        if self._stage == "forward":
            make_outputs()  # the binning began and the outputs were allocated
            raise RuntimeError("pulsar: CUDA call cudaLaunchKernel failed: simulated")
        return self._real.forward(scene, options, make_outputs)

    def backward(self, *args):
        if self._stage == "backward":
            raise RuntimeError("pulsar: CUDA call cudaLaunchKernel failed: simulated")
        return self._real.backward(*args)


def fail_native_calls(monkeypatch, stage: str = "forward") -> None:
    """Until ``monkeypatch.undo()``: every native renderer's ``stage`` call fails."""
    from pulsar_py import ops

    real = ops.native_renderer
    monkeypatch.setattr(ops, "native_renderer", lambda *args: FailingNative(real(*args), stage))


def operator_settings(
    width: int = 24,
    height: int = 16,
    *,
    n_track: int = 4,
    gamma: float = 0.1,
    percent_allowed_difference: float = 0.0,
    camera_length: int = 8,
    min_depth: float = 0.0,
    max_depth: float = 30.0,
    want_forward_info: bool = False,
    want_depth_moments: bool = False,
    batch_dim: bool = True,
    check_values: bool = True,
):
    """The settings of a direct pulsar::render call (renderer id 0, one CPU thread)."""
    from pulsar_py.render_settings import (
        BlendSettings,
        CallChecks,
        CameraSpec,
        NativeConfig,
        OutputSpec,
        RenderSettings,
    )

    return RenderSettings(
        NativeConfig(0, width, height, n_track, False, 1e-6, 1, 0),
        BlendSettings(gamma, percent_allowed_difference, -1),
        CameraSpec(camera_length, False, False, min_depth, max_depth, 0),
        OutputSpec(want_forward_info, want_depth_moments, batch_dim),
        CallChecks(check_values, False),
    )
