"""Input validation, in one place, before any native code runs.

Every check raises ValueError (bad value, shape, device) or TypeError (bad type or dtype)
naming the argument, what was expected and what was given. Checks come in two kinds:

* structural checks (types, dtypes, devices, shapes, Python numbers): always on, free;
* value checks that read tensor contents (NaN/Inf, magnitudes, radius > 0, opacity in
  [0, 1], focal length, sensor width, depth range against the focal length): collected in
  ``DeferredValueChecks`` and read back together, in one device synchronisation per call
  on CUDA. ``Renderer.check_values = False`` switches them off for a pipeline known to be
  sound (docs/reliability.md).

Inputs need not be contiguous: the renderer makes them contiguous (a copy only when they
are not) before the native call.
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Callable, Optional, Sequence, Tuple

import numpy as np
import torch


FLOAT_DTYPES = (torch.float32, torch.float64)
# Lengths of a Pulsar camera vector: position 3, rotation 3 or 6, focal, sensor, [offsets 2].
VALID_PARAM_LENGTHS = (8, 10, 11, 13)
MAX_IMAGE_SIDE = 16384  # pixels per side (include/pulsar/renderer.h kMaxImageSide)
MAX_TRACK = 128  # n_track (kMaxTrack)
MAX_SPHERES = 2**31 - 1  # sphere ids are int32
TILE_SIZE = 16  # pixels per tile side (native/core/tiling.h)
MAX_TILES_PER_CALL = 2**31 - 1  # B * tiles per image: tiles are numbered in 31 bits
MIN_GAMMA, MAX_GAMMA = 1e-5, 1.0
# Pulsar's "unlimited" max_n_hits; any cap >= MAX_SPHERES never binds either.
UNLIMITED_HITS = 2**32 - 1


def magnitude_limit(dtype: torch.dtype) -> float:
    """Largest |value| accepted for positions, radii and camera vectors of ``dtype``.

    The renderer squares distances (|c|^2, r^2): sqrt(max) / 1000 leaves room for sums
    of squares and products with pixel sizes. float32: 1.8e16; float64: 1.3e151.
    """
    return math.sqrt(torch.finfo(dtype).max) / 1000.0


# ---------------------------------------------------------------------------- scalars
def check_int(name: str, value: object, low: int, high: Optional[int] = None) -> int:
    """An integer (Python, NumPy or a one-element integer tensor) in [low, high]."""
    if type(value) is int and value >= low and (high is None or value <= high):
        return value  # the common case, without the ABC checks below (per call, every frame)
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not (
            value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        value = int(value.item())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {_short(value)}")
    value = int(value)
    if value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name}: expected an integer {span}, got {value}")
    return value


def check_float(name: str, value: object, low: float, high: float, *, low_open: bool = False,
                high_open: bool = False) -> float:
    """A finite real number in the given interval, as a Python float.

    A one-element tensor is accepted when it does not require grad: the value is read
    (a sync on CUDA) and the argument is not differentiable, which a tensor requiring
    grad would suggest it is.
    """
    if type(value) is float and (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high):
        return value  # the common case (NaN fails the comparisons), without the checks below
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected a scalar, got a tensor of shape {tuple(value.shape)}")
        if value.requires_grad:
            raise ValueError(f"{name}: not differentiable (the renderer takes it as a plain number), got a "
                             f"tensor that requires grad; pass {name}.detach() or a float")
        if not value.is_floating_point():
            raise TypeError(f"{name}: expected a float, got a tensor of dtype {value.dtype}")
        value = float(value.item())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__} {_short(value)}")
    value = float(value)
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and (
        value < high if high_open else value <= high)
    if not ok:
        span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name}: expected a finite value in {span}, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    """A flag: bool or numpy.bool_ (1, "yes", None or tensors are rejected, not guessed)."""
    if value is True or value is False:
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool (True or False), got {type(value).__name__} {_short(value)}")
    return bool(value)


def check_depth(name: str, value: object, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """max_depth / min_depth: a real number or a 0-dim floating tensor -> 0-dim tensor.

    Depths are differentiable (they enter the blend exponent): a tensor keeps its graph.
    Python numbers are checked here (finite, >= 0); tensors in ``add_depth_checks``.
    """
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or not value.is_floating_point():
            raise (ValueError if value.is_floating_point() else TypeError)(
                f"{name}: expected a float or a 0-dim floating tensor, got a tensor of shape "
                f"{tuple(value.shape)} and dtype {value.dtype}")
        return value.to(dtype=dtype, device=device)
    return torch.tensor(_check_depth_number(name, value), dtype=dtype, device=device)


def _is_real_number(value: object) -> bool:
    if type(value) is float or type(value) is int:  # the common case, without the ABC check
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _check_depth_number(name: str, value: object) -> float:
    """A depth given as a number: finite and >= 0, as a float."""
    if not _is_real_number(value):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__} {_short(value)}")
    if not (math.isfinite(float(value)) and float(value) >= 0):
        raise ValueError(f"{name}: expected a finite value >= 0, got {value}")
    return float(value)


def check_depth_range(max_depth: object, min_depth: object, dtype: torch.dtype,
                      device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
    """(max_depth, min_depth) as 0-dim tensors; the order of two Python numbers is
    checked now (min_depth = 0 stands for the focal length + 2e-6, checked later)."""
    far = check_depth("max_depth", max_depth, dtype, device)
    near = check_depth("min_depth", min_depth, dtype, device)
    numbers_given = not isinstance(max_depth, torch.Tensor) and not isinstance(min_depth, torch.Tensor)
    if numbers_given:
        _check_depth_order(max_depth, min_depth)
    return far, near


def depth_numbers(max_depth: object, min_depth: object) -> Optional[Tuple[float, float]]:
    """(min_depth, max_depth) as floats when both are plain real numbers, else None.

    Plain numbers can go to the native camera conversion, which resolves the near/far
    depths itself (no tensors built from them); tensors keep their graph on the torch path.
    """
    if _is_real_number(max_depth) and _is_real_number(min_depth):
        return float(min_depth), float(max_depth)
    return None


def check_depth_numbers(max_depth: object, min_depth: object) -> None:
    """check_depth_range for two plain numbers, without making tensors of them."""
    _check_depth_number("max_depth", max_depth)
    _check_depth_number("min_depth", min_depth)
    _check_depth_order(max_depth, min_depth)


def _check_depth_order(max_depth: object, min_depth: object) -> None:
    if float(max_depth) <= float(min_depth):
        raise ValueError(f"max_depth: expected > min_depth ({min_depth}), got {max_depth}")


def add_depth_checks(checks: "DeferredValueChecks", near: torch.Tensor, far: torch.Tensor,
                     focal: torch.Tensor, orthographic: bool, max_depth: object, min_depth: object) -> None:
    """Deferred checks of the resolved depth range [B] against the focal lengths [B]."""
    checks.add(~(torch.isfinite(far).all() & torch.isfinite(near).all()), lambda: fail(
        f"max_depth, min_depth: expected finite values, got {_short(max_depth)}, {_short(min_depth)}"))
    checks.add((near < 0).any(), lambda: fail(f"min_depth: expected >= 0, got {_short(min_depth)}"))
    if not orthographic:
        checks.add((near <= focal).any(), lambda: fail(
            f"min_depth: expected > the focal length {focal.max().item()} (or 0: focal length + 2e-6), "
            f"got {_short(min_depth)}"))
    checks.add((far <= near).any(), lambda: fail(
        f"max_depth: expected > min_depth ({near.max().item()}), got {_short(max_depth)}"))


def run_camera_checks(checks: "DeferredValueChecks", near: torch.Tensor, far: torch.Tensor, focal: torch.Tensor,
                      camera: torch.Tensor, orthographic: bool, max_depth: object, min_depth: object,
                      source: str) -> None:
    """Adds the depth-range checks (add_depth_checks) and, as a backstop for any
    degenerate camera (rotation, sensor) the earlier checks miss, finiteness of the
    converted camera [B, 13+] (``source`` names where it came from); then runs all of the
    call's checks."""
    add_depth_checks(checks, near, far, focal, orthographic, max_depth, min_depth)
    checks.finite(f"camera (converted from {source})", camera)
    checks.run()


