"""Writing a debug snapshot of a failing native call (read and replayed by pulsar_py.debug).

The operators (pulsar_py.ops) call this when debugging is on; it depends on nothing above
the native module, so the operators and the replay, which calls the operators, form no
import cycle.
"""

from __future__ import annotations

import os
import tempfile
import uuid

import torch

from . import _native

ENV_FLAG = "PULSAR_PY_DEBUG"
TENSOR_NAMES = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cameras")


def debug_enabled(flag: bool) -> bool:
    return flag or os.environ.get(ENV_FLAG, "") not in ("", "0")


def save_snapshot(stage: str, settings: dict, device: torch.device, tensors: dict) -> str:
    """Writes a snapshot and returns its path (in $PULSAR_PY_DEBUG_DIR or the temp dir);
    every failure gets a file of its own."""
    folder = os.environ.get("PULSAR_PY_DEBUG_DIR", tempfile.gettempdir())
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"pulsar_py_{stage}_{os.getpid()}_{uuid.uuid4().hex[:12]}.pt")
    snapshot = dict(
        version=_native.build_info()["version"],
        stage=stage,
        device=str(device),
        settings=dict(settings),
        tensors={k: (None if v is None else v.detach().cpu()) for k, v in tensors.items()},
    )
    torch.save(snapshot, path)
    return path
