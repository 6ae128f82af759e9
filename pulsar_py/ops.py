"""The renderer as torch.library operators: all PyTorch sees of the native core.

    pulsar::render(positions, features, radii, opacities?, background?, cameras, values?, settings)
        -> (image, blend_state, counts, forward_info, depth_moments)
    pulsar::render_backward(grad_image, grad_depth_moments?, <render's inputs and outputs>,
                            settings, needs) -> (the six gradients)
    pulsar::pack_cameras(camera_vectors, settings) -> packed cameras [B, 15]
    pulsar::pack_cameras_backward(camera_vectors, grad_packed, settings) -> [B, L]

Every entry point of the package reaches the native core through these, and nothing else
calls pybind11: the operators take tensors and plain numbers, have fake kernels (output
shapes without running anything, for torch.compile, torch.export and FakeTensorMode) and
autograd attached with ``torch.library.register_autograd``. Their CPU and CUDA kernels
are Python functions that make every tensor contiguous, allocate the outputs with torch
(the caller owns outputs, the native renderer its scratch) and call the pybind11 module.

Shapes (B cameras, N spheres, C channels, K = n_track, image H x W):
    positions [B?, N, 3], features [B?, N, C], radii [B?, N], opacities [B?, N] or None
    (all 1), background [C] or None (ones); cameras [B, 15] packed (include/pulsar/
    camera.h) or [B, L] Pulsar camera vectors, L in {8, 10, 11, 13}, which the native
    call converts (its gradient comes back as [B, L]); values float64 [4] on the render's
    device (``CallValue``: gamma, percent_allowed_difference, min_depth, max_depth) or None.
    image [B, H, W, C]; blend_state [B, H, W, 2] (m, D); counts int32 [2, B, H, W] (the
    hit count, then the traversal end the backward reads); forward_info [B, H, W, 3 + 2K]
    or [0]; depth_moments [B, H, W, 4] (outputs.DEPTH_STATS) or [0].
    Without ``batch_dim`` (B = 1) the outputs have no leading B. The backward reuses the
    native binning of its forward when that forward was the renderer's last (the native
    renderer recognises its traversal-end array), else bins the same inputs again.

``settings`` is a ``RenderSettings`` encoded as a list of floats (an operator schema of
few arguments: torch.library's autograd wrapper costs time quadratic in their number).
They are graph constants of a traced call (torch.compile guards on their values), so the
numbers a training loop changes from call to call (an annealed gamma, a depth range) come
as data instead when they are given as tensors, and in every traced call: the ``values``
tensor, whose slots the settings then hold as placeholders. The native kernels read it
where they run (no device synchronisation; a CUDA graph reads it at each replay); the
host reads and checks it where that costs no extra wait (``resolved_settings``).
"""

from __future__ import annotations

import math
import threading
from typing import Dict, List, NamedTuple, Optional, Tuple

import torch

from . import _checks, _native
from ._snapshot import debug_enabled, save_snapshot
from .outputs import DEPTH_STATS
from .render_settings import PackSettings, RenderSettings

Tensor = torch.Tensor


class CallValue:
    """Slots of the render operator's ``values`` tensor (float64 [4] on the render's device;
    include/pulsar/renderer.h, ``CallValue``)."""

    GAMMA = 0
    PERCENT_ALLOWED_DIFFERENCE = 1
    MIN_DEPTH = 2  # near depth (0: focal length + 2e-6); packed cameras carry their own
    MAX_DEPTH = 3  # far depth; likewise
    COUNT = 4


# ------------------------------------------------------------------ native renderers
_natives: Dict[tuple, "_native.Renderer"] = {}
# Renderer module id -> its instance capacity (0: learnt), applied to every native
# renderer the module has and makes (set_instance_capacity).
_capacities: Dict[int, int] = {}
# Reentrant: a Renderer's finalizer (release_natives) may run from the garbage collector
# while this thread holds the lock in native_renderer.
_natives_lock = threading.RLock()