def check_call_settings(gamma: object, percent_allowed_difference: object, max_n_hits: object, mode: object,
                        return_forward_info: object) -> Tuple[float, float, int, int, bool]:
    """(gamma, percent, hit cap (-1: unlimited), mode, want forward info) of one call."""
    gamma = check_float("gamma", gamma, MIN_GAMMA, MAX_GAMMA)
    percent = check_float("percent_allowed_difference", percent_allowed_difference, 0.0, 1.0, high_open=True)
    if max_n_hits is None:
        hit_cap = -1
    else:
        hit_cap = check_int("max_n_hits", max_n_hits, 1)
        if hit_cap >= MAX_SPHERES:  # at least every sphere (Pulsar's default 2^32 - 1 included)
            hit_cap = -1
    mode = check_int("mode", mode, 0, 1)
    return gamma, percent, hit_cap, mode, check_bool("return_forward_info", return_forward_info)


def check_batch(batch: int, width: int, height: int, name: str = "batch size") -> None:
    """B >= 1 and B * tiles per image within the native limit of 2^31 - 1 tiles per call."""
    if batch < 1:
        raise ValueError(f"{name}: expected at least 1 camera/scene in the batch, got {batch}")
    tiles = math.ceil(width / TILE_SIZE) * math.ceil(height / TILE_SIZE)
    if batch * tiles > MAX_TILES_PER_CALL:
        raise ValueError(f"{name}: expected at most {MAX_TILES_PER_CALL // tiles} images of {width}x{height} "
                         f"pixels per call ({tiles} tiles of {TILE_SIZE}x{TILE_SIZE} each, at most 2^31 - 1 "
                         f"tiles per call), got {batch}; split the batch")


