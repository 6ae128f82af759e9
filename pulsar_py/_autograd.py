"""The autograd Functions around the native core: the renderer, and the camera
conversion (Pulsar camera vectors -> packed cameras) that feeds it.

Forward allocates the outputs with torch (the caller owns outputs) and passes raw
pointers to the native core; backward routes ``ctx.needs_input_grad`` into the native
backward, so gradients nobody asked for are neither computed nor allocated.

The hot path (``Renderer.forward`` with camera vectors and plain-number depths) is one
autograd node: the camera conversion runs outside the graph and RenderFunction carries
the camera gradient back through the conversion's exact derivative itself. On the lent
H100 machine's host a second node and its Python cost about 100 us per forward +
backward (benchmarks/host_path.py), time the GPU spends idle on small scenes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch
from torch.autograd.function import once_differentiable

from . import _native
from .debug import debug_enabled, save_snapshot


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


# torch's current CUDA stream as a raw handle: the private accessor is one C call, the
# public torch.cuda.current_stream builds a Stream object (about 10 us per call on the
# lent machine's host, twice per frame).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def stream_handle(device: torch.device) -> int:
    """cudaStream_t (as an int) of torch's current stream on ``device``; 0 on the CPU."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        return int(_raw_stream(index))
    return torch.cuda.current_stream(index).cuda_stream


@dataclass(frozen=True)
class CallSettings:
    """Per-call settings that are not tensors."""

    gamma: float
    percent_allowed_difference: float
    max_n_hits: int  # < 0: unlimited
    right_handed: bool
    want_forward_info: bool
    want_depth_moments: bool = False
    debug: bool = False  # save a snapshot of the inputs when the native call fails (debug.py)
    # Outputs keep the batch dimension [B, H, W, ...]; False (B must be 1): [H, W, ...],
    # the same memory, so an unbatched call needs no squeeze node in the graph.
    batch_dim: bool = True

    def options(self, device: torch.device) -> "_native.RenderOptions":
        """The native options on torch's current stream of ``device`` (one object per
        settings and stream, made once: the native core only reads it)."""
        return _render_options(self, stream_handle(device))


@functools.lru_cache(maxsize=64)
def _render_options(settings: CallSettings, stream: int) -> "_native.RenderOptions":
    opt = _native.RenderOptions()
    opt.gamma = settings.gamma
    opt.percent_allowed_difference = settings.percent_allowed_difference
    opt.max_n_hits = settings.max_n_hits
    opt.stream = stream
    return opt


def _scene_args(pos, col, rad, opacity, bg, batch: int, cameras: int, right_handed) -> "_native.SceneArgs":
    """The native scene of a call; cameras: the packed cameras' pointer, 0 when the
    renderer converts camera vectors itself (it then points the scene at its own)."""
    dtype = _native.DType.float64 if pos.dtype == torch.float64 else _native.DType.float32
    return _native.SceneArgs(dtype, batch, pos.shape[-2], pos.dim() == 2, pos.data_ptr(), col.data_ptr(),
                             rad.data_ptr(), _ptr(opacity), bg.data_ptr(), cameras, right_handed)


def _packed_cameras(cameras: Optional[torch.Tensor], cam_params: Optional[torch.Tensor],
                    camera_args) -> torch.Tensor:
    """The call's packed cameras [B, 15] as a tensor: ``cameras`` itself, or a conversion
    of the contiguous ``cam_params`` when the renderer converted them into its own
    buffer (for debug snapshots, off the hot path)."""
    return cameras if cameras is not None else convert_camera_vectors(cam_params, camera_args)


class BegunForward(NamedTuple):
    """A forward whose native binning was started (``begin_forward``) before
    RenderFunction.apply: the scene and options it was started with."""

    scene: "_native.SceneArgs"
    options: "_native.RenderOptions"


def begin_forward(native, settings: CallSettings, pos, col, rad, opacity, bg, cameras, cam_params=None,
                  camera_args=None) -> BegunForward:
    """Starts the native binning of a forward; RenderFunction.apply(..., begun=...) then
    completes it. The device bins while the host builds the autograd node and allocates
    the outputs (on the lent H100's host about 60 us that came before the first binning
    kernel when the binning started inside the node).

    cameras: packed [B, 15]; or None, with contiguous camera vectors cam_params [B?, L]
    and their ``camera_args``: the renderer converts them into its own buffer in the
    same native call (no allocation and no second call before the first kernel)."""
    options = settings.options(pos.device)
    try:
        if cameras is None:
            scene = _scene_args(pos, col, rad, opacity, bg, camera_args.batch_size, 0, settings.right_handed)
            native.begin_forward_from_vectors(scene, options, camera_args, cam_params.data_ptr())
        else:
            scene = _scene_args(pos, col, rad, opacity, bg, cameras.shape[0], cameras.data_ptr(),
                                settings.right_handed)
            native.begin_forward(scene, options)
    except RuntimeError as error:
        _forward_failed(error, native, settings, pos, col, rad, opacity, bg, cameras, cam_params, camera_args)
    return BegunForward(scene, options)


