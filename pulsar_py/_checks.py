"""The renderer's input rules, in one place, built on the checks of one value or tensor
in ``_arguments.py``.

Every check raises ValueError (bad value, shape, device) or TypeError (bad type or dtype)
naming the argument, what was expected and what was given. Checks come in two kinds:

* structural checks (types, dtypes, devices, shapes, layouts, Python numbers): always on,
  before the operator call. They read tensor metadata only, so torch.compile traces them
  without a graph break.
* value checks that read tensor contents (NaN/Inf, magnitudes, radius > 0, opacity in
  [0, 1], focal length, sensor width, depth range against the focal length): run by the
  operator's kernel (``check_values``) just before the native call, collected in
  ``DeferredValueChecks`` and read back together, in one device synchronisation on CUDA.
  ``Renderer.check_values = False`` switches them off for a pipeline known to be sound
  (docs/reliability.md).

Inputs need not be contiguous: the operators make them contiguous (a copy only when they
are not) for the native call.
"""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

from . import camera_layouts as _layouts
from ._arguments import (  # noqa: F401 - the package reads them here with the rules built on them
    MAX_IMAGE_SIDE,
    DeferredValueChecks,
    check_bool,
    check_float,
    check_int,
    check_readable,
    check_tensor,
    fail,
    in_interval,
    short_repr,
)

if TYPE_CHECKING:
    from .render_settings import RenderSettings

# Lengths of a Pulsar camera vector and of a packed camera (camera_layouts.py).
VALID_PARAM_LENGTHS = _layouts.VALID_PARAM_LENGTHS
PACKED_CAMERA = _layouts.PACKED.SIZE
MAX_TRACK = 128  # n_track (kMaxTrack)
MAX_SPHERES = 2**31 - 1  # sphere ids are int32
MAX_CHANNELS = 2**20  # features per sphere: far beyond any use, and bounded before allocation
MAX_THREADS = 4096  # CPU threads of one renderer
TILE_SIZE = 16  # pixels per tile side (native/core/tiling.h)
MAX_TILES_PER_CALL = 2**31 - 1  # B * tiles per image: tiles are numbered in 31 bits
MIN_GAMMA, MAX_GAMMA = 1e-5, 1.0
# Pulsar's "unlimited" max_n_hits; any cap >= MAX_SPHERES never binds either.
UNLIMITED_HITS = 2**32 - 1
#: Names of the argument a camera came in (RenderSettings.camera_argument), for messages.
CAMERA_ARGUMENTS = ("cam_params", "camera")
# min_depth = 0 stands for the focal length plus this, or the next representable value
# above the focal length where the sum rounds back to it (docs/model.md section 1).
NEAR_OFFSET = 2e-6


def magnitude_limit(dtype: torch.dtype) -> float:
    """Largest |value| accepted for positions, radii and camera vectors of ``dtype``.

    The renderer squares distances (|c|^2, r^2): sqrt(max) / 1000 leaves room for sums
    of squares and products with pixel sizes. float32: 1.8e16; float64: 1.3e151.
    """
    return math.sqrt(torch.finfo(dtype).max) / 1000.0


# ---------------------------------------------------------------------------- scalars
#: A per-call number as the renderer carries it: a Python float (checked), or data that a
#: traced call does not specialise on (a 0-dim floating tensor), whose value the render
#: operator's kernel checks at every call (check_call_numbers).
Setting = Union[float, torch.Tensor]


def is_number(value: object) -> bool:
    """True for a setting that is a Python float (a graph constant when traced)."""
    return type(value) is float