# ---------------------------------------------------------------------------- tensors
def check_tensor(name: str, t: object, *, dims: Sequence[int], last: Optional[int] = None,
                 dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None) -> torch.Tensor:
    """Type, dtype, device and rank of one tensor argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float32 or float64, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(
            f"{name}: expected dtype {dtype} like vert_pos (mixed dtypes are not cast), got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the renderer's device; move the renderer "
                         f"with .to(device)), got {t.device}")
    if t.dim() not in dims:
        want = " or ".join(str(d) for d in dims)
        raise ValueError(f"{name}: expected {want} dimension{'' if dims == (1,) else 's'}, "
                         f"got shape {tuple(t.shape)}")
    if last is not None and t.shape[-1] != last:
        raise ValueError(f"{name}: expected a last dimension of {last}, got shape {tuple(t.shape)}")
    return t


@functools.lru_cache(maxsize=32)
def _default_background(n_channels: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Ones [C]: the default background, made once per (C, dtype, device) rather than per
    call (a fill kernel and an allocation before the first kernel of every frame). The
    native core only reads it."""
    return torch.ones(n_channels, dtype=dtype, device=device)


def check_scene(vert_pos: object, vert_col: object, vert_rad: object, opacity: object, bg_col: object, *,
                n_channels: int, device: torch.device, max_num_balls: Optional[int],
                checks: Optional["DeferredValueChecks"]):
    """Sphere tensors of one call.

    vert_pos [B?, N, 3], vert_col [B?, N, C], vert_rad [B?, N], opacity [B?, N] or None,
    bg_col [C] or None (ones). Returns contiguous (pos, col, rad, opacity, bg, batched).
    Value checks are added to ``checks`` (None: skipped).
    """
    if _plain_scene(vert_pos, vert_col, vert_rad, opacity, bg_col, n_channels, device, max_num_balls):
        return _scene_tensors(vert_pos, vert_col, vert_rad, opacity,
                              _default_background(n_channels, vert_pos.dtype, vert_pos.device), checks)
    pos = check_tensor("vert_pos", vert_pos, dims=(2, 3), last=3)
    dtype = pos.dtype
    check_tensor("vert_pos", pos, dims=(2, 3), device=device)
    col = check_tensor("vert_col", vert_col, dims=(pos.dim(),), last=n_channels, dtype=dtype, device=device)
    rad = check_tensor("vert_rad", vert_rad, dims=(pos.dim() - 1,), dtype=dtype, device=device)
    n = pos.shape[-2]
    if pos.dim() == 3 and pos.shape[0] == 0:
        raise ValueError(f"vert_pos: expected a batch of at least 1 sphere set, got shape {tuple(pos.shape)}")
    if col.shape[:-1] != pos.shape[:-1]:
        raise ValueError(f"vert_col: expected shape {tuple(pos.shape[:-1]) + (n_channels,)} "
                         f"to match vert_pos {tuple(pos.shape)}, got {tuple(col.shape)}")
    if rad.shape != pos.shape[:-1]:
        raise ValueError(f"vert_rad: expected shape {tuple(pos.shape[:-1])} to match vert_pos "
                         f"{tuple(pos.shape)}, got {tuple(rad.shape)}")
    if opacity is not None:
        check_tensor("opacity", opacity, dims=(pos.dim() - 1,), dtype=dtype, device=device)
        if opacity.shape != pos.shape[:-1]:
            raise ValueError(f"opacity: expected shape {tuple(pos.shape[:-1])} to match vert_pos, "
                             f"got {tuple(opacity.shape)}")
    if bg_col is None:
        bg = _default_background(n_channels, dtype, pos.device)
    else:
        bg = check_tensor("bg_col", bg_col, dims=(1,), last=n_channels, dtype=dtype, device=device)
    if max_num_balls is not None and n > max_num_balls:
        raise ValueError(f"vert_pos: expected at most max_num_balls={max_num_balls} spheres, got {n}")
    if n > MAX_SPHERES:
        raise ValueError(f"vert_pos: expected at most 2^31 - 1 spheres (ids are int32), got {n}")
    return _scene_tensors(pos, col, rad, opacity, bg, checks)


