"""The renderer as torch.library operators: all PyTorch sees of the native core.

    pulsar::render(positions, features, radii, opacities?, background?, cameras, values?, settings)
        -> (image, blend_state, counts, forward_info, depth_moments, binning, entries)
    pulsar::render_backward(grad_image, grad_depth_moments?, positions, features, radii, opacities?,
                            background?, cameras, values?, image, blend_state, counts, depth_moments,
                            binning, entries, settings, needs) -> (the six gradients)
    pulsar::pack_cameras(camera_vectors, settings) -> packed cameras [B, 15]
    pulsar::pack_cameras_backward(camera_vectors, grad_packed, settings) -> [B, L]

Every entry point of the package reaches the native core through these, and nothing else
calls pybind11: the operators take tensors and plain numbers and have fake kernels
(output shapes without running anything, for torch.compile, torch.export and
FakeTensorMode). ``RenderFunction`` attaches the exact gradient: its forward is
pulsar::render, its backward pulsar::render_backward, for eager and traced calls alike.
The CPU and CUDA kernels are Python functions that make every tensor contiguous, allocate
the outputs and the call's memory with torch (the caller owns outputs; on a captured
stream torch's graph pool then owns them for the graph) and call the pybind11 module.

Shapes (B cameras, N spheres, C channels, K = n_track, image H x W):
    positions [B?, N, 3], features [B?, N, C], radii [B?, N], opacities [B?, N] or None
    (all 1), background [C] or None (ones); cameras [B, 15] packed (include/pulsar/
    camera.h) or [B, L] Pulsar camera vectors, L in {8, 10, 11, 13}, which the native
    call converts (its gradient comes back as [B, L]); values float64 [4] on the scene's
    device (settings.CallValue: gamma, percent_allowed_difference, min_depth, max_depth)
    or None (the numbers in the settings).
    image [B, H, W, C]; blend_state [B, H, W, 2] (m, D); counts int32 [2, B, H, W] (the
    hit count, then the traversal end the backward reads); forward_info [B, H, W, 3 + 2K]
    or [0]; depth_moments [B, H, W, 4] (outputs.DEPTH_STATS) or [0].
    binning uint8 [bytes] and entries int32 [2, capacity]: what the backward reuses of
    its forward (CUDA: the sphere records and the tiles' lists; CPU: a token naming the
    lists the native renderer keeps, and no entries).
    Without ``batch_dim`` (B = 1) the image-shaped outputs have no leading B.

``settings`` is a ``RenderSettings`` encoded as a list of floats (graph constants).
"""

from __future__ import annotations

import math
import threading
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from . import _checks, _native
from .debug import debug_enabled, save_snapshot
from .outputs import DEPTH_STATS
from .settings import PackSettings, RenderSettings

Tensor = torch.Tensor

# The leading fields of RenderSettings that configure a native renderer.
_CONFIG_FIELDS = RenderSettings._fields.index("gamma")

# ------------------------------------------------------------------ native renderers
_natives: Dict[tuple, "_native.Renderer"] = {}
# Reentrant: a Renderer's finalizer (release_natives) may run from the garbage collector
# while this thread holds the lock in native_renderer.
_natives_lock = threading.RLock()


def _device_index(device: torch.device) -> int:
    if device.index is not None:
        return device.index
    return torch.cuda.current_device() if device.type == "cuda" else 0


def native_renderer(settings: RenderSettings, n_channels: int, device: torch.device) -> "_native.Renderer":
    """The native renderer of a Renderer module for a device and configuration, made on
    first use. Keyed by value: a module's id and every configuration field the native
    renderer is built from, so a changed attribute gets a renderer of its own."""
    index = _device_index(device)
    # The configuration fields lead RenderSettings; numbers as they arrive (floats).
    key = (settings[:_CONFIG_FIELDS], n_channels, device.type, index)
    native = _natives.get(key)
    if native is None:
        with _natives_lock:
            native = _natives.get(key)
            if native is None:
                cfg = _native.RendererConfig()
                cfg.width, cfg.height = int(settings.width), int(settings.height)
                cfg.n_channels, cfg.n_track = n_channels, int(settings.n_track)
                cfg.orthographic = bool(settings.orthographic)
                cfg.background_normalized_depth = settings.background_normalized_depth
                cfg.device = _native.DeviceKind.cuda if device.type == "cuda" else _native.DeviceKind.cpu
                cfg.device_index = index
                cfg.num_threads = int(settings.num_threads)
                cfg.backward_row_budget = int(settings.backward_row_budget)
                native = _native.Renderer(cfg)
                _natives[key] = native
    return native