def native_renderer(settings: RenderSettings, n_channels: int, device: torch.device) -> "_native.Renderer":
    """The native renderer of a Renderer module for a device and configuration, made on
    first use. Keyed by value: a module's id and every configuration field the native
    renderer is built from (settings.config), so a changed attribute gets a renderer of
    its own."""
    index = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)
    config = settings.config  # numbers as they arrive (floats)
    key = (config, n_channels, device.type, index)
    native = _natives.get(key)
    if native is None:
        with _natives_lock:
            native = _natives.get(key)
            if native is None:
                cfg = _native.RendererConfig()
                cfg.width, cfg.height = int(config.width), int(config.height)
                cfg.n_channels, cfg.n_track = n_channels, int(config.n_track)
                cfg.orthographic = bool(config.orthographic)
                cfg.background_normalized_depth = config.background_normalized_depth
                cfg.device = _native.DeviceKind.cuda if device.type == "cuda" else _native.DeviceKind.cpu
                cfg.device_index = index
                cfg.num_threads = int(config.num_threads)
                cfg.backward_row_budget = int(config.backward_row_budget)
                native = _native.Renderer(cfg)
                native.instance_capacity = _capacities.get(config.renderer_id, 0)
                _natives[key] = native
    return native


def release_natives(renderer_id: int) -> None:
    """Drops the native renderers (and their scratch) of a Renderer module."""
    with _natives_lock:
        for key in [k for k in list(_natives) if k[0].renderer_id == renderer_id]:
            del _natives[key]
        _capacities.pop(renderer_id, None)


def set_instance_capacity(renderer_id: int, capacity: int) -> None:
    """The instance capacity of a Renderer module's native renderers, those it has and
    those it makes (0: learnt); see ``Renderer.instance_capacity``."""
    with _natives_lock:
        _capacities[renderer_id] = capacity
        for native in natives_of(renderer_id):
            native.instance_capacity = capacity


def take_instance_overflow(renderer_id: int) -> int:
    """The largest (tile, sphere) instance count one of a Renderer module's CUDA calls
    could not store in its capacity since the last read (0: none), waiting for each native
    renderer's device on torch's current stream; resets the records."""
    needed = 0
    for native in natives_of(renderer_id):
        config = native.config
        if config.device == _native.DeviceKind.cuda:
            stream = stream_handle(torch.device("cuda", config.device_index))
            needed = max(needed, native.take_instance_overflow(stream))
    return needed


def capturing(device: torch.device) -> bool:
    """Whether torch's current stream on ``device`` is being captured into a CUDA graph
    (then nothing may wait for the device: value checks, which read a result back, are
    left to the calls before the capture)."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def natives_of(renderer_id: int) -> List["_native.Renderer"]:
    """The native renderers a Renderer module has made so far (diagnostics)."""
    with _natives_lock:
        return [v for k, v in list(_natives.items()) if k[0].renderer_id == renderer_id]


# ------------------------------------------------------------------ helpers
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: torch.device) -> int:
    """cudaStream_t (as an int) of torch's current stream on ``device``; 0 on the CPU."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        return int(_raw_stream(index))
    return torch.cuda.current_stream(index).cuda_stream


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


_ones_cache: Dict[tuple, Tensor] = {}