def _plain_scene(pos: object, col: object, rad: object, opacity: object, bg_col: object, n_channels: int,
                 device: torch.device, max_num_balls: Optional[int]) -> bool:
    """True when check_scene's checks certainly pass and bg_col is None: the common call
    (float tensors of matching shapes on the renderer's device), tested in one function
    with no messages built. On the lent GPU machine's host the checks' Python is time
    the device waits for at the start of every frame; False takes the full checks, which
    say what is wrong."""
    if bg_col is not None or not (isinstance(pos, torch.Tensor) and isinstance(col, torch.Tensor)
                                  and isinstance(rad, torch.Tensor)):
        return False
    dtype, shape = pos.dtype, pos.shape
    if (dtype is not torch.float32 and dtype is not torch.float64) or col.dtype is not dtype or rad.dtype is not dtype:
        return False
    rank = len(shape)
    if not (rank == 2 or (rank == 3 and shape[0] > 0)) or shape[-1] != 3:
        return False
    lead = shape[:-1]
    if rad.shape != lead or col.dim() != rank or col.shape[-1] != n_channels or col.shape[:-1] != lead:
        return False
    if opacity is not None and not (isinstance(opacity, torch.Tensor) and opacity.dtype is dtype
                                    and opacity.shape == lead and opacity.device == device):
        return False
    n = shape[-2]
    return (pos.device == device and col.device == device and rad.device == device and n <= MAX_SPHERES
            and (max_num_balls is None or n <= max_num_balls))