def check_setting(
    name: str, value: object, low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> Setting:
    """A per-call number: a Python number, checked and returned as a float, or a
    one-element floating tensor (shape [] or [1]), checked for its shape and dtype and
    returned 0-dim and not read (its value reaches the operator as data; the kernel
    checks it)."""
    if type(value) is float and in_interval(value, low, high, low_open, high_open):
        return value  # the common case (NaN fails the comparisons), without the checks below
    if isinstance(value, torch.Tensor):
        return _setting_tensor(name, value)
    return check_float(name, value, low, high, low_open=low_open, high_open=high_open)


def _setting_tensor(name: str, value: torch.Tensor) -> torch.Tensor:
    if check_readable(name, value).numel() != 1 or value.dim() > 1 or not value.is_floating_point():
        raise (ValueError if value.is_floating_point() else TypeError)(
            f"{name}: expected a float or a one-element floating tensor (shape [] or [1]), got a tensor of "
            f"shape {tuple(value.shape)} and dtype {value.dtype}"
        )
    return value.reshape(())


class CallSettings(NamedTuple):
    """The checked per-call settings of a render call."""

    gamma: Setting
    percent_allowed_difference: Setting
    max_n_hits: int  # < 0: unlimited


def check_call_settings(gamma: object, percent_allowed_difference: object, max_n_hits: object) -> CallSettings:
    """gamma in [1e-5, 1], p in [0, 1) (numbers, or tensors checked by the kernel),
    max_n_hits >= 1 or None (unlimited)."""
    gamma = check_setting("gamma", gamma, MIN_GAMMA, MAX_GAMMA)
    percent = check_setting("percent_allowed_difference", percent_allowed_difference, 0.0, 1.0, high_open=True)
    if max_n_hits is None:
        hit_cap = -1
    else:
        hit_cap = check_int("max_n_hits", max_n_hits, 1)
        if hit_cap >= MAX_SPHERES:  # at least every sphere (Pulsar's default 2^32 - 1 included)
            hit_cap = -1
    return CallSettings(gamma, percent, hit_cap)


def check_call_numbers(gamma: float, percent_allowed_difference: float, min_depth: float, max_depth: float) -> None:
    """The values of a call's settings that came as data (the render operator's values
    tensor), as ``check_call_settings`` and ``check_depths`` check numbers."""
    check_float("gamma", gamma, MIN_GAMMA, MAX_GAMMA)
    check_float("percent_allowed_difference", percent_allowed_difference, 0.0, 1.0, high_open=True)
    near, far = check_depth("min_depth", min_depth), check_depth("max_depth", max_depth)
    if far <= near:
        raise ValueError(f"max_depth: expected > min_depth ({near}), got {far}")


# ----------------------------------------------------------------------------- depths
class DepthRange(NamedTuple):
    """A call's min_depth and max_depth: plain floats (the common case), data (0-dim
    tensors that do not require grad: the render operator reads their values at each
    call), or 0-dim tensors that require grad (the blend exponent depends on them, so they
    stay in the graph)."""

    min_depth: Setting
    max_depth: Setting

    @property
    def differentiable(self) -> bool:
        return any(isinstance(d, torch.Tensor) and d.requires_grad for d in self)

    @property
    def numbers(self) -> bool:
        return type(self.min_depth) is float and type(self.max_depth) is float


def _is_real_number(value: object) -> bool:
    if type(value) is float or type(value) is int:  # the common case, without the ABC check
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_depth(name: str, value: object) -> Setting:
    """A depth: a real number, finite and >= 0, as a float; or a one-element floating
    tensor (0-dim), whose value is checked where it is read (the render operator's
    kernel, or the value checks of a differentiable depth)."""
    if isinstance(value, torch.Tensor):
        return _setting_tensor(name, value)
    if not _is_real_number(value):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__} {short_repr(value)}")
    value = float(value)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name}: expected a finite value >= 0, got {value}")
    return value


def check_depths(max_depth: object, min_depth: object) -> DepthRange:
    """The depth range of a call; two numbers are checked for order here (min_depth = 0
    stands for the focal length + 2e-6 and is checked against it with the values)."""
    if type(max_depth) is float and type(min_depth) is float and 0.0 <= min_depth < max_depth < math.inf:
        return DepthRange(min_depth, max_depth)  # the common case
    far = check_depth("max_depth", max_depth)
    near = check_depth("min_depth", min_depth)
    if type(far) is float and type(near) is float and far <= near:
        raise ValueError(f"max_depth: expected > min_depth ({near}), got {far}")
    return DepthRange(near, far)