def release_natives(renderer_id: int) -> None:
    """Drops the native renderers (and their scratch) of a Renderer module."""
    with _natives_lock:
        for key in [k for k in list(_natives) if k[0][0] == renderer_id]:
            del _natives[key]
        for table in (_needed, _capacities):
            for key in [k for k in list(table) if k[0] == renderer_id]:
                del table[key]


def natives_of(renderer_id: int) -> List["_native.Renderer"]:
    """The native renderers a Renderer module has made so far (diagnostics)."""
    with _natives_lock:
        return [v for k, v in list(_natives.items()) if k[0][0] == renderer_id]


# ------------------------------------------------------------------ instance capacity
# Per Renderer module and CUDA device: the most (camera, tile, sphere) instances any of
# its binnings needed, as the host learnt it (verified calls, status reads), and the
# capacity a call makes room for when it may choose: that need with headroom, on a
# ladder of 16 steps per octave, so that it changes seldom as the need creeps up. A
# traced call reads the capacity as a graph constant (Dynamo guards on its entry alone:
# the renderer is traced again only when its own capacity grows).
_needed: Dict[Tuple[int, int], int] = {}
_capacities: Dict[Tuple[int, int], int] = {}
# Largest capacity: list positions are int32.
MAX_CAPACITY = 2**31 - 1


def capacity_key(renderer_id: int, device: torch.device) -> Tuple[int, int]:
    return renderer_id, _device_index(device)