def _scene_tensors(pos: torch.Tensor, col: torch.Tensor, rad: torch.Tensor, opacity: Optional[torch.Tensor],
                   bg: torch.Tensor, checks: Optional["DeferredValueChecks"]):
    """check_scene's result for checked tensors; their value checks added to ``checks``."""
    if checks is not None:
        limit = magnitude_limit(pos.dtype)
        checks.bounded("vert_pos", pos, limit)
        checks.finite("vert_col", col)
        checks.bounded("vert_rad", rad, limit)
        checks.in_range("vert_rad", rad, 0.0, limit, low_open=True)
        checks.finite("bg_col", bg)
        if opacity is not None:
            checks.finite("opacity", opacity)
            checks.in_range("opacity", opacity, 0.0, 1.0)
    return (pos.contiguous(), col.contiguous(), rad.contiguous(),
            None if opacity is None else opacity.contiguous(), bg.contiguous(), pos.dim() == 3)


def plain_camera_batch(cam_params: object, pos: torch.Tensor, device: torch.device) -> int:
    """B of camera vectors that check_cam_params would accept as they are, with no value
    checks wanted: [L] (B = 1) or [B, L] contiguous, of pos's dtype, on ``device``, L in
    {8, 10, 11, 13}, B >= 1 and, with batched spheres, pos's batch. 0 otherwise (the
    caller then runs check_cam_params, which says what is wrong). The hot path then reads
    the vectors through their pointer, with no view or detached alias built per frame."""
    if not isinstance(cam_params, torch.Tensor) or cam_params.dtype is not pos.dtype:
        return 0
    shape = cam_params.shape
    rank = len(shape)
    batch = 1 if rank == 1 else (shape[0] if rank == 2 else 0)
    if batch < 1 or shape[-1] not in VALID_PARAM_LENGTHS or (pos.dim() == 3 and batch != pos.shape[0]):
        return 0
    return batch if cam_params.device == device and cam_params.is_contiguous() else 0


def check_cam_params(cam_params: object, pos: torch.Tensor, *, device: torch.device, orthographic: bool,
                     checks: Optional["DeferredValueChecks"], name: str = "cam_params") -> torch.Tensor:
    """Pulsar camera vectors [B?, L], L in {8, 10, 11, 13} -> [B, L], expanded to the
    sphere batch when spheres are batched and one camera is given.

    Layout: position (3), rotation (axis-angle 3 or 6D 6), focal length, sensor width,
    optionally principal-point offsets (2, pixels).
    """
    cams = check_tensor(name, cam_params, dims=(1, 2), dtype=pos.dtype, device=device)
    length = cams.shape[-1]
    if length not in VALID_PARAM_LENGTHS:
        raise ValueError(f"{name}: expected a last dimension of 8, 10, 11 or 13 values, "
                         f"got shape {tuple(cams.shape)}")
    cams = cams if cams.dim() == 2 else cams[None]
    if cams.shape[0] == 0:
        raise ValueError(f"{name}: expected at least 1 camera, got shape {tuple(cam_params.shape)}")
    if pos.dim() == 3 and cams.shape[0] != pos.shape[0]:
        if cams.shape[0] != 1:
            raise ValueError(f"{name}: expected 1 camera or a batch of {pos.shape[0]} cameras like vert_pos, "
                             f"got {cams.shape[0]}")
        cams = cams.expand(pos.shape[0], -1)
    if checks is None:
        return cams
    checks.bounded(name, cams, magnitude_limit(cams.dtype))
    n_rot = 6 if length in (11, 13) else 3
    focal, sensor = cams[:, 3 + n_rot], cams[:, 4 + n_rot]
    checks.add((sensor <= 0).any(), lambda: fail(
        f"{name}: expected sensor width (index {4 + n_rot}) > 0, got {sensor.min().item()}"))
    if orthographic:
        checks.add((focal != 0).any(), lambda: fail(
            f"{name}: expected focal length (index {3 + n_rot}) 0 for an orthographic renderer, "
            f"got {focal.abs().max().item()}"))
    else:
        checks.add((focal <= 0).any(), lambda: fail(
            f"{name}: expected focal length (index {3 + n_rot}) > 0, got {focal.min().item()}"))
    if n_rot == 6:
        # Gram-Schmidt of the two rows needs them non-zero and not parallel.
        a1, a2 = cams[:, 3:6], cams[:, 6:9]
        sine = torch.linalg.cross(a1, a2).norm(dim=-1) / (a1.norm(dim=-1) * a2.norm(dim=-1))
        checks.add(~(sine > 1e-6).all(), lambda: fail(
            f"{name}: expected a 6D rotation (indices 3..8) of two non-zero, non-parallel rows, got "
            f"rows {cams[:, 3:6][~(sine > 1e-6)][0].tolist()} and {cams[:, 6:9][~(sine > 1e-6)][0].tolist()}"))
    return cams