def depth_like(depth: Setting, like: torch.Tensor) -> torch.Tensor:
    """``depth`` (a number or a 0-dim tensor, on any device) as a tensor of ``like``'s
    shape, dtype and device."""
    if isinstance(depth, torch.Tensor):
        return depth.to(device=like.device, dtype=like.dtype).expand_as(like)
    return torch.full_like(like, depth)


def near_for_focal(focal: torch.Tensor) -> torch.Tensor:
    """What min_depth = 0 stands for (docs/model.md section 1): the focal length + 2e-6 in
    its dtype, or the next representable value above it where that sum rounds back to the
    focal length (float32 from 64 on); derivative 1 either way. Rounded like the native
    conversion (include/pulsar/camera_params.h, near_for_focal). Any value above the focal
    length is at least the next one above it, so the rule is their maximum."""
    plain = focal + NEAR_OFFSET
    fixed = focal.detach()
    near = torch.maximum(plain.detach(), torch.nextafter(fixed, fixed.new_full((), math.inf)))
    if not (focal.requires_grad and torch.is_grad_enabled()):
        return near
    return plain + (near - plain.detach())  # near's value (the difference is exact), plain's derivative


def resolve_near(min_depth: Union[float, torch.Tensor], focal: torch.Tensor) -> torch.Tensor:
    """[B] near depths: ``min_depth``, or where it is 0 ``near_for_focal(focal)``, in the
    dtype and on the device of ``focal`` (a tensor ``min_depth`` may be on another)."""
    near = near_for_focal(focal)
    if isinstance(min_depth, torch.Tensor):
        depth = min_depth.to(device=focal.device, dtype=focal.dtype)
        return torch.where(depth == 0, near, depth.expand_as(focal))
    return near if min_depth == 0 else torch.full_like(focal, min_depth)