def default_background(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Ones [n], the default background; made once per (n, dtype, device), read only."""
    key = (n, dtype, device)
    ones = _ones_cache.get(key)
    if ones is None:
        ones = _ones_cache[key] = torch.ones(n, dtype=dtype, device=device)
    return ones


def _batch(cameras: Tensor) -> int:
    """B of cameras [B, L] or [L] (one camera)."""
    return cameras.shape[0] if cameras.dim() == 2 else 1


def _scene_args(
    s: RenderSettings,
    positions: Tensor,
    features: Tensor,
    radii: Tensor,
    opacities: Optional[Tensor],
    background: Tensor,
    cameras: Tensor,
) -> "_native.SceneArgs":
    return _native.SceneArgs(
        _dtype_enum(positions.dtype),
        _batch(cameras),
        positions.shape[-2],
        positions.dim() == 2,
        positions.data_ptr(),
        features.data_ptr(),
        radii.data_ptr(),
        _ptr(opacities),
        background.data_ptr(),
        cameras.data_ptr(),
        bool(s.camera.right_handed),
        int(s.camera.camera_length),
        bool(s.camera.first_R_then_T),
        s.camera.min_depth,
        s.camera.max_depth,
    )


_options_cache: Dict[tuple, "_native.RenderOptions"] = {}


def _options(s: RenderSettings, device: torch.device, values: Optional[Tensor] = None) -> "_native.RenderOptions":
    """The native options of a call, one object per distinct value (the native core only
    reads them); a few hundred distinct values at most are kept. With ``values`` (on the
    render's device) the kernels read gamma, p and the depth range from them: a new object
    for its pointer."""
    key = (
        s.blend.gamma,
        s.blend.percent_allowed_difference,
        s.blend.max_n_hits,
        stream_handle(device),
        s.outputs.partial,
    )
    if values is not None:
        options = _new_options(key)
        options.values = values.data_ptr()
        return options
    options = _options_cache.get(key)
    if options is None:
        if len(_options_cache) > 256:
            _options_cache.clear()
        options = _options_cache[key] = _new_options(key)
    return options


def _new_options(key: tuple) -> "_native.RenderOptions":
    """RenderOptions of ``_options``' key (gamma, p, max_n_hits, stream, partial)."""
    options = _native.RenderOptions(key[0], key[1], int(key[2]), key[3])
    options.partial = bool(key[4])
    return options


def _lead(s: RenderSettings, batch: int) -> Tuple[int, ...]:
    height, width = int(s.config.height), int(s.config.width)
    return (batch, height, width) if s.outputs.batch_dim else (height, width)


def _failed(error: RuntimeError, stage: str, s: RenderSettings, device: torch.device, tensors: dict):
    """Re-raises a native failure; with debugging on, first saves the call's inputs."""
    if not debug_enabled(s.checks.debug):
        raise error
    try:
        path = save_snapshot(stage, s.flat(), device, tensors)
    except Exception as save_error:  # the original failure matters more than the snapshot
        raise RuntimeError(f"{error} (saving a debug snapshot failed too: {save_error})") from error
    raise RuntimeError(
        f"{error}\n[pulsar_py debug] the call's inputs were saved to {path}; reproduce with pulsar_py.replay({path!r})"
    ) from error


# ------------------------------------------------------------------ settings as data
def call_values(gamma, percent_allowed_difference, min_depth, max_depth, device: torch.device) -> Tensor:
    """The render operator's ``values`` (float64 [4] on the render's ``device``,
    ``CallValue``'s slots) of a call's settings, Python numbers (traced ones included) or
    0-dim tensors, which are copied there (the native kernels read them where they run, so
    a captured CUDA graph reads a tensor's value at each replay). No tensor's graph is
    followed: the settings get no gradient."""
    settings = (gamma, percent_allowed_difference, min_depth, max_depth)
    if not torch.compiler.is_compiling() and capturing(device):
        for name, v in zip(_VALUE_NAMES, settings):
            if isinstance(v, Tensor) and v.device != device:
                raise ValueError(
                    f"{name}: a setting given as a tensor on {v.device} cannot be copied to {device} inside a "
                    f"CUDA-graph capture; give it as a tensor on {device} (changed in place between replays) "
                    f"or as a Python number (fixed when the call is captured)"
                )
    one = torch.ones((), dtype=torch.float64, device=device)
    # A number enters as one * x: torch.compile keeps a float that a tensor operation
    # takes dynamic, where torch.tensor([x]) would specialise on its value.
    return torch.stack(
        [v.detach().to(device=device, dtype=torch.float64) if isinstance(v, Tensor) else one * v for v in settings]
    )


# The settings of CallValue's slots, for messages.
_VALUE_NAMES = ("gamma", "percent_allowed_difference", "min_depth", "max_depth")


def resolved_settings(
    settings: RenderSettings, values: Optional[Tensor], device: torch.device, read: Optional[bool] = None
) -> RenderSettings:
    """``settings`` with the numbers of ``values`` (None: as they are) in their slots,
    checked as the renderer checks numbers (ValueError naming the setting), for a render on
    ``device``. ``read``: whether the host reads them (None: as ``read_values`` rules;
    reading CUDA values waits for the device). Values not read are left to the kernels
    (which take them from ``values`` whether or not they were read here) and ``settings``
    keep their placeholders. ValueError for values the kernels cannot read: not float64
    [4], not on ``device`` or not contiguous."""
    if values is None:
        return settings
    if values.shape != (CallValue.COUNT,) or values.dtype != torch.float64:
        raise ValueError(
            f"values: expected a float64 tensor of shape [{CallValue.COUNT}], got shape "
            f"{tuple(values.shape)}, dtype {values.dtype}"
        )
    if values.device != device or not values.is_contiguous():
        raise ValueError(
            f"values: expected a contiguous tensor on the render's device {device}, got one on {values.device}"
            + ("" if values.is_contiguous() else f" with strides {values.stride()}")
        )
    if not (read_values(settings, device) if read is None else read):
        return settings
    gamma, percent, near, far = values.tolist()
    _checks.check_call_numbers(gamma, percent, near, far)
    blend = settings.blend._replace(gamma=gamma, percent_allowed_difference=percent)
    if not settings.camera.camera_length:  # packed cameras carry their depths: the slots are only checked
        return settings._replace(blend=blend)
    return settings._replace(blend=blend, camera=settings.camera._replace(min_depth=near, max_depth=far))


def read_values(settings: RenderSettings, device: torch.device) -> bool:
    """Whether the host reads (and checks) a call's values: always on the CPU; on CUDA
    when value checks are on and nothing is being captured (the value checks wait for the
    device anyway), else the kernels take them as they are (out of range: NaN outputs,
    native/core/scene_view.h, call_values_valid)."""
    return device.type == "cpu" or (bool(settings.checks.check_values) and not capturing(device))


# ------------------------------------------------------------------ pulsar::render
_RENDER_SCHEMA = (
    "render(Tensor positions, Tensor features, Tensor radii, Tensor? opacities, Tensor? background, "
    "Tensor cameras, Tensor? values, float[] settings) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)
_BACKWARD_SCHEMA = (
    "render_backward(Tensor grad_image, Tensor? grad_depth_moments, Tensor positions, "
    "Tensor features, Tensor radii, Tensor? opacities, Tensor? background, Tensor cameras, "
    "Tensor? values, Tensor image, Tensor blend_state, Tensor counts, Tensor depth_moments, "
    "float[] settings, bool[] needs) -> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"
)
_PACK_SCHEMA = "pack_cameras(Tensor camera_vectors, float[] settings) -> Tensor"
_PACK_BACKWARD_SCHEMA = "pack_cameras_backward(Tensor camera_vectors, Tensor grad_packed, float[] settings) -> Tensor"

_lib = torch.library.Library("pulsar", "DEF")
for _schema in (_RENDER_SCHEMA, _BACKWARD_SCHEMA, _PACK_SCHEMA, _PACK_BACKWARD_SCHEMA):
    _lib.define(_schema)


class _NativeCall(NamedTuple):
    """What a forward handed the native renderer, kept for its backward (eager calls):
    the backward reuses it when its saved inputs are the very tensors the forward read."""

    settings: RenderSettings
    native: "_native.Renderer"
    scene: "_native.SceneArgs"
    options: "_native.RenderOptions"
    pointers: Tuple[int, ...]  # positions, features, radii, opacities, background, cameras


def _native_operands(operands: Tuple[Optional[Tensor], ...], dtype: torch.dtype) -> Tuple[Optional[Tensor], ...]:
    """pulsar::render's six tensor operands (positions .. cameras) as the native core reads
    them (``_native_view``), the default background for None."""
    positions, features, radii, opacities, background, cameras = (_native_view(t, dtype) for t in operands)
    if background is None:
        background = default_background(features.shape[-1], dtype, features.device)
    return positions, features, radii, opacities, background, cameras


def _render_forward(
    positions, features, radii, opacities, background, cameras, values, settings
) -> Tuple[Tuple[Optional[Tensor], ...], _NativeCall]:
    """The render: (image, blend_state, counts, forward_info or None, depth_moments or
    None), and the native call for the backward. ``values``: the call's settings as data
    (call_values) or None; ``settings``: RenderSettings, or its encoding (the operator's
    argument)."""
    dtype, device = positions.dtype, positions.device
    s = resolved_settings(RenderSettings.decode(settings), values, device)
    positions, features, radii, opacities, background, cameras = _native_operands(
        (positions, features, radii, opacities, background, cameras), dtype
    )
    lead = _lead(s, _batch(cameras))
    scene = _scene_args(s, positions, features, radii, opacities, background, cameras)  # read by the native call
    if s.checks.check_values and not capturing(device):
        _checks.check_values(positions, features, radii, opacities, background, cameras, s)
    native = native_renderer(s, features.shape[-1], device)
    outputs: List[Tensor] = []

    def make_outputs() -> "_native.ForwardOutputs":
        # Called by the native forward once the binning's device work is enqueued.
        image = torch.empty(lead + (features.shape[-1],), dtype=dtype, device=device)
        state = torch.empty(lead + (2,), dtype=dtype, device=device)
        counts = torch.empty((2,) + lead, dtype=torch.int32, device=device)
        info = (
            torch.empty(lead + (3 + 2 * int(s.config.n_track),), dtype=dtype, device=device)
            if s.outputs.want_forward_info
            else None
        )
        moments = (
            torch.empty(lead + (DEPTH_STATS,), dtype=dtype, device=device) if s.outputs.want_depth_moments else None
        )
        outputs.extend((image, state, counts, info, moments))
        hits = counts.data_ptr()
        return _native.ForwardOutputs(
            image.data_ptr(), state.data_ptr(), hits, hits + 4 * math.prod(lead), _ptr(info), _ptr(moments)
        )

    options = _options(s, device, values)
    try:
        native.forward(scene, options, make_outputs)
    except RuntimeError as error:
        _failed(
            error,
            "forward",
            s,
            device,
            dict(
                vert_pos=positions,
                vert_col=features,
                vert_rad=radii,
                opacity=opacities,
                bg_col=background,
                cameras=cameras.reshape(-1, cameras.shape[-1]),
            ),
        )
    pointers = (scene.positions, scene.features, scene.radii, scene.opacities, scene.background, scene.cameras)
    return tuple(outputs), _NativeCall(s, native, scene, options, pointers)


def _check_operands(operands: tuple, s: RenderSettings) -> None:
    """pulsar::render's six tensor operands (positions .. cameras) against its settings."""
    _checks.check_operands(*operands, int(s.camera.camera_length), bool(s.outputs.batch_dim))


def _render_kernel(positions, features, radii, opacities, background, cameras, values, settings):
    s = RenderSettings.decode(settings)
    _check_operands((positions, features, radii, opacities, background, cameras), s)
    outputs = _render_forward(positions, features, radii, opacities, background, cameras, values, s)[0]
    # The operator returns a tensor for every output: [0] for forward info and depth
    # moments that were not asked for (eager calls get None, _RenderFunction).
    return tuple(positions.new_empty((0,)) if t is None else t for t in outputs)


def _render_fake(positions, features, radii, opacities, background, cameras, values, settings):
    s = RenderSettings.decode(settings)
    _check_operands((positions, features, radii, opacities, background, cameras), s)
    lead = _lead(s, _batch(cameras))
    image = positions.new_empty(lead + (features.shape[-1],))
    state = positions.new_empty(lead + (2,))
    counts = positions.new_empty((2,) + lead, dtype=torch.int32)
    info = positions.new_empty(lead + (3 + 2 * int(s.config.n_track),) if s.outputs.want_forward_info else (0,))
    moments = positions.new_empty(lead + (DEPTH_STATS,) if s.outputs.want_depth_moments else (0,))
    return image, state, counts, info, moments


class BackwardOperands(NamedTuple):
    """pulsar::render_backward's arguments, in the schema's order."""

    grad_image: Tensor
    grad_depth_moments: Optional[Tensor]
    positions: Tensor
    features: Tensor
    radii: Tensor
    opacities: Optional[Tensor]
    background: Optional[Tensor]
    cameras: Tensor
    values: Optional[Tensor]
    image: Tensor
    blend_state: Tensor
    counts: Tensor
    depth_moments: Tensor
    settings: object  # RenderSettings, or its encoding
    needs: List[bool]  # per input (positions .. cameras): whether its gradient is made

    @property
    def inputs(self) -> Tuple[Optional[Tensor], ...]:
        """The render's six tensor inputs (positions .. cameras), whose gradients these are."""
        return self[2:8]


def _render_backward_kernel(*args):
    """pulsar::render_backward's kernel: the schema's arguments (BackwardOperands) to
    ``_render_backward_impl``, and an empty tensor for every gradient not asked for (the
    operator returns a tensor for each)."""
    operands = BackwardOperands(*args)
    grads = _render_backward_impl(operands)
    if any(g is None for g in grads):
        empty = operands.grad_image.new_empty((0,))
        grads = [empty if g is None else g for g in grads]
    return tuple(grads)


def _render_backward_impl(operands: BackwardOperands, call: Optional[_NativeCall] = None) -> List[Optional[Tensor]]:
    """The requested gradients (None where not requested). ``call``: the forward's native
    call, reused when the saved inputs are still where it read them."""
    a = operands
    inputs = a.inputs
    # The forward's dtype is the image gradient's: saved tensors may come back in another.
    dtype, device = a.grad_image.dtype, a.grad_image.device
    view = lambda t: _native_view(t, dtype)  # noqa: E731
    if call is not None and (
        call.pointers
        != (
            a.positions.data_ptr(),
            a.features.data_ptr(),
            a.radii.data_ptr(),
            _ptr(a.opacities),
            call.pointers[4] if a.background is None else a.background.data_ptr(),  # the default background
            a.cameras.data_ptr(),
        )
        or not (a.positions.is_contiguous() and a.features.is_contiguous() and a.cameras.is_contiguous())
    ):
        call = None  # a saved-tensor hook gave other tensors: made native-readable again below
    if call is None:
        inputs = _native_operands(inputs, dtype)
        s = resolved_settings(RenderSettings.decode(a.settings), a.values, device)
        call = _NativeCall(
            s,
            native_renderer(s, inputs[1].shape[-1], device),
            _scene_args(s, *inputs),
            _options(s, device, a.values),
            (),
        )
    positions, features, radii, opacities, background, cameras = inputs
    s = call.settings
    image, blend_state, grad_image = view(a.image), view(a.blend_state), view(a.grad_image)
    traversal_end = _native_view(a.counts, torch.int32)[1]
    want_moments = a.grad_depth_moments is not None and bool(s.outputs.want_depth_moments)
    depth_moments = grad_depth_moments = None
    if want_moments:
        depth_moments, grad_depth_moments = view(a.depth_moments), view(a.grad_depth_moments)
    grads = [torch.empty(t.shape, dtype=dtype, device=device) if need else None for need, t in zip(a.needs, inputs)]
    if any(g is not None for g in grads):
        args = _native.BackwardArgs(
            grad_image.data_ptr(),
            image.data_ptr(),
            blend_state.data_ptr(),
            traversal_end.data_ptr(),
            _ptr(depth_moments),
            _ptr(grad_depth_moments),
        )
        try:
            call.native.backward(call.scene, call.options, args, _native.GradientOutputs(*map(_ptr, grads)))
        except RuntimeError as error:
            _failed(
                error,
                "backward",
                s,
                device,
                dict(
                    vert_pos=positions,
                    vert_col=features,
                    vert_rad=radii,
                    opacity=opacities,
                    bg_col=background,
                    cameras=cameras.reshape(-1, cameras.shape[-1]),
                    grad_image=grad_image,
                    grad_depth_moments=grad_depth_moments,
                ),
            )
    return grads


def _render_backward_fake(*args):
    a = BackwardOperands(*args)
    return tuple(
        a.grad_image.new_empty(t.shape) if (need and t is not None) else a.grad_image.new_empty((0,))
        for need, t in zip(a.needs, a.inputs)
    )


def render_setup_context(ctx, inputs, output):
    """pulsar::render's autograd setup: saves what its backward reads. ``inputs``: the
    operator's arguments (positions .. cameras, values, settings); ``output``: (image,
    blend_state, counts, forward_info or None, depth_moments or None). Also the setup of
    any render made of the operator (ShardedRenderer), whose outputs may be merged ones."""
    positions, features, radii, opacities, background, cameras, values, settings = inputs
    image, state, counts, info, moments = output
    ctx.settings = settings
    ctx.save_for_backward(
        positions, features, radii, opacities, background, cameras, values, image, state, counts, moments
    )
    ctx.mark_non_differentiable(state, counts, *(() if info is None else (info,)))
    # Outputs without a gradient reach backward as None, not as zero-filled tensors.
    ctx.set_materialize_grads(False)


def backward_arguments(ctx, grad_image, grad_moments) -> Optional[BackwardOperands]:
    """pulsar::render_backward's arguments for the render call ``ctx`` saved (None when
    no gradient reaches the image or the moments); only requested gradients are made."""
    if grad_image is None and grad_moments is None:
        return None
    need = ctx.needs_input_grad
    # render_setup_context saved the operands from positions to depth_moments, in order.
    saved = ctx.saved_tensors
    if grad_image is None:
        grad_image = torch.zeros_like(saved[7])  # the image
    needs = [bool(need[i]) and t is not None for i, t in enumerate(saved[:6])]
    return BackwardOperands(grad_image, grad_moments, *saved, ctx.settings, needs)


def input_gradients(grads, args: BackwardOperands) -> tuple:
    """The render operator's input gradients from render_backward's outputs, for the
    backward arguments ``args`` (backward_arguments)."""
    if torch.is_grad_enabled():  # create_graph=True: the gradients must not pass as differentiable
        anchor = next((t for t in args[:8] if isinstance(t, Tensor) and t.requires_grad), None)
        if anchor is not None:
            grads = _NotDifferentiable.apply(anchor, *grads)
    return (*(g if n else None for g, n in zip(grads, args.needs)), None, None)  # and values, settings


def _render_backward(ctx, grad_image, _state, _counts, _info, grad_moments):
    """The render operator's registered backward: through pulsar::render_backward."""
    args = backward_arguments(ctx, grad_image, grad_moments)
    if args is None:
        return (None,) * 8
    return input_gradients(torch.ops.pulsar.render_backward(*args), args)


class _NotDifferentiable(torch.autograd.Function):
    """The renderer's gradients under create_graph=True: the same values, and a clear
    error where a second differentiation would pass through them."""

    @staticmethod
    def forward(ctx, anchor, *grads):  # anchor: an input that requires grad, so the outputs do
        return tuple(None if g is None else g.clone() for g in grads)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            "pulsar_py.Renderer: its gradients are not differentiable themselves (double backward "
            "through the renderer, e.g. a gradient penalty, is not supported)"
        )


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
        args.device_index = vectors.device.index
        args.stream = stream_handle(vectors.device)
    args.batch_size, args.length = vectors.shape
    for name, value in zip(PackSettings._fields, s):  # the struct's fields, by their names
        setattr(args, name, value)
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
    _native.camera_params_backward(
        _conversion_args(vectors, PackSettings.decode(settings)), grad_packed.data_ptr(), grad.data_ptr()
    )
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


for _name, _kernel, _fake in (
    ("render", _render_kernel, _render_fake),
    ("render_backward", _render_backward_kernel, _render_backward_fake),
    ("pack_cameras", _pack_kernel, _pack_fake),
    ("pack_cameras_backward", _pack_backward_kernel, _pack_backward_fake),
):
    _lib.impl(_name, _kernel, "CPU")
    _lib.impl(_name, _kernel, "CUDA")
    torch.library.register_fake(f"pulsar::{_name}", _fake, lib=_lib)

torch.library.register_autograd("pulsar::render", _render_backward, setup_context=render_setup_context, lib=_lib)
torch.library.register_autograd("pulsar::pack_cameras", _pack_backward, setup_context=_pack_setup_context, lib=_lib)

render = torch.ops.pulsar.render.default
pack_cameras = torch.ops.pulsar.pack_cameras.default


class _RenderFunction(torch.autograd.Function):
    """The render operator's kernels with its registered autograd formula
    (``render_setup_context``, ``backward_arguments``), without the dispatcher: see
    ``render_call``. ``rendered``: what ``_render_forward`` returned for these inputs,
    rendered before the node is made (the device bins while the host builds it)."""

    @staticmethod
    def forward(ctx, positions, features, radii, opacities, background, cameras, values, settings, rendered):
        output, ctx.call = rendered
        inputs = (positions, features, radii, opacities, background, cameras, values, settings)
        render_setup_context(ctx, inputs, output)
        return output

    @staticmethod
    def backward(ctx, grad_image, _state, _counts, _info, grad_moments):
        args = backward_arguments(ctx, grad_image, grad_moments)
        if args is None:
            return (None,) * 9
        return (*input_gradients(_render_backward_impl(args, call=ctx.call), args), None)  # and rendered


def _plain(t: Optional[Tensor]) -> bool:
    return t is None or type(t) is torch.Tensor or type(t) is torch.nn.Parameter


def render_call(
    positions: Tensor,
    features: Tensor,
    radii: Tensor,
    opacities: Optional[Tensor],
    background: Optional[Tensor],
    cameras: Tensor,
    values: Optional[Tensor],
    settings: RenderSettings,
) -> Tuple[Tensor, ...]:
    """pulsar::render, as the renderer calls it.

    Traced code (torch.compile, torch.export), an active dispatch mode (FakeTensorMode,
    TorchDispatchMode) or tensor subclasses get the operator itself. Plain eager calls run
    the same kernels under the same registered autograd formula through a plain
    autograd.Function: the dispatcher's round trip into the Python kernels and its generic
    autograd wrapper (which re-reads the operator's schema argument by argument) cost tens
    of microseconds of host time per call, time the device waits for on small scenes.
    """
    if (
        not torch.compiler.is_compiling()
        and torch._C._len_torch_dispatch_stack() == 0
        and _plain(positions)
        and _plain(features)
        and _plain(radii)
        and _plain(opacities)
        and _plain(background)
        and _plain(cameras)
    ):
        rendered = _render_forward(positions, features, radii, opacities, background, cameras, values, settings)
        if torch.is_grad_enabled() and (
            positions.requires_grad
            or features.requires_grad
            or radii.requires_grad
            or cameras.requires_grad
            or (opacities is not None and opacities.requires_grad)
            or (background is not None and background.requires_grad)
        ):
            return _RenderFunction.apply(
                positions, features, radii, opacities, background, cameras, values, settings, rendered
            )
        return rendered[0]
    return render(positions, features, radii, opacities, background, cameras, values, settings.encode())