class RenderFunction(torch.autograd.Function):
    """image, hit_count, forward_info, depth_moments = RenderFunction.apply(native,
    settings, pos, col, rad, opacity, bg, cameras[, cam_params, camera_args, begun]).

    pos [B?, N, 3], col [B?, N, C], rad [B?, N], opacity [B?, N] or None, bg [C],
    cameras [B, 15] (packed native cameras, camera.h). cam_params: None, or the camera
    vectors [B?, L] (L in {8, 10, 11, 13}) that ``cameras`` was converted from outside
    the graph with ``camera_args`` (``convert_camera_vectors``); the camera gradient then
    reaches cam_params through the conversion's exact derivative, one node instead of
    two. cameras None with contiguous cam_params: the renderer converts the vectors into
    its own buffer (``begin_forward``), and the backward converts them again. begun: None, or the ``begin_forward`` of these very inputs, called just before
    (the hot path starts the binning before building the node). Outputs (without B when
    ``settings.batch_dim`` is False): image [B, H, W, C];
    hit_count [B, H, W] int32; forward_info [B, H, W, 3 + 2K] or None; depth_moments
    [B, H, W, 3] (differentiable) or None.
    """

    @staticmethod
    def forward(ctx, native, settings: CallSettings, pos, col, rad, opacity, bg, cameras, cam_params=None,
                camera_args=None, begun: Optional[BegunForward] = None):
        # The binning starts first (here, or before the node: ``begun``); the outputs are
        # allocated while the device works on it (W4 on the lent H100: about 40 us of the
        # host's time no longer before the GPU's).
        if begun is None:
            begun = begin_forward(native, settings, pos, col, rad, opacity, bg, cameras, cam_params, camera_args)
        scene, options = begun.scene, begun.options
        cfg = native.config
        b, c = scene.batch_size, cfg.n_channels
        lead = (b, cfg.height, cfg.width) if settings.batch_dim else (cfg.height, cfg.width)
        like = dict(dtype=pos.dtype, device=pos.device)
        image = torch.empty(lead + (c,), **like)
        state = torch.empty(lead + (2,), **like)
        hits, ends = torch.empty((2,) + lead, dtype=torch.int32, device=pos.device).unbind(0)
        info = torch.empty(lead + (3 + 2 * cfg.n_track,), **like) if settings.want_forward_info else None
        moments = torch.empty(lead + (3,), **like) if settings.want_depth_moments else None
        out = _native.ForwardOutputs()
        out.image, out.blend_state, out.hit_count = _ptr(image), _ptr(state), _ptr(hits)
        out.traversal_end, out.forward_info, out.depth_moments = _ptr(ends), _ptr(info), _ptr(moments)
        try:
            token = native.finish_forward(scene, options, out)
        except RuntimeError as error:
            _forward_failed(error, native, settings, pos, col, rad, opacity, bg, cameras, cam_params, camera_args)
        ctx.native, ctx.settings, ctx.token, ctx.camera_args = native, settings, token, camera_args
        ctx.batch = b
        ctx.save_for_backward(pos, col, rad, opacity, bg, cameras, cam_params, image, state, ends, moments)
        ctx.mark_non_differentiable(*(t for t in (hits, info) if t is not None))
        # Outputs without a gradient reach backward as None, not as zero-filled tensors
        # (the hit counts [B, H, W] alone cost an allocation and a fill per backward).
        ctx.set_materialize_grads(False)
        return image, hits, info, moments

    @staticmethod
    def backward(ctx, grad_image, _grad_hits, _grad_info, grad_moments):
        # grad_image, grad_moments: None when the output got no gradient (not materialised).
        if grad_image is None and (grad_moments is None or not ctx.settings.want_depth_moments):
            return (None,) * 11
        pos, col, rad, opacity, bg, cameras, cam_params, image, state, ends, moments = ctx.saved_tensors
        if grad_image is None:
            grad_image = torch.zeros_like(image)
        want_moments = ctx.settings.want_depth_moments and grad_moments is not None
        # (native, settings, pos, col, rad, opacity, bg, cameras[, cam_params, camera_args])
        need = ctx.needs_input_grad
        want_params = cam_params is not None and need[8]
        grads = _native.GradientOutputs()
        g_pos = torch.empty_like(pos) if need[2] else None
        g_col = torch.empty_like(col) if need[3] else None
        g_rad = torch.empty_like(rad) if need[4] else None
        g_opa = torch.empty_like(opacity) if (need[5] and opacity is not None) else None
        g_bg = torch.empty_like(bg) if need[6] else None
        g_cam = (torch.empty((ctx.batch, _native.CAMERA_PARAMS), dtype=pos.dtype, device=pos.device)
                 if (need[7] or want_params) else None)
        if any(g is not None for g in (g_pos, g_col, g_rad, g_opa, g_bg, g_cam)):
            grads.positions, grads.features, grads.radii = _ptr(g_pos), _ptr(g_col), _ptr(g_rad)
            grads.opacities, grads.background, grads.cameras = _ptr(g_opa), _ptr(g_bg), _ptr(g_cam)
            args = _native.BackwardArgs()
            grad_image = grad_image.contiguous()
            args.grad_image, args.image = _ptr(grad_image), _ptr(image)
            args.blend_state, args.traversal_end = _ptr(state), _ptr(ends)
            if want_moments:
                grad_moments = grad_moments.contiguous()
                args.depth_moments, args.grad_depth_moments = _ptr(moments), _ptr(grad_moments)
            scene = _scene_args(pos, col, rad, opacity, bg, ctx.batch, _ptr(cameras), ctx.settings.right_handed)
            options = ctx.settings.options(pos.device)
            try:
                if cameras is None:  # the renderer's conversion may have been rewritten since
                    ctx.native.use_camera_vectors(scene, options, ctx.camera_args, cam_params.data_ptr())
                ctx.native.backward(scene, options, args, grads, ctx.token)
            except RuntimeError as error:
                _reraise_with_snapshot(error, "backward", ctx.native, ctx.settings, pos.device, dict(
                    vert_pos=pos, vert_col=col, vert_rad=rad, opacity=opacity, bg_col=bg,
                    cameras=lambda: _packed_cameras(cameras, cam_params, ctx.camera_args),
                    grad_image=grad_image,
                    grad_depth_moments=grad_moments if want_moments else None))
        g_params = camera_vectors_backward(ctx.camera_args, cam_params, g_cam) if want_params else None
        return None, None, g_pos, g_col, g_rad, g_opa, g_bg, (g_cam if need[7] else None), g_params, None, None


