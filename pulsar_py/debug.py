"""Debug snapshots of failing native calls, and their replay.

With debugging on (``Renderer(..., debug=True)``, ``renderer.debug = True``, or the
environment variable ``PULSAR_PY_DEBUG=1``), a native failure (RuntimeError from the
C++ core: out of memory, a CUDA error) saves the call's inputs to a file whose path the
error message names; ``pulsar_py.replay(path)`` repeats the call for a bug report.

A snapshot is a ``torch.save`` file holding a dict: ``version`` (of pulsar_py), ``stage``
("forward" or "backward"), ``config`` (the native renderer's settings), ``settings`` (the
call's non-tensor settings), ``tensors`` (inputs on the CPU; for backward also the
forward's outputs and dL/dimage) and ``device`` (where the call ran).
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from typing import Optional

import torch

ENV_FLAG = "PULSAR_PY_DEBUG"
_CONFIG_FIELDS = ("width", "height", "n_channels", "n_track", "orthographic",
                  "background_normalized_depth", "num_threads", "backward_row_budget")


def debug_enabled(flag: bool) -> bool:
    return flag or os.environ.get(ENV_FLAG, "") not in ("", "0")


def save_snapshot(stage: str, native, settings, device: torch.device, tensors: dict) -> str:
    """Writes a snapshot and returns its path (in $PULSAR_PY_DEBUG_DIR or the temp dir)."""
    from . import __version__

    folder = os.environ.get("PULSAR_PY_DEBUG_DIR", tempfile.gettempdir())
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"pulsar_py_{stage}_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}.pt")
    cfg = native.config
    snapshot = dict(
        version=__version__, stage=stage, device=str(device),
        config={k: getattr(cfg, k) for k in _CONFIG_FIELDS},
        settings=dataclasses.asdict(settings),
        tensors={k: (None if v is None else v.detach().cpu()) for k, v in tensors.items()},
    )
    torch.save(snapshot, path)
    return path


def replay(path: str, device: Optional[str] = None) -> dict:
    """Repeats a snapshotted call; returns its outputs (a failure raises as it did then).

    Args:
        path: the file named in the error message.
        device: where to run (default: the device of the original call).

    Returns:
        dict with ``image``, ``hit_count``, ``forward_info``, ``depth_moments`` (the last two
        None when the call did not ask for them) for a
        forward snapshot, and additionally the gradients (``grad_<input>``) for a
        backward snapshot.
    """
    from . import _native
    from ._autograd import CallSettings, RenderFunction

    snap = torch.load(path, weights_only=False)
    dev = torch.device(device or snap["device"])
    cfg = _native.RendererConfig()
    for key, value in snap["config"].items():
        setattr(cfg, key, value)
    cfg.device = _native.DeviceKind.cuda if dev.type == "cuda" else _native.DeviceKind.cpu
    cfg.device_index = dev.index or 0
    native = _native.Renderer(cfg)
    # Replayed outputs keep the batch dimension [B, ...] whatever the call returned.
    settings = CallSettings(**{**snap["settings"], "batch_dim": True})
    t = {k: (None if v is None else v.to(dev)) for k, v in snap["tensors"].items()}
    names = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cameras")
    inputs = [t[n] for n in names]
    if snap["stage"] == "backward":
        inputs = [None if x is None else x.clone().requires_grad_() for x in inputs]
    image, hits, info, moments = RenderFunction.apply(native, settings, *inputs)
    result = dict(image=image.detach(), hit_count=hits, forward_info=info,
                  depth_moments=None if moments is None else moments.detach())
    if snap["stage"] == "backward":
        # Saved as the call returned them (with or without B = 1).
        outputs, grads_out = [image], [t["grad_image"].reshape(image.shape)]
        if settings.want_depth_moments and t.get("grad_depth_moments") is not None:
            outputs.append(moments)
            grads_out.append(t["grad_depth_moments"].reshape(moments.shape))
        wanted = [(n, x) for n, x in zip(names, inputs) if x is not None]
        grads = torch.autograd.grad(outputs, [x for _, x in wanted], grads_out)
        result.update({f"grad_{n}": g for (n, _), g in zip(wanted, grads)})
    return result
