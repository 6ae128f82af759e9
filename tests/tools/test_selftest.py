"""python -m pulsar_py selftest: the stored reference and the comparison."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from helpers import HAS_CUDA

import pulsar_py
from pulsar_py.tools import selftest
from pulsar_py.tools.cli import main as cli_main


def test_stored_reference_is_what_the_reference_renderer_computes():
    # The stored file must not go stale: recompute it with the pure-PyTorch reference.
    stored = selftest.load_reference()
    fresh = selftest.make_reference()
    assert set(stored) == set(fresh)
    for key, value in fresh.items():
        assert stored[key].shape == value.shape, key
        scale = max(float(np.abs(value).max()), 1e-30)
        assert float(np.abs(stored[key] - value).max()) <= 1e-10 * scale, key
    # Every case has an image; the perspective case has a non-zero gradient for every input.
    for name in ("perspective", "orthographic", "batch"):
        assert f"{name}/image" in stored
    for group in ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params"):
        assert float(np.abs(stored[f"perspective/grad/{group}"]).max()) > 0, group


def test_reference_data_lives_in_the_package():
    # Installed with the wheel: inside the pulsar_py folder.
    package = Path(pulsar_py.__file__).resolve().parent
    assert package in Path(selftest.REFERENCE_FILE).resolve().parents
    assert os.path.exists(selftest.REFERENCE_FILE)


def test_selftest_passes_on_this_build(capsys):
    assert cli_main(["selftest", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    rows = [line for line in printed.splitlines() if line.startswith("cpu ")]
    # 2 dtypes x (perspective: image + 6 gradients, orthographic: image, batch: image)
    assert len(rows) == 18
    assert all(line.rstrip().endswith("ok") for line in rows)
    assert "MISMATCH" not in printed and "passed: all 18" in printed


def test_a_wrong_reference_is_a_mismatch(tmp_path, capsys):
    data = selftest.load_reference()
    data["orthographic/image"] = data["orthographic/image"] + 0.01  # one wrong image
    path = tmp_path / "wrong.npz"
    np.savez(path, **data)
    assert cli_main(["selftest", "--device", "cpu", "--reference", str(path)]) == 1
    printed = capsys.readouterr().out
    wrong = [line for line in printed.splitlines() if "MISMATCH" in line]
    assert len(wrong) == 2 and all("orthographic" in line and "image" in line for line in wrong)
    assert "FAILED: 2 of 18" in printed


def test_a_build_that_renders_wrong_fails(monkeypatch):
    real = selftest._native_outputs

    def shifted(case, device, dtype):
        out = real(case, device, dtype)
        out["image"] = torch.roll(out["image"], 1, dims=-2)  # one pixel to the right
        if "grad/vert_col" in out:
            out["grad/vert_col"] = out["grad/vert_col"] * 1.05  # a gradient 5 % off
        return out

    monkeypatch.setattr(selftest, "_native_outputs", shifted)
    checks = selftest.run_checks(["cpu"], selftest.load_reference(), dtypes=(torch.float32,))
    failed = {(c.case, c.quantity) for c in checks if not c.passed}
    assert failed == {
        ("perspective", "image"),
        ("orthographic", "image"),
        ("batch", "image"),
        ("perspective", "grad/vert_col"),
    }


def test_missing_reference_and_unavailable_device(tmp_path, capsys):
    assert cli_main(["selftest", "--reference", str(tmp_path / "none.npz")]) == 1
    assert "reference" in capsys.readouterr().err
    if not HAS_CUDA:
        assert cli_main(["selftest", "--device", "cuda"]) == 1
        assert "cuda" in capsys.readouterr().err


def test_python_m_pulsar_py_selftest(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(pulsar_py.__file__).resolve().parent.parent) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [sys.executable, "-m", "pulsar_py", "selftest"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "selftest: passed" in done.stdout
    assert ("cuda " in done.stdout) == HAS_CUDA
