"""Every script in examples/ runs, at tiny sizes, and does what it says."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from pulsar_py.io.images import read_image

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str):
    """Import examples/<name>.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fit_spheres_multiview(tmp_path):
    result = _load("fit_spheres_multiview").main(
        ["--views", "3", "--width", "48", "--height", "36", "--spheres", "300", "--steps", "60", "--out", str(tmp_path)]
    )
    assert result["final_psnr_db"] > result["initial_psnr_db"] + 6.0, result
    assert read_image(tmp_path / "fit.png").shape == (36, 3 * 48, 3)
    assert read_image(tmp_path / "targets.png").shape == (36, 3 * 48, 3)


def test_refine_camera_pose():
    result = _load("refine_camera_pose").main(
        ["--width", "96", "--height", "72", "--steps", "100", "--spheres", "1000", "--rotation-error", "3"]
    )
    assert result["initial_rotation_deg"] == pytest.approx(3.0, abs=1e-6)
    assert result["final_rotation_deg"] < result["initial_rotation_deg"] / 3, result
    assert result["final_position_error"] < result["initial_position_error"], result


def test_render_ply(tmp_path):
    pytest.importorskip("plyfile")
    out = tmp_path / "render.png"
    result = _load("render_ply").main(["--out", str(out), "--width", "64", "--height", "48"])
    assert Path(result["ply"]).exists() and result["points"] == 6000
    image = read_image(out).int()
    assert image.shape == (48, 64, 3)
    background = (image == 255).all(-1)
    assert bool(background[0, 0]) and 0.1 < float((~background).float().mean()) < 0.9
    # The knot's rainbow: pixels dominated by each of red, green and blue.
    object_pixels = image[~background]
    assert torch.unique(object_pixels.argmax(-1)).numel() == 3


def test_depth_supervision():
    module = _load("depth_supervision")
    small = ["--width", "64", "--height", "48", "--spheres", "1200", "--steps", "60"]
    with_depth = module.main(small)
    assert with_depth["final_depth_error"] < with_depth["initial_depth_error"] / 10, with_depth
    assert with_depth["final_psnr_db"] > 30.0, with_depth
    image_only = module.main(small + ["--depth-weight", "0"])
    # The image alone leaves the depth (almost) where it was.
    assert image_only["final_depth_error"] > 0.8 * image_only["initial_depth_error"], image_only
