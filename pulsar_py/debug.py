"""Debug snapshots of failing native calls (their replay: pulsar_py/replay.py).

With debugging on (``Renderer(..., debug=True)``, ``renderer.debug = True``, or the
environment variable ``PULSAR_PY_DEBUG=1``), a native failure (RuntimeError from the
C++ core: out of memory, a CUDA error) saves the call's inputs to a file whose path the
error message names; ``pulsar_py.replay(path)`` repeats the call for a bug report.

A snapshot is a ``torch.save`` file holding plain data only (it loads with
``torch.load(weights_only=True)``): ``version`` (of pulsar_py), ``stage`` ("forward" or
"backward"), ``device`` (where the call ran), ``settings`` (the render operator's
settings, pulsar_py.settings.RenderSettings, as a dict) and ``tensors`` (the operator's
inputs on the CPU, the call's values among them; for backward also dL/dimage and
dL/d(depth moments)).
"""

from __future__ import annotations

import os
import tempfile
import uuid

import torch

from . import _native

ENV_FLAG = "PULSAR_PY_DEBUG"


def debug_enabled(flag: bool) -> bool:
    return flag or os.environ.get(ENV_FLAG, "") not in ("", "0")


def save_snapshot(stage: str, settings: dict, device: torch.device, tensors: dict) -> str:
    """Writes a snapshot and returns its path (in $PULSAR_PY_DEBUG_DIR or the temp dir);
    every failure gets a file of its own."""
    folder = os.environ.get("PULSAR_PY_DEBUG_DIR", tempfile.gettempdir())
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"pulsar_py_{stage}_{os.getpid()}_{uuid.uuid4().hex[:12]}.pt")
    snapshot = dict(
        version=_native.build_info()["version"], stage=stage, device=str(device), settings=dict(settings),
        tensors={k: (None if v is None else v.detach().cpu()) for k, v in tensors.items()},
    )
    torch.save(snapshot, path)
    return path
