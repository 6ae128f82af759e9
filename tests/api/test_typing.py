"""The documented calls type-check: mypy accepts them against the package's annotations
(py.typed), and they run."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import sweep
import torch

import pulsar_py
from pulsar_py import Camera

PACKAGE_ROOT = Path(pulsar_py.__file__).resolve().parents[1]

# Camera.look_at as docs/cameras.md and docs/api.md call it: eye, target and up as tuples of
# numbers, lists of triples (a batch) or tensors.
DOCUMENTED_CALLS = textwrap.dedent("""
    import torch
    from pulsar_py import Camera

    cameras = [
        Camera.look_at((0, 0, -5), (0, 0, 0), image_size=(240, 320)),
        Camera.look_at((0, 0, -5), (0, 0, 0), up=(0, 1, 0), image_size=(240, 320), fov_y=50.0),
        Camera.look_at([[0.0, 0.0, -5.0], [5.0, 0.0, 0.0]], (0, 0, 0), image_size=(24, 32), fx=30.0),
        Camera.look_at(torch.tensor([0.0, 0.0, -5.0]), torch.zeros(3), image_size=(24, 32), fov_y=40.0),
    ]
""")
# A call the annotations must refuse: the check is not vacuous.
WRONG_CALL = 'from pulsar_py import Camera\nCamera.look_at("eye", (0, 0, 0), image_size=(24, 32))\n'

# torch and numpy as mypy sees them here: every name Any except the classes the package's
# signatures name. Analysing torch's own annotations takes mypy over half a minute on
# 2 cores; PULSAR_PY_SWEEP=full checks against them too.
_TORCH_STUB = textwrap.dedent("""
    from typing import Any

    def __getattr__(name: str) -> Any: ...

    class Tensor:
        def __getattr__(self, name: str) -> Any: ...

    class dtype: ...

    class device:
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...
""")
_NUMPY_STUB = "from typing import Any\n\ndef __getattr__(name: str) -> Any: ...\n"


def _mypy(tmp_path: Path, code: str, stub_torch: bool) -> subprocess.CompletedProcess:
    pytest.importorskip("mypy", reason="mypy comes with the test extra (pip install '.[test]')")
    (tmp_path / "snippet.py").write_text(code)
    # An installed package: mypy finds it in site-packages (and refuses that folder on
    # MYPYPATH); a source checkout (an editable install, PYTHONPATH): its folder.
    paths = [] if PACKAGE_ROOT.name in ("site-packages", "dist-packages") else [str(PACKAGE_ROOT)]
    if stub_torch:
        for name, text in (("torch", _TORCH_STUB), ("numpy", _NUMPY_STUB)):
            (tmp_path / "stubs" / name).mkdir(parents=True, exist_ok=True)
            (tmp_path / "stubs" / name / "__init__.pyi").write_text(text)
        paths.insert(0, str(tmp_path / "stubs"))
    env = dict(os.environ, MYPYPATH=os.pathsep.join(paths))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--follow-imports=silent",
            "--no-incremental",
            "--cache-dir",
            os.devnull,
            "snippet.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_documented_look_at_calls_type_check_and_run(tmp_path):
    done = _mypy(tmp_path, DOCUMENTED_CALLS, stub_torch=True)
    assert done.returncode == 0, done.stdout + done.stderr
    wrong = _mypy(tmp_path, WRONG_CALL, stub_torch=True)
    assert wrong.returncode == 1 and 'Argument 1 to "look_at" of "Camera"' in wrong.stdout, wrong.stdout
    scope: dict = {}
    exec(DOCUMENTED_CALLS, scope)
    cameras = scope["cameras"]
    assert [c.batch_size for c in cameras] == [1, 1, 2, 1]
    assert all(isinstance(c, Camera) and c.rotation.dtype == torch.get_default_dtype() for c in cameras)


@pytest.mark.skipif(not sweep.FULL, reason="PULSAR_PY_SWEEP=full: mypy with torch's own annotations (slow)")
def test_documented_look_at_calls_type_check_against_torch(tmp_path):
    done = _mypy(tmp_path, DOCUMENTED_CALLS, stub_torch=False)
    assert done.returncode == 0, done.stdout + done.stderr