def check_forward_info(name: str, result_info: object) -> torch.Tensor:
    """Forward info [B?, H, W, 3 + 2K] (K >= 1) of a float dtype."""
    info = check_tensor(name, result_info, dims=(3, 4))
    width = info.shape[-1]
    if width < 5 or (width - 3) % 2 != 0:
        raise ValueError(f"{name}: expected a last dimension of 3 + 2K (K >= 1: forward info), "
                         f"got shape {tuple(info.shape)}")
    return info


# ----------------------------------------------------------------------- value checks
def check_finite(name: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise ValueError(f"{name}: expected finite values, got {t[tuple(bad)].item()} at index {bad}")


def check_bounded(name: str, t: torch.Tensor, limit: float) -> None:
    check_finite(name, t)
    if bool((t.abs() > limit).any()):
        bad = (t.abs() > limit).nonzero()[0].tolist()
        raise ValueError(f"{name}: expected |values| <= {limit:.3g} for {t.dtype} (squared distances must "
                         f"not overflow), got {t[tuple(bad)].item()} at index {bad}")


def check_range(name: str, t: torch.Tensor, low: float, high: float, *, low_open: bool = False) -> None:
    bad = (t <= low if low_open else t < low) | (t > high)
    if bool(bad.any()):
        idx = bad.nonzero()[0].tolist()
        span = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name}: expected values in {span}, got {t[tuple(idx)].item()} at index {idx}")


def fail(message: str) -> None:
    raise ValueError(message)


class DeferredValueChecks:
    """Value checks whose verdicts are read from the device in one synchronisation.

    Each check adds a 0-dim boolean tensor that is True when the input is bad, and a
    function that raises the detailed error. ``run()`` stacks the verdicts and reads them
    once (one GPU sync for any number of checks); only a failing check pays for its
    detailed message. Empty tensors pass every check.
    """

    def __init__(self) -> None:
        self._items: list = []

    def add(self, bad: torch.Tensor, raise_error: Callable[[], None]) -> None:
        self._items.append((bad.reshape(()), raise_error))

    def finite(self, name: str, t: torch.Tensor) -> None:
        self.add(~torch.isfinite(t).all(), lambda: check_finite(name, t))

    def bounded(self, name: str, t: torch.Tensor, limit: float) -> None:
        """Finite and |t| <= limit, in one reduction (NaN fails the comparison)."""
        self.add(~(t.abs() <= limit).all(), lambda: check_bounded(name, t, limit))

    def in_range(self, name: str, t: torch.Tensor, low: float, high: float, *, low_open: bool = False) -> None:
        bad = ((t <= low) if low_open else (t < low)) | (t > high)
        self.add(bad.any(), lambda: check_range(name, t, low, high, low_open=low_open))

    def run(self) -> None:
        if not self._items:
            return
        verdicts = torch.stack([bad for bad, _ in self._items]).tolist()
        for verdict, (_, raise_error) in zip(verdicts, self._items):
            if verdict:
                raise_error()
        self._items.clear()


def _short(value: object, limit: int = 60) -> str:
    """repr of a value for a message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
