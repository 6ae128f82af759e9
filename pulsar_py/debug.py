"""Debug snapshots of failing native calls, and their replay.

With debugging on (``Renderer(..., debug=True)``, ``renderer.debug = True``, or the
environment variable ``PULSAR_PY_DEBUG=1``), a native failure (RuntimeError from the
C++ core: out of memory, a CUDA error) saves the call's inputs to a file whose path the
error message names (pulsar_py._snapshot writes it); ``pulsar_py.replay(path)`` repeats the
call for a bug report.

A snapshot is a ``torch.save`` file holding plain data only (it loads with
``torch.load(weights_only=True)``): ``version`` (of pulsar_py), ``stage`` ("forward" or
"backward"), ``device`` (where the call ran), ``settings`` (the render operator's
settings, pulsar_py.render_settings.RenderSettings, as a dict) and ``tensors`` (the
operator's inputs on the CPU; for backward also dL/dimage and dL/d(depth moments)).
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch

from ._snapshot import TENSOR_NAMES
from .camera_layouts import VALID_PARAM_LENGTHS
from .ops import render
from .outputs import DEPTH_STATS
from .render_settings import FIELDS, RenderSettings


def _fail(path: str, message: str) -> None:
    raise ValueError(f"replay: {path}: {message}")


def _check_snapshot(path: str, snap: object) -> None:
    """Every tensor against the recorded call, before any native code sees them."""
    if not isinstance(snap, dict) or not {"stage", "settings", "tensors", "device"} <= set(snap):
        _fail(path, "not a pulsar_py debug snapshot (expected a dict with stage, settings, tensors, device)")
    if snap["stage"] not in ("forward", "backward"):
        _fail(path, f"stage: expected 'forward' or 'backward', got {snap['stage']!r}")
    settings, tensors = snap["settings"], snap["tensors"]
    if not isinstance(settings, dict) or set(settings) != set(FIELDS):
        _fail(path, f"settings: expected the fields {FIELDS}")
    if not all(isinstance(v, (int, float, bool)) and math.isfinite(float(v)) for v in settings.values()):
        _fail(path, "settings: expected finite numbers")
    s = RenderSettings.from_flat(settings)
    if not isinstance(tensors, dict) or any(n not in tensors for n in TENSOR_NAMES):
        _fail(path, f"tensors: expected {', '.join(TENSOR_NAMES)}")
    pos = tensors["vert_pos"]
    if (
        not isinstance(pos, torch.Tensor)
        or pos.dtype not in (torch.float32, torch.float64)
        or pos.dim() not in (2, 3)
        or pos.shape[-1] != 3
    ):
        _fail(path, "vert_pos: expected a float32 or float64 tensor [B?, N, 3]")
    lead = tuple(pos.shape[:-1])
    cams = tensors["cameras"]
    length = s.camera.camera_length if s.camera.camera_length else 15
    if s.camera.camera_length not in (0,) + VALID_PARAM_LENGTHS:
        _fail(path, f"settings.camera_length: expected 0, 8, 10, 11 or 13, got {s.camera.camera_length}")
    if not isinstance(cams, torch.Tensor) or cams.dim() != 2 or cams.shape[1] != length or cams.shape[0] < 1:
        _fail(path, f"cameras: expected [B, {length}], got {getattr(cams, 'shape', type(cams).__name__)}")
    batch = cams.shape[0]
    if pos.dim() == 3 and pos.shape[0] != batch:
        _fail(path, f"vert_pos: expected a batch of {batch} like the cameras, got {tuple(pos.shape)}")
    col = tensors["vert_col"]
    if not isinstance(col, torch.Tensor) or col.dim() != pos.dim() or tuple(col.shape[:-1]) != lead:
        _fail(path, f"vert_col: expected [{', '.join(map(str, lead))}, C]")
    channels = col.shape[-1]
    want = {"vert_rad": lead, "opacity": lead, "bg_col": (channels,)}
    lead_out = (batch, s.config.height, s.config.width) if s.outputs.batch_dim else (s.config.height, s.config.width)
    if snap["stage"] == "backward":
        want["grad_image"] = lead_out + (channels,)
        want["grad_depth_moments"] = lead_out + (DEPTH_STATS,)
    for name, shape in want.items():
        t = tensors.get(name)
        if t is None and name in ("opacity", "bg_col", "grad_depth_moments"):
            continue
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            _fail(path, f"{name}: expected shape {list(shape)}, got {getattr(t, 'shape', type(t).__name__)}")
    for name, t in tensors.items():
        if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != pos.dtype):
            _fail(path, f"{name}: expected a tensor of dtype {pos.dtype} like vert_pos")
    if snap["stage"] == "backward" and tensors.get("grad_image") is None:
        _fail(path, "grad_image: expected dL/dimage in a backward snapshot")


def replay(path: str, device: Optional[str] = None) -> Dict[str, Optional[torch.Tensor]]:
    """Repeats a snapshotted call; returns its outputs (a failure raises as it did then).

    The file is loaded with ``torch.load(weights_only=True)`` (it holds plain data; a file
    that needs more is refused), and every tensor is checked against the recorded call
    before native code runs (ValueError naming what does not match).

    Args:
        path: the file named in the error message.
        device: where to run (default: the device of the original call).

    Returns:
        dict with ``image``, ``hit_count``, ``forward_info`` and ``depth_moments`` (the
        last two None when the call did not ask for them); for a backward snapshot also
        the gradients ``grad_<input>`` of the inputs it had.
    """
    snap = torch.load(path, weights_only=True)
    _check_snapshot(path, snap)
    dev = torch.device(device or snap["device"])
    # A renderer of its own (id 0 is never a module's), debugging off: its failure raises.
    s = RenderSettings.from_flat({**snap["settings"], "renderer_id": 0, "debug": False, "check_values": True})
    t = {k: (None if v is None else v.to(dev)) for k, v in snap["tensors"].items()}
    inputs = [t[n] for n in TENSOR_NAMES]
    backward = snap["stage"] == "backward"
    if backward:
        inputs = [None if x is None else x.clone().requires_grad_() for x in inputs]
    with torch.enable_grad():
        image, _, counts, info, moments = render(*inputs, None, s.encode())  # snapshots hold numbers
    result = dict(
        image=image.detach(),
        hit_count=counts[0],
        forward_info=info if s.outputs.want_forward_info else None,
        depth_moments=moments.detach() if s.outputs.want_depth_moments else None,
    )
    if backward:
        outputs, grads_out = [image], [t["grad_image"]]
        if s.outputs.want_depth_moments and t.get("grad_depth_moments") is not None:
            outputs.append(moments)
            grads_out.append(t["grad_depth_moments"])
        wanted = [(n, x) for n, x in zip(TENSOR_NAMES, inputs) if x is not None]
        grads = torch.autograd.grad(outputs, [x for _, x in wanted], grads_out, allow_unused=True)
        result.update({f"grad_{n}": g for (n, _), g in zip(wanted, grads)})
    return result