def grown_capacity(instances: int) -> int:
    """Room for ``instances``: 1/16 and 256 more, rounded up to the ladder (multiples of
    1/16 of the leading power of two)."""
    want = instances + instances // 16 + 256
    step = 1 << max(0, want.bit_length() - 5)
    return min(MAX_CAPACITY, -(-want // step) * step)


def learned_capacity(renderer_id: int, device: torch.device) -> int:
    """The capacity a call of this renderer on ``device`` takes when it may choose (0:
    none learnt yet)."""
    return _capacities.get(capacity_key(renderer_id, device), 0)


def estimated_capacity(batch: int, n_spheres: int, width: int, height: int) -> int:
    """The capacity of a traced call of a renderer that has learnt none: a few instances
    per sphere, and one per tile (a guess: a call that needs more renders correctly, and
    the renderer is traced again with what it learnt)."""
    tiles = -(-width // _checks.TILE_SIZE) * -(-height // _checks.TILE_SIZE)
    return grown_capacity(4 * batch * n_spheres + batch * tiles)


def _learn(key: Tuple[int, int], instances: int) -> None:
    if instances > _needed.get(key, 0):
        _needed[key] = instances
    if instances > _capacities.get(key, 0):
        _capacities[key] = grown_capacity(instances)


def _capacity_error(key: Tuple[int, int], what: str) -> RuntimeError:
    needed = _needed.get(key, 0)
    return RuntimeError(
        f"pulsar_py.Renderer: {what} needed {needed:,} sphere-tile instances, more than the renderer's "
        f"instance_capacity held: its outputs were NaN. Set renderer.instance_capacity to at least "
        f"{grown_capacity(needed):,} (or to None, and run a call eagerly before capturing) and capture again")


def check_status(renderer_id: int, device: torch.device) -> None:
    """Raises when a call of the renderer on ``device`` since the last check overflowed its
    instance capacity or had values out of range (synchronises with the device: every
    call enqueued before is included). Learns the instances the calls needed."""
    if device.type != "cuda":
        return
    key = capacity_key(renderer_id, device)
    stream = stream_handle(device)
    for native in natives_of(renderer_id):
        if native.config.device != _native.DeviceKind.cuda or native.config.device_index != key[1]:
            continue
        status = native.take_status(stream, True)
        _learn(key, status.max_instances)
        if status.overflowed:
            raise _capacity_error(key, "a call (captured in a CUDA graph, or with a fixed capacity)")
        if status.invalid_values:
            raise ValueError(_INVALID_VALUES)


_INVALID_VALUES = ("gamma, percent_allowed_difference, min_depth, max_depth: a call's values (given as tensors) "
                   "were out of range (gamma in [1e-5, 1], percent_allowed_difference in [0, 1), "
                   "0 <= min_depth < max_depth): its outputs were NaN")


def _take_report(key: Tuple[int, int], report: "_native.BinningReport") -> None:
    """Learns from a verified call's report; raises for what earlier calls (replays of
    captured graphs) recorded: an overflow, values out of range."""
    _learn(key, report.max_instances)
    if report.overflows > int(report.overflowed):
        raise _capacity_error(key, "an earlier call (captured in a CUDA graph, or with a fixed capacity)")
    if report.invalid_values > 0:
        raise ValueError(_INVALID_VALUES)


# ------------------------------------------------------------------ helpers
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: torch.device) -> int:
    """cudaStream_t (as an int) of torch's current stream on ``device``; 0 on the CPU."""
    if device.type != "cuda":
        return 0
    index = _device_index(device)
    if _raw_stream is not None:
        return int(_raw_stream(index))
    return torch.cuda.current_stream(index).cuda_stream


def capturing(device: torch.device) -> bool:
    """Whether torch's current stream on ``device`` is being captured into a CUDA graph:
    a call then reads nothing back from the device."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _ptr(t: Optional[Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


def _native_view(t: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    """``t`` as the native core reads it: its values resolved (negative and conjugate
    bits), of ``dtype``, contiguous. A no-op for a plain contiguous tensor; saved-tensor
    hooks may hand back any layout."""
    if t is None or (t.is_contiguous() and t.dtype is dtype and not t.is_neg()):
        return t
    if t.is_neg():
        t = t.resolve_neg()
    return t.to(dtype).contiguous()


def _dtype_enum(dtype: torch.dtype) -> "_native.DType":
    return _native.DType.float64 if dtype == torch.float64 else _native.DType.float32


def _device_enum(device: torch.device) -> "_native.DeviceKind":
    return _native.DeviceKind.cuda if device.type == "cuda" else _native.DeviceKind.cpu


_ones_cache: Dict[tuple, Tensor] = {}


def _ones(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Ones [n], the default background; made once per (n, dtype, device), read only."""
    key = (n, dtype, device)
    ones = _ones_cache.get(key)
    if ones is None:
        ones = _ones_cache[key] = torch.ones(n, dtype=dtype, device=device)
    return ones


def _batch(cameras: Tensor) -> int:
    """B of cameras [B, L] or [L] (one camera)."""
    return cameras.shape[0] if cameras.dim() == 2 else 1


def _lead(s: RenderSettings, batch: int) -> Tuple[int, ...]:
    height, width = int(s.height), int(s.width)
    return (batch, height, width) if s.batch_dim else (height, width)


def _failed(error: RuntimeError, stage: str, s: RenderSettings, device: torch.device, tensors: dict):
    """Re-raises a native failure; with debugging on, first saves the call's inputs."""
    if not debug_enabled(s.debug):
        raise error
    try:
        path = save_snapshot(stage, s._asdict(), device, tensors)
    except Exception as save_error:  # the original failure matters more than the snapshot
        raise RuntimeError(f"{error} (saving a debug snapshot failed too: {save_error})") from error
    raise RuntimeError(f"{error}\n[pulsar_py debug] the call's inputs were saved to {path}; "
                       f"reproduce with pulsar_py.replay({path!r})") from error


class _Call(NamedTuple):
    """One render call as the native core takes it: inputs made native-readable, the
    native renderer and its call structs."""

    settings: RenderSettings
    native: "_native.Renderer"
    scene: "_native.SceneArgs"
    options: "_native.RenderOptions"
    tensors: Tuple[Optional[Tensor], ...]  # positions, features, radii, opacities, background, cameras, values

    @property
    def device(self) -> torch.device:
        return self.tensors[0].device

    def snapshot(self, **more: Optional[Tensor]) -> dict:
        positions, features, radii, opacities, background, cameras, values = self.tensors
        return dict(vert_pos=positions, vert_col=features, vert_rad=radii, opacity=opacities, bg_col=background,
                    cameras=cameras.reshape(-1, cameras.shape[-1]), values=values, **more)


_options_cache: Dict[tuple, "_native.RenderOptions"] = {}


def _options(s: RenderSettings, device: torch.device, values: Optional[Tensor]) -> "_native.RenderOptions":
    """The native options of a call. Without a values tensor, one object per distinct
    value (the native core only reads them; a few hundred distinct values at most are
    kept)."""
    if values is not None:
        options = _native.RenderOptions(1.0, 0.0, int(s.max_n_hits), stream_handle(device))
        options.values = values.data_ptr()
        options.partial = bool(s.partial)
        return options
    key = (s.gamma, s.percent_allowed_difference, s.max_n_hits, stream_handle(device), s.partial)
    options = _options_cache.get(key)
    if options is None:
        if len(_options_cache) > 256:
            _options_cache.clear()
        options = _native.RenderOptions(key[0], key[1], int(key[2]), key[3])
        options.partial = bool(s.partial)
        _options_cache[key] = options
    return options


def _prepare(s: RenderSettings, positions, features, radii, opacities, background, cameras, values,
             dtype: torch.dtype) -> _Call:
    device = positions.device
    positions, features, radii = _native_view(positions, dtype), _native_view(features, dtype), \
        _native_view(radii, dtype)
    opacities, cameras = _native_view(opacities, dtype), _native_view(cameras, dtype)
    background = _ones(features.shape[-1], dtype, device) if background is None else _native_view(background, dtype)
    values = _native_view(values, torch.float64)
    scene = _native.SceneArgs(_dtype_enum(dtype), _batch(cameras), positions.shape[-2], positions.dim() == 2,
                              positions.data_ptr(), features.data_ptr(), radii.data_ptr(), _ptr(opacities),
                              background.data_ptr(), cameras.data_ptr(), bool(s.right_handed), int(s.camera_length),
                              bool(s.first_R_then_T), s.min_depth, s.max_depth)
    return _Call(s, native_renderer(s, features.shape[-1], device), scene, _options(s, device, values),
                 (positions, features, radii, opacities, background, cameras, values))


_needs_cache: Dict[tuple, tuple] = {}


class _Memory(NamedTuple):
    """A call's memory (include/pulsar/renderer.h CallMemory) and the tensors that hold it."""

    binning: Tensor  # uint8 [bytes]
    entries: Tensor  # int32 [2, capacity]
    workspace: Optional[Tensor]  # uint8 [bytes]: the call's alone, freed after it
    native: "_native.CallMemory"


def _memory(call: _Call, capacity: int, binning: Optional[Tensor] = None,
            entries: Optional[Tensor] = None) -> _Memory:
    """The memory of a call with room for ``capacity`` instances; ``binning`` and
    ``entries``: a forward's (for its backward), else made."""
    scene, device, native = call.scene, call.device, call.native
    # Keyed by the native renderer's id, and the entry holds the renderer: an id reused by
    # a later object does not match it.
    key = (id(native), scene.dtype, scene.batch_size, scene.n_spheres, capacity)
    entry = _needs_cache.get(key)
    if entry is None or entry[0] is not native:
        if len(_needs_cache) > 256:
            _needs_cache.clear()
        entry = _needs_cache[key] = (native, native.memory_needs(scene.dtype, scene.batch_size, scene.n_spheres,
                                                                 capacity))
    binning_bytes, workspace_bytes = entry[1]
    if binning is None:
        binning = torch.empty(binning_bytes, dtype=torch.uint8, device=device)
    if entries is None:
        entries = torch.empty((2, capacity), dtype=torch.int32, device=device)
    workspace = torch.empty(workspace_bytes, dtype=torch.uint8, device=device) if workspace_bytes else None
    native = _native.CallMemory(binning.data_ptr(), binning.numel(), _ptr(entries) if capacity else 0, capacity,
                                _ptr(workspace), workspace_bytes)
    return _Memory(binning, entries, workspace, native)


# ------------------------------------------------------------------ pulsar::render
_RENDER_SCHEMA = ("render(Tensor positions, Tensor features, Tensor radii, Tensor? opacities, Tensor? background, "
                  "Tensor cameras, Tensor? values, float[] settings) "
                  "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
_BACKWARD_SCHEMA = ("render_backward(Tensor grad_image, Tensor? grad_depth_moments, Tensor positions, "
                    "Tensor features, Tensor radii, Tensor? opacities, Tensor? background, Tensor cameras, "
                    "Tensor? values, Tensor image, Tensor blend_state, Tensor counts, Tensor depth_moments, "
                    "Tensor binning, Tensor entries, float[] settings, bool[] needs) "
                    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
_PACK_SCHEMA = "pack_cameras(Tensor camera_vectors, float[] settings) -> Tensor"
_PACK_BACKWARD_SCHEMA = "pack_cameras_backward(Tensor camera_vectors, Tensor grad_packed, float[] settings) -> Tensor"

_lib = torch.library.Library("pulsar", "DEF")
for _schema in (_RENDER_SCHEMA, _BACKWARD_SCHEMA, _PACK_SCHEMA, _PACK_BACKWARD_SCHEMA):
    _lib.define(_schema)


def _image_outputs(s: RenderSettings, dtype: torch.dtype, device: torch.device, batch: int, channels: int):
    """(image, blend_state, counts, forward_info, depth_moments), allocated: [0] for forward
    info and depth moments not asked for."""
    lead = _lead(s, batch)
    image = torch.empty(lead + (channels,), dtype=dtype, device=device)
    state = torch.empty(lead + (2,), dtype=dtype, device=device)
    counts = torch.empty((2,) + lead, dtype=torch.int32, device=device)
    info = torch.empty(lead + (3 + 2 * int(s.n_track),) if s.want_forward_info else (0,), dtype=dtype,
                       device=device)
    moments = torch.empty(lead + (DEPTH_STATS,) if s.want_depth_moments else (0,), dtype=dtype, device=device)
    return image, state, counts, info, moments


def _forward_outputs(outputs, lead: Tuple[int, ...]) -> "_native.ForwardOutputs":
    image, state, counts, info, moments = outputs
    hits = counts.data_ptr()
    return _native.ForwardOutputs(image.data_ptr(), state.data_ptr(), hits, hits + 4 * math.prod(lead),
                                  info.data_ptr() if info.numel() else 0, moments.data_ptr() if moments.numel() else 0)


def _run_forward(call: _Call, fwd: "_native.ForwardOutputs", memory: _Memory, verify: bool) -> "_native.BinningReport":
    try:
        return call.native.forward(call.scene, call.options, fwd, memory.native, verify)
    except RuntimeError as error:
        _failed(error, "forward", call.settings, call.device, call.snapshot())


def _render_kernel(positions, features, radii, opacities, background, cameras, values, settings):
    s = RenderSettings.decode(settings)
    dtype, device = positions.dtype, positions.device
    call = _prepare(s, positions, features, radii, opacities, background, cameras, values, dtype)
    on_graph = capturing(device)
    if s.check_values and not on_graph:  # the checks read the device: not on a captured stream
        _checks.check_values(*call.tensors, s)
    channels = features.shape[-1]
    outputs = _image_outputs(s, dtype, device, call.scene.batch_size, channels)
    fwd = _forward_outputs(outputs, _lead(s, call.scene.batch_size))
    if device.type != "cuda":  # the CPU bins exactly, into its own scratch
        memory = _memory(call, 0)
        _run_forward(call, fwd, memory, False)
        return (*outputs, memory.binning, memory.entries)
    key = capacity_key(int(s.renderer_id), device)
    capacity, chosen = int(s.capacity), int(s.capacity) == 0
    verify = bool(s.verify) and not on_graph
    if chosen:
        capacity = learned_capacity(int(s.renderer_id), device)
        if capacity == 0:
            if on_graph:
                raise RuntimeError("pulsar_py.Renderer: the first call of a renderer cannot be captured in a CUDA "
                                   "graph (its instance capacity is not known yet): run one call eagerly first "
                                   "(the usual warm-up), or set renderer.instance_capacity")
            capacity = grown_capacity(_count_instances(call, key))
    memory = _memory(call, capacity)
    report = _run_forward(call, fwd, memory, verify)
    if report.verified:
        _take_report(key, report)
        if report.overflowed:
            # The lists did not fit: NaN outputs. Render again with room for every
            # instance. A call that chose its capacity returns the new binning; a traced
            # call keeps the binning of the shape it was traced with (flagged overflowed;
            # its backward bins again: render_backward's kernel).
            fitted = _memory(call, grown_capacity(report.instances))
            _run_forward(call, fwd, fitted, verify)
            if chosen:
                memory = fitted
    return (*outputs, memory.binning, memory.entries)


def _count_instances(call: _Call, key: Tuple[int, int]) -> int:
    """The instances the call's binning needs (one host synchronisation), learnt."""
    try:
        count = call.native.count_instances(call.scene, call.options, _memory(call, 0).native)
    except RuntimeError as error:
        _failed(error, "forward", call.settings, call.device, call.snapshot())
    _learn(key, count)
    return count


def _render_fake(positions, features, radii, opacities, background, cameras, values, settings):
    s = RenderSettings.decode(settings)
    batch = _batch(cameras)
    lead = _lead(s, batch)
    image = positions.new_empty(lead + (features.shape[-1],))
    state = positions.new_empty(lead + (2,))
    counts = positions.new_empty((2,) + lead, dtype=torch.int32)
    info = positions.new_empty(lead + (3 + 2 * int(s.n_track),) if s.want_forward_info else (0,))
    moments = positions.new_empty(lead + (DEPTH_STATS,) if s.want_depth_moments else (0,))
    binning_bytes = _native.binning_bytes(_device_enum(positions.device), int(s.width), int(s.height),
                                          _dtype_enum(positions.dtype), batch, positions.shape[-2])
    binning = positions.new_empty((binning_bytes,), dtype=torch.uint8)
    entries = positions.new_empty((2, int(s.capacity)), dtype=torch.int32)
    return image, state, counts, info, moments, binning, entries


def _render_backward_kernel(grad_image, grad_depth_moments, positions, features, radii, opacities, background,
                            cameras, values, image, blend_state, counts, depth_moments, binning, entries, settings,
                            needs):
    s = RenderSettings.decode(settings)
    # The forward's dtype is the image gradient's: saved tensors may come back in another.
    dtype, device = grad_image.dtype, grad_image.device
    call = _prepare(s, positions, features, radii, opacities, background, cameras, values, dtype)
    view = lambda t: _native_view(t, dtype)  # noqa: E731
    image, blend_state, grad_image = view(image), view(blend_state), view(grad_image)
    traversal_end = _native_view(counts, torch.int32)[1]
    want_moments = grad_depth_moments is not None and bool(s.want_depth_moments)
    if want_moments:
        depth_moments, grad_depth_moments = view(depth_moments), view(grad_depth_moments)
    grads = [torch.empty(t.shape, dtype=dtype, device=device) if need else None
             for need, t in zip(needs, call.tensors[:6])]
    if any(g is not None for g in grads):
        capacity = entries.shape[1]
        key = capacity_key(int(s.renderer_id), device)
        rebin = (device.type == "cuda" and bool(s.verify) and not capturing(device)
                 and _needed.get(key, 0) > capacity)
        try:
            if rebin:
                # The forward's lists may not have fitted (a traced call of a capacity the
                # renderer has since outgrown): bin again, with room for every instance.
                memory = _memory(call, grown_capacity(_needed[key]))
                call.native.bin(call.scene, call.options, memory.native, False)
            else:
                memory = _memory(call, capacity, _native_view(binning, torch.uint8), _native_view(entries, torch.int32))
            args = _native.BackwardArgs(grad_image.data_ptr(), image.data_ptr(), blend_state.data_ptr(),
                                        traversal_end.data_ptr(), _ptr(depth_moments) if want_moments else 0,
                                        _ptr(grad_depth_moments) if want_moments else 0)
            call.native.backward(call.scene, call.options, args, _native.GradientOutputs(*map(_ptr, grads)),
                                 memory.native)
        except RuntimeError as error:
            _failed(error, "backward", s, device, call.snapshot(
                grad_image=grad_image, grad_depth_moments=grad_depth_moments if want_moments else None))
    if any(g is None for g in grads):  # the operator returns a tensor for every gradient
        empty = grad_image.new_empty((0,))
        grads = [empty if g is None else g for g in grads]
    return tuple(grads)


def _render_backward_fake(grad_image, grad_depth_moments, positions, features, radii, opacities, background, cameras,
                          values, image, blend_state, counts, depth_moments, binning, entries, settings, needs):
    inputs = (positions, features, radii, opacities, background, cameras)
    return tuple(grad_image.new_empty(t.shape) if (need and t is not None) else grad_image.new_empty((0,))
                 for need, t in zip(needs, inputs))


# ------------------------------------------------------------------ pulsar::pack_cameras
def _conversion_args(vectors: Tensor, s: PackSettings) -> "_native.CameraParamsArgs":
    if vectors.dim() != 2:
        raise ValueError(f"camera_vectors: expected a tensor of shape [B, L], got shape {tuple(vectors.shape)}")
    if vectors.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"camera_vectors: expected dtype torch.float32 or torch.float64, got {vectors.dtype}")
    args = _native.CameraParamsArgs()
    args.dtype = _dtype_enum(vectors.dtype)
    if vectors.device.type == "cuda":
        args.device = _native.DeviceKind.cuda
        args.device_index = _device_index(vectors.device)
        args.stream = stream_handle(vectors.device)
    args.batch_size, args.length = vectors.shape
    args.width, args.height = s.width, s.height
    args.orthographic, args.right_handed, args.first_R_then_T = s.orthographic, s.right_handed, s.first_R_then_T
    args.min_depth, args.max_depth = s.min_depth, s.max_depth
    args.params = vectors.data_ptr()
    return args


def _pack_kernel(camera_vectors, settings):
    vectors = _native_view(camera_vectors, camera_vectors.dtype)
    packed = vectors.new_empty((vectors.shape[0], _native.CAMERA_PARAMS))
    _native.camera_params_to_packed(_conversion_args(vectors, PackSettings.decode(settings)), packed.data_ptr())
    return packed


def _pack_fake(camera_vectors, settings):
    return camera_vectors.new_empty((camera_vectors.shape[0], _native.CAMERA_PARAMS))


def _pack_backward_kernel(camera_vectors, grad_packed, settings):
    vectors = _native_view(camera_vectors, camera_vectors.dtype)
    grad_packed = _native_view(grad_packed, vectors.dtype)
    grad = torch.empty_like(vectors)
    _native.camera_params_backward(_conversion_args(vectors, PackSettings.decode(settings)), grad_packed.data_ptr(),
                                   grad.data_ptr())
    return grad


def _pack_backward_fake(camera_vectors, grad_packed, settings):
    return camera_vectors.new_empty(camera_vectors.shape)


def _pack_setup_context(ctx, inputs, output):
    ctx.settings = inputs[1]
    ctx.save_for_backward(inputs[0])


def _pack_backward(ctx, grad_packed):
    if not ctx.needs_input_grad[0] or grad_packed is None:
        return None, None
    (vectors,) = ctx.saved_tensors
    grad = torch.ops.pulsar.pack_cameras_backward(vectors, grad_packed, ctx.settings)
    if torch.is_grad_enabled() and vectors.requires_grad:  # create_graph=True
        (grad,) = _NotDifferentiable.apply(vectors, grad)
    return grad, None


for _name, _kernel, _fake in (("render", _render_kernel, _render_fake),
                              ("render_backward", _render_backward_kernel, _render_backward_fake),
                              ("pack_cameras", _pack_kernel, _pack_fake),
                              ("pack_cameras_backward", _pack_backward_kernel, _pack_backward_fake)):
    _lib.impl(_name, _kernel, "CPU")
    _lib.impl(_name, _kernel, "CUDA")
    torch.library.register_fake(f"pulsar::{_name}", _fake, lib=_lib)

torch.library.register_autograd("pulsar::pack_cameras", _pack_backward, setup_context=_pack_setup_context, lib=_lib)

render = torch.ops.pulsar.render.default
render_backward = torch.ops.pulsar.render_backward.default
pack_cameras = torch.ops.pulsar.pack_cameras.default


# ------------------------------------------------------------------ autograd
class _NotDifferentiable(torch.autograd.Function):
    """The renderer's gradients under create_graph=True: the same values, and a clear
    error where a second differentiation would pass through them."""

    @staticmethod
    def forward(ctx, anchor, *grads):  # anchor: an input that requires grad, so the outputs do
        return tuple(None if g is None else g.clone() for g in grads)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("pulsar_py.Renderer: its gradients are not differentiable themselves (double backward "
                           "through the renderer, e.g. a gradient penalty, is not supported)")


def render_setup(ctx, inputs: tuple, outputs: tuple) -> None:
    """What a render's backward keeps of its call: the inputs, the outputs the backward
    reads and the binning (``ctx.settings``: the operator's settings)."""
    positions, features, radii, opacities, background, cameras, values, settings = inputs
    image, state, counts, info, moments, binning, entries = outputs
    ctx.settings = settings
    ctx.save_for_backward(positions, features, radii, opacities, background, cameras, values, image, state, counts,
                          moments, binning, entries)
    ctx.mark_non_differentiable(state, counts, info, binning, entries)
    # Outputs without a gradient reach backward as None, not as zero-filled tensors.
    ctx.set_materialize_grads(False)


def render_backward_arguments(ctx, grad_image: Optional[Tensor], grad_moments: Optional[Tensor]) -> Optional[tuple]:
    """pulsar::render_backward's arguments for the render call ``ctx`` kept (None when
    no gradient reaches the image or the moments); only requested gradients are made."""
    if grad_image is None and grad_moments is None:
        return None
    need = ctx.needs_input_grad
    (positions, features, radii, opacities, background, cameras, values, image, state, counts, moments, binning,
     entries) = ctx.saved_tensors
    if grad_image is None:
        grad_image = torch.zeros_like(image)
    needs = [bool(need[i]) and t is not None
             for i, t in enumerate((positions, features, radii, opacities, background, cameras))]
    return (grad_image, grad_moments, positions, features, radii, opacities, background, cameras, values, image,
            state, counts, moments, binning, entries, ctx.settings, needs)


def input_gradients(grads, args: tuple) -> tuple:
    """The render's input gradients (positions .. cameras, then None for values and
    settings) from render_backward's outputs, for the backward arguments ``args``."""
    if torch.is_grad_enabled():  # create_graph=True: the gradients must not pass as differentiable
        anchor = next((t for t in args[2:8] if isinstance(t, Tensor) and t.requires_grad), None)
        if anchor is not None:
            grads = _NotDifferentiable.apply(anchor, *grads)
    return (*(g if n else None for g, n in zip(grads, args[-1])), None, None)


class RenderFunction(torch.autograd.Function):
    """pulsar::render with its exact gradient, pulsar::render_backward: the one path of
    every render, eager or traced. What the backward reuses of its forward, the binning,
    is two of the forward's outputs, kept on the context like any saved tensor."""

    @staticmethod
    def forward(ctx, positions, features, radii, opacities, background, cameras, values, settings):
        outputs = render(positions, features, radii, opacities, background, cameras, values, settings)
        render_setup(ctx, (positions, features, radii, opacities, background, cameras, values, settings), outputs)
        return outputs

    @staticmethod
    def backward(ctx, grad_image, _state, _counts, _info, grad_moments, _binning, _entries):
        args = render_backward_arguments(ctx, grad_image, grad_moments)
        if args is None:
            return (None,) * 8
        return input_gradients(render_backward(*args), args)


def render_call(positions: Tensor, features: Tensor, radii: Tensor, opacities: Optional[Tensor],
                background: Optional[Tensor], cameras: Tensor, values: Optional[Tensor],
                settings: RenderSettings) -> Tuple[Tensor, ...]:
    """pulsar::render as the renderer calls it: through ``RenderFunction`` when a gradient
    may be asked for, else the operator alone. Returns its seven outputs."""
    encoded = settings.encode()
    if torch.is_grad_enabled() and (positions.requires_grad or features.requires_grad or radii.requires_grad
                                    or cameras.requires_grad or (opacities is not None and opacities.requires_grad)
                                    or (background is not None and background.requires_grad)):
        return RenderFunction.apply(positions, features, radii, opacities, background, cameras, values, encoded)
    return render(positions, features, radii, opacities, background, cameras, values, encoded)