def convert_camera_vectors(cams: torch.Tensor, args: "_native.CameraParamsArgs") -> torch.Tensor:
    """Packed cameras [B, 15] of contiguous camera vectors cams [B, L] (or [L]: B = 1),
    outside the graph (RenderFunction differentiates the conversion when given the
    vectors; only their values are read here). ``args`` describes the conversion; its
    pointer and stream are set here."""
    batch = cams.numel() // cams.shape[-1]
    packed = torch.empty((batch, _native.CAMERA_PARAMS), dtype=cams.dtype, device=cams.device)
    args.params = cams.data_ptr()
    args.stream = stream_handle(cams.device)
    _native.camera_params_to_packed(args, packed.data_ptr())
    return packed


def camera_vectors_backward(args: "_native.CameraParamsArgs", cam_params: torch.Tensor,
                            grad_packed: torch.Tensor) -> torch.Tensor:
    """dL/dcam_params, shaped like cam_params [B?, L] (one camera expanded over a batch of
    B gets the sum over the batch), from dL/dpacked [B, 15]."""
    batch, length = grad_packed.shape[0], cam_params.shape[-1]
    cams = cam_params.detach().reshape(-1, length)
    rows = cams.shape[0]
    cams = cams.expand(batch, length).contiguous()
    grad = torch.empty_like(cams)
    args.params = cams.data_ptr()
    args.stream = stream_handle(cams.device)  # backward may run on another stream than forward
    _native.camera_params_backward(args, grad_packed.data_ptr(), grad.data_ptr())
    if rows != batch:
        grad = grad.sum(0)
    return grad.reshape(cam_params.shape)