def check_batch(batch: int, width: int, height: int, name: str = "batch size") -> None:
    """B >= 1 and B * tiles per image within the native limit of 2^31 - 1 tiles per call."""
    if batch < 1:
        raise ValueError(f"{name}: expected at least 1 camera/scene in the batch, got {batch}")
    tiles = -(-width // TILE_SIZE) * -(-height // TILE_SIZE)
    if batch * tiles > MAX_TILES_PER_CALL:
        raise ValueError(
            f"{name}: expected at most {MAX_TILES_PER_CALL // tiles} images of {width}x{height} "
            f"pixels per call ({tiles} tiles of {TILE_SIZE}x{TILE_SIZE} each, at most 2^31 - 1 "
            f"tiles per call), got {batch}; split the batch"
        )


# ---------------------------------------------------------------------------- tensors
class SceneTensors(NamedTuple):
    """The sphere tensors of a call, checked (shapes [B?, N, ...] as given)."""

    positions: torch.Tensor  # [B?, N, 3]
    features: torch.Tensor  # [B?, N, C]
    radii: torch.Tensor  # [B?, N]
    opacities: Optional[torch.Tensor]  # [B?, N] or None
    background: Optional[torch.Tensor]  # [C] or None (ones)

    @property
    def batched(self) -> bool:
        return self.positions.dim() == 3


def check_scene(
    vert_pos: object,
    vert_col: object,
    vert_rad: object,
    opacity: object,
    bg_col: object,
    *,
    n_channels: int,
    device: torch.device,
    max_num_balls: Optional[int],
) -> SceneTensors:
    """Sphere tensors of one call: vert_pos [B?, N, 3], vert_col [B?, N, C], vert_rad
    [B?, N], opacity [B?, N] or None, bg_col [C] or None (ones)."""
    if _plain_scene(vert_pos, vert_col, vert_rad, opacity, bg_col, n_channels, device, max_num_balls):
        return SceneTensors(vert_pos, vert_col, vert_rad, opacity, None)
    pos = check_tensor("vert_pos", vert_pos, dims=(2, 3), last=3)
    check_tensor("vert_pos", pos, dims=(2, 3), device=device)
    scene = _check_spheres(SCENE_NAMES, pos, vert_col, vert_rad, opacity, bg_col, n_channels, dict(device=device))
    n = pos.shape[-2]
    if max_num_balls is not None and n > max_num_balls:
        raise ValueError(f"vert_pos: expected at most max_num_balls={max_num_balls} spheres, got {n}")
    return scene


#: The names of the sphere tensors in messages: the renderer's arguments, and the render
#: operator's (pulsar::render, checked by check_operands).
SCENE_NAMES = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col")
OPERAND_NAMES = ("positions", "features", "radii", "opacities", "background")


def _check_spheres(
    names: Sequence[str], pos: torch.Tensor, col, rad, opacity, bg, n_channels: int, where: dict
) -> SceneTensors:
    """The rules of a call's sphere tensors given positions [B?, N, 3] (checked): ranks,
    dtypes (pos's), devices (``where``: check_tensor's device arguments) and shapes
    matching pos, at least one sphere set and at most 2^31 - 1 spheres."""
    p, c, r, o, b = names
    dtype = pos.dtype
    col = check_tensor(c, col, dims=(pos.dim(),), last=n_channels, dtype=dtype, like=p, **where)
    rad = check_tensor(r, rad, dims=(pos.dim() - 1,), dtype=dtype, like=p, **where)
    n = pos.shape[-2]
    if pos.dim() == 3 and pos.shape[0] == 0:
        raise ValueError(f"{p}: expected a batch of at least 1 sphere set, got shape {tuple(pos.shape)}")
    if col.shape[:-1] != pos.shape[:-1]:
        raise ValueError(
            f"{c}: expected shape {tuple(pos.shape[:-1]) + (n_channels,)} "
            f"to match {p} {tuple(pos.shape)}, got {tuple(col.shape)}"
        )
    if rad.shape != pos.shape[:-1]:
        raise ValueError(
            f"{r}: expected shape {tuple(pos.shape[:-1])} to match {p} {tuple(pos.shape)}, got {tuple(rad.shape)}"
        )
    if opacity is not None:
        check_tensor(o, opacity, dims=(pos.dim() - 1,), dtype=dtype, like=p, **where)
        if opacity.shape != pos.shape[:-1]:
            raise ValueError(f"{o}: expected shape {tuple(pos.shape[:-1])} to match {p}, got {tuple(opacity.shape)}")
    if bg is not None:
        check_tensor(b, bg, dims=(1,), last=n_channels, dtype=dtype, like=p, **where)
    if n > MAX_SPHERES:
        raise ValueError(f"{p}: expected at most 2^31 - 1 spheres (ids are int32), got {n}")
    return SceneTensors(pos, col, rad, opacity, bg)


def check_operands(
    positions: object,
    features: object,
    radii: object,
    opacities: object,
    background: object,
    cameras: object,
    camera_length: int,
    batch_dim: bool,
) -> None:
    """The structural rules of a direct pulsar::render call (the renderer checks its own
    arguments, with its own names, before it calls the operator): the sphere tensors as
    ``check_scene`` takes them, on positions' device; cameras [B, 15] packed
    (``camera_length`` 0) or [B, camera_length] Pulsar camera vectors ([15] or [L]: one
    camera), of positions' dtype and device, one per sphere set when the spheres are
    batched; one camera when the outputs drop the batch (``batch_dim`` False)."""
    pos = check_tensor("positions", positions, dims=(2, 3), last=3, like="positions")
    where = dict(device=pos.device, device_of="positions' device")
    _check_spheres(OPERAND_NAMES, pos, features, radii, opacities, background, _channels(features), where)
    if camera_length not in (0,) + VALID_PARAM_LENGTHS:
        raise ValueError(f"settings.camera_length: expected 0, 8, 10, 11 or 13, got {camera_length}")
    length = camera_length or PACKED_CAMERA
    cams = check_tensor("cameras", cameras, dims=(1, 2), last=length, dtype=pos.dtype, like="positions", **where)
    batch = cams.shape[0] if cams.dim() == 2 else 1
    if batch < 1 or (pos.dim() == 3 and batch != pos.shape[0]):
        want = f"{pos.shape[0]} (one per sphere set of positions)" if pos.dim() == 3 else "at least 1"
        raise ValueError(f"cameras: expected {want} cameras, got shape {tuple(cams.shape)}")
    if not batch_dim and batch != 1:
        raise ValueError(f"cameras: expected 1 camera for outputs without a batch dimension, got {batch}")


def _channels(features: object) -> int:
    """C of features [B?, N, C] (1 when it has no dimension: the check names the rank)."""
    return features.shape[-1] if isinstance(features, torch.Tensor) and features.dim() > 0 else 1


def _plain_scene(
    pos: object,
    col: object,
    rad: object,
    opacity: object,
    bg_col: object,
    n_channels: int,
    device: torch.device,
    max_num_balls: Optional[int],
) -> bool:
    """True when check_scene's checks certainly pass and bg_col is None: the common call
    (dense float tensors of matching shapes on the renderer's device), tested with no
    messages built; False takes the full checks, which say what is wrong."""
    if bg_col is not None or not (
        isinstance(pos, torch.Tensor) and isinstance(col, torch.Tensor) and isinstance(rad, torch.Tensor)
    ):
        return False
    dtype, shape = pos.dtype, pos.shape
    if (dtype is not torch.float32 and dtype is not torch.float64) or col.dtype is not dtype or rad.dtype is not dtype:
        return False
    if pos.layout != torch.strided or col.layout != torch.strided or rad.layout != torch.strided or pos.is_meta:
        return False
    rank = len(shape)
    if not (rank == 2 or (rank == 3 and shape[0] > 0)) or shape[-1] != 3:
        return False
    lead = shape[:-1]
    if rad.shape != lead or col.dim() != rank or col.shape[-1] != n_channels or col.shape[:-1] != lead:
        return False
    if opacity is not None and not (
        isinstance(opacity, torch.Tensor)
        and opacity.dtype is dtype
        and opacity.shape == lead
        and opacity.device == device
        and opacity.layout == torch.strided
    ):
        return False
    n = shape[-2]
    return (
        pos.device == device
        and col.device == device
        and rad.device == device
        and n <= MAX_SPHERES
        and (max_num_balls is None or n <= max_num_balls)
    )


def plain_camera_vectors(cam_params: object, pos: torch.Tensor, device: torch.device) -> bool:
    """True when check_cam_params would accept ``cam_params`` as they are: dense camera
    vectors [L] or [B, L] (L in {8, 10, 11, 13}, B >= 1 and pos's batch when the spheres
    are batched) of pos's dtype on ``device``; False takes the full checks."""
    kind = type(cam_params)
    if (
        not (kind is torch.Tensor or kind is torch.nn.Parameter)
        or cam_params.dtype is not pos.dtype
        or cam_params.is_nested
    ):
        return False
    shape = cam_params.shape
    rank = len(shape)
    if rank == 1:
        if pos.dim() == 3:
            return False
    elif rank != 2 or shape[0] < 1 or (pos.dim() == 3 and shape[0] != pos.shape[0]):
        return False
    return (
        shape[-1] in VALID_PARAM_LENGTHS
        and cam_params.layout is torch.strided
        and cam_params.device == device
        and not cam_params.is_meta
    )


def check_cam_params(
    cam_params: object, pos: torch.Tensor, *, device: torch.device, name: str = "cam_params"
) -> torch.Tensor:
    """Pulsar camera vectors [B?, L], L in {8, 10, 11, 13} -> [B, L], expanded to the
    sphere batch when spheres are batched and one camera is given.

    Layout: position (3), rotation (axis-angle 3 or 6D 6), focal length, sensor width,
    optionally principal-point offsets (2, pixels). Their values are checked by
    ``check_values``.
    """
    cams = check_tensor(name, cam_params, dims=(1, 2), dtype=pos.dtype, device=device)
    length = cams.shape[-1]
    if length not in VALID_PARAM_LENGTHS:
        raise ValueError(f"{name}: expected a last dimension of 8, 10, 11 or 13 values, got shape {tuple(cams.shape)}")
    cams = cams if cams.dim() == 2 else cams[None]
    if cams.shape[0] == 0:
        raise ValueError(f"{name}: expected at least 1 camera, got shape {tuple(cam_params.shape)}")
    if pos.dim() == 3 and cams.shape[0] != pos.shape[0]:
        if cams.shape[0] != 1:
            raise ValueError(
                f"{name}: expected 1 camera or a batch of {pos.shape[0]} cameras like vert_pos, got {cams.shape[0]}"
            )
        cams = cams.expand(pos.shape[0], -1)
    return cams


def check_forward_info(name: str, result_info: object) -> torch.Tensor:
    """Forward info [B?, H, W, 3 + 2K] (K >= 1) of a float dtype."""
    info = check_tensor(name, result_info, dims=(3, 4))
    width = info.shape[-1]
    if width < 5 or (width - 3) % 2 != 0:
        raise ValueError(
            f"{name}: expected a last dimension of 3 + 2K (K >= 1: forward info), got shape {tuple(info.shape)}"
        )
    return info


# ----------------------------------------------------------------------- value checks
def check_values(
    positions: torch.Tensor,
    features: torch.Tensor,
    radii: torch.Tensor,
    opacities: Optional[torch.Tensor],
    background: torch.Tensor,
    cameras: torch.Tensor,
    settings: "RenderSettings",
) -> None:
    """The value checks of a render call (one read-back), on the operator's inputs:
    sphere values, then the cameras: Pulsar camera vectors [B, L] (named cam_params) and
    their depth range, or packed cameras [B, 15] (named camera) with their resolved
    near and far depths."""
    checks = DeferredValueChecks()
    cameras = cameras if cameras.dim() == 2 else cameras[None]
    limit = magnitude_limit(positions.dtype)
    checks.bounded("vert_pos", positions, limit)
    checks.finite("vert_col", features)
    checks.bounded("vert_rad", radii, limit)
    checks.in_range("vert_rad", radii, 0.0, limit, low_open=True)
    checks.finite("bg_col", background)
    if opacities is not None:
        checks.finite("opacity", opacities)
        checks.in_range("opacity", opacities, 0.0, 1.0)
    camera, orthographic = settings.camera, settings.config.orthographic
    name = CAMERA_ARGUMENTS[int(camera.camera_argument)]
    if camera.camera_length:
        focal = add_camera_vector_checks(checks, cameras, orthographic, name)
        near = resolve_near(camera.min_depth, torch.zeros_like(focal) if orthographic else focal)
        far = torch.full_like(near, camera.max_depth)
        add_depth_checks(checks, near, far, focal, orthographic, camera.min_depth, camera.max_depth)
    else:
        checks.finite(f"{name} (as packed cameras)", cameras)
        packed = _layouts.PACKED
        add_depth_checks(
            checks,
            packed.near(cameras),
            packed.far(cameras),
            packed.focal(cameras),
            orthographic,
            "the camera's",
            "the camera's",
        )
    checks.run()


def check_visible_values(
    positions: torch.Tensor,
    radii: torch.Tensor,
    cam_params: Optional[torch.Tensor],
    packed: torch.Tensor,
    orthographic: bool,
    depths: DepthRange,
) -> None:
    """The value checks of ``Renderer.visible`` (one read-back), as a render call's: the
    spheres' positions and radii, the camera vectors ``cam_params`` [B, L] (None for a
    ``pulsar_py.Camera``, which checks its own values), and the depth range of the packed
    cameras [B, 15] against their focal lengths (an infinite far depth: no far culling)."""
    checks = DeferredValueChecks()
    limit = magnitude_limit(positions.dtype)
    checks.bounded("vert_pos", positions, limit)
    checks.bounded("vert_rad", radii, limit)
    checks.in_range("vert_rad", radii, 0.0, limit, low_open=True)
    if cam_params is not None:
        add_camera_vector_checks(checks, cam_params, orthographic, "camera")
    else:
        checks.finite("camera (as packed cameras)", packed[:, :13])
    near, far = _layouts.PACKED.near(packed), _layouts.PACKED.far(packed)
    min_depth = depths.min_depth if not isinstance(depths.min_depth, torch.Tensor) else "a tensor"
    max_depth = depths.max_depth if not isinstance(depths.max_depth, torch.Tensor) else "a tensor"
    if isinstance(depths.max_depth, float) and math.isinf(depths.max_depth):
        far = near + 1  # no far plane: only the near depth is checked
        max_depth = None
    add_depth_checks(checks, near, far, _layouts.PACKED.focal(packed), orthographic, min_depth, max_depth)
    checks.run()


def add_camera_vector_checks(
    checks: "DeferredValueChecks", cams: torch.Tensor, orthographic: bool, name: str = "cam_params"
) -> torch.Tensor:
    """Value checks of Pulsar camera vectors [B, L]; returns their focal lengths [B]."""
    layout = _layouts.CameraVectorLayout.of(cams.shape[-1])
    checks.bounded(name, cams, magnitude_limit(cams.dtype))
    focal, sensor = layout.focal(cams), layout.sensor_width(cams)
    checks.add(
        (sensor <= 0).any(),
        lambda: fail(
            f"{name}: expected sensor width (index {layout.sensor_width_index}) > 0, got {sensor.min().item()}"
        ),
    )
    if orthographic:
        checks.add(
            (focal != 0).any(),
            lambda: fail(
                f"{name}: expected focal length (index {layout.focal_index}) 0 for an orthographic renderer, "
                f"got {focal.abs().max().item()}"
            ),
        )
    else:
        checks.add(
            (focal <= 0).any(),
            lambda: fail(f"{name}: expected focal length (index {layout.focal_index}) > 0, got {focal.min().item()}"),
        )
    if layout.rotation_size == 6:
        # Gram-Schmidt of the two rows needs them non-zero and not parallel.
        rotation = layout.rotation(cams)
        a1, a2 = rotation[:, 0:3], rotation[:, 3:6]
        sine = torch.linalg.cross(a1, a2).norm(dim=-1) / (a1.norm(dim=-1) * a2.norm(dim=-1))
        checks.add(
            ~(sine > 1e-6).all(),
            lambda: fail(
                f"{name}: expected a 6D rotation (indices 3..8) of two non-zero, non-parallel rows, got "
                f"rows {a1[~(sine > 1e-6)][0].tolist()} and {a2[~(sine > 1e-6)][0].tolist()}"
            ),
        )
    return focal


def add_depth_checks(
    checks: "DeferredValueChecks",
    near: torch.Tensor,
    far: torch.Tensor,
    focal: torch.Tensor,
    orthographic: bool,
    min_depth: object,
    max_depth: object,
) -> None:
    """Deferred checks of the resolved depth range [B] against the focal lengths [B]
    (``min_depth``, ``max_depth``: what the caller gave, for the messages)."""
    checks.add(
        ~(torch.isfinite(far).all() & torch.isfinite(near).all()),
        lambda: fail(
            f"max_depth, min_depth: expected finite values, got {short_repr(max_depth)}, {short_repr(min_depth)}"
        ),
    )
    checks.add((near < 0).any(), lambda: fail(f"min_depth: expected >= 0, got {short_repr(min_depth)}"))
    if not orthographic:
        checks.add(
            (near <= focal).any(),
            lambda: fail(
                f"min_depth: expected > the focal length {focal.max().item()} (or 0: focal length + 2e-6), "
                f"got {short_repr(min_depth)} (resolved: {near.min().item()})"
            ),
        )
    checks.add(
        (far <= near).any(),
        lambda: fail(f"max_depth: expected > min_depth ({near.max().item()}), got {short_repr(max_depth)}"),
    )