class CameraParamsFunction(torch.autograd.Function):
    """packed = CameraParamsFunction.apply(cam_params, width, height, orthographic,
    right_handed, first_R_then_T, min_depth, max_depth).

    Pulsar camera vectors cam_params [B, L] (L in {8, 10, 11, 13}, float32/float64, on
    the CPU or CUDA) -> packed native cameras [B, 15] (include/pulsar/camera.h: eye,
    p00_rel, pdx, pdy, focal, resolved min_depth, max_depth), in one native op each way
    instead of ~60 tiny torch ops (include/pulsar/camera_params.h). Same values and
    gradients as ``camera_from_params`` followed by the near/far resolution of
    ``Renderer._render`` (min_depth 0: focal length + 2e-6; focal length 0 when
    orthographic). min_depth and max_depth are plain numbers (no gradient). The backward
    is the exact derivative of the native forward; it is not itself differentiable.
    """

    @staticmethod
    def forward(ctx, cam_params: torch.Tensor, width: int, height: int, orthographic: bool, right_handed: bool,
                first_R_then_T: bool, min_depth: float, max_depth: float) -> torch.Tensor:
        cam_params = cam_params.contiguous()
        args = _camera_params_args(cam_params, width, height, orthographic, right_handed, first_R_then_T,
                                   min_depth, max_depth)
        ctx.args = args  # reused by backward (its pointer is refreshed from the saved tensor)
        ctx.save_for_backward(cam_params)
        return convert_camera_vectors(cam_params, args)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_packed: torch.Tensor):
        grad_params = None
        if ctx.needs_input_grad[0]:
            (cam_params,) = ctx.saved_tensors
            grad_params = camera_vectors_backward(ctx.args, cam_params, grad_packed.contiguous())
        return grad_params, None, None, None, None, None, None, None


def _camera_params_args(cam_params: torch.Tensor, width: int, height: int, orthographic: bool, right_handed: bool,
                        first_R_then_T: bool, min_depth: float, max_depth: float) -> "_native.CameraParamsArgs":
    """The native arguments for contiguous cam_params [B, L], pointer and stream set per
    call (convert_camera_vectors, camera_vectors_backward). The native side checks L, B,
    the image size and the pointers; the tensor's own properties are checked here."""
    if cam_params.dim() != 2:
        raise ValueError(f"cam_params: expected a tensor of shape [B, L], got shape {tuple(cam_params.shape)}")
    if cam_params.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"cam_params: expected dtype torch.float32 or torch.float64, got {cam_params.dtype}")
    if cam_params.device.type not in ("cpu", "cuda"):
        raise ValueError(f"cam_params: expected a tensor on cpu or cuda, got {cam_params.device}")
    return camera_conversion_args(cam_params.shape[0], cam_params.shape[-1], cam_params.dtype, cam_params.device,
                                  width, height, orthographic, right_handed, first_R_then_T, min_depth, max_depth)


def camera_conversion_args(batch: int, length: int, dtype: torch.dtype, device: torch.device, width: int, height: int,
                           orthographic: bool, right_handed: bool, first_R_then_T: bool, min_depth: float,
                           max_depth: float) -> "_native.CameraParamsArgs":
    """The native description of a camera conversion of [batch, length] vectors, without
    the pointer and stream (set per call: convert_camera_vectors)."""
    args = _native.CameraParamsArgs()
    args.dtype = _native.DType.float64 if dtype == torch.float64 else _native.DType.float32
    if device.type == "cuda":
        args.device = _native.DeviceKind.cuda
        args.device_index = device.index if device.index is not None else torch.cuda.current_device()
    args.batch_size = batch
    args.length = length
    args.width, args.height = width, height
    args.orthographic, args.right_handed, args.first_R_then_T = orthographic, right_handed, first_R_then_T
    args.min_depth, args.max_depth = float(min_depth), float(max_depth)
    return args


def _forward_failed(error: RuntimeError, native, settings: CallSettings, pos, col, rad, opacity, bg, cameras,
                    cam_params, camera_args) -> None:
    """Re-raises a failure of either native forward call (begin_forward, finish_forward)
    with the forward's inputs in the debug snapshot (the packed cameras made only for a
    snapshot when the renderer converted the vectors itself: _packed_cameras)."""
    _reraise_with_snapshot(error, "forward", native, settings, pos.device, dict(
        vert_pos=pos, vert_col=col, vert_rad=rad, opacity=opacity, bg_col=bg,
        cameras=lambda: _packed_cameras(cameras, cam_params, camera_args)))


def _reraise_with_snapshot(error: RuntimeError, stage: str, native, settings: CallSettings,
                           device: torch.device, tensors: dict) -> None:
    """Re-raises a native failure; in debug mode first saves the call's inputs (a value
    of ``tensors`` may be a function that makes the tensor: called here, after the
    failure, and its own failure reported with it)."""
    if not debug_enabled(settings.debug):
        raise error
    try:
        tensors = {name: (value() if callable(value) else value) for name, value in tensors.items()}
        path = save_snapshot(stage, native, settings, device, tensors)
    except Exception as save_error:  # the original failure matters more than the snapshot
        raise RuntimeError(f"{error} (saving a debug snapshot failed too: {save_error})") from error
    raise RuntimeError(f"{error}\n[pulsar_py debug] the call's inputs were saved to {path}; "
                       f"reproduce with pulsar_py.replay({path!r})") from error
