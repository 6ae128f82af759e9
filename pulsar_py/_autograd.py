"""The autograd Functions around the native core: the renderer, and the camera
conversion (Pulsar camera vectors -> packed cameras) that feeds it.

Forward allocates the outputs with torch (the caller owns outputs) and passes raw
pointers to the native core; backward routes ``ctx.needs_input_grad`` into the native
backward, so gradients nobody asked for are neither computed nor allocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from . import _native
from .debug import debug_enabled, save_snapshot


def _ptr(t: Optional[torch.Tensor]) -> int:
    return 0 if t is None else t.data_ptr()


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

    def options(self, device: torch.device) -> "_native.RenderOptions":
        opt = _native.RenderOptions()
        opt.gamma = self.gamma
        opt.percent_allowed_difference = self.percent_allowed_difference
        opt.max_n_hits = self.max_n_hits
        if device.type == "cuda":
            opt.stream = torch.cuda.current_stream(device).cuda_stream
        return opt


def _scene_args(pos, col, rad, opacity, bg, cameras, right_handed) -> "_native.SceneArgs":
    scene = _native.SceneArgs()
    scene.dtype = _native.DType.float64 if pos.dtype == torch.float64 else _native.DType.float32
    scene.batch_size = cameras.shape[0]
    scene.n_spheres = pos.shape[-2]
    scene.shared_spheres = pos.dim() == 2
    scene.positions = _ptr(pos)
    scene.features = _ptr(col)
    scene.radii = _ptr(rad)
    scene.opacities = _ptr(opacity)
    scene.background = _ptr(bg)
    scene.cameras = _ptr(cameras)
    scene.right_handed = right_handed
    return scene


class RenderFunction(torch.autograd.Function):
    """image, hit_count, forward_info, depth_moments = RenderFunction.apply(native,
    settings, pos, col, rad, opacity, bg, cameras).

    pos [B?, N, 3], col [B?, N, C], rad [B?, N], opacity [B?, N] or None, bg [C],
    cameras [B, 15] (packed native cameras, camera.h). Outputs: image [B, H, W, C];
    hit_count [B, H, W] int32; forward_info [B, H, W, 3 + 2K] or an empty tensor;
    depth_moments [B, H, W, 3] (differentiable) or an empty tensor.
    """

    @staticmethod
    def forward(ctx, native, settings: CallSettings, pos, col, rad, opacity, bg, cameras):
        cfg = native.config
        b, h, w, c = cameras.shape[0], cfg.height, cfg.width, cfg.n_channels
        like = dict(dtype=pos.dtype, device=pos.device)
        image = torch.empty((b, h, w, c), **like)
        state = torch.empty((b, h, w, 2), **like)
        hits = torch.empty((b, h, w), dtype=torch.int32, device=pos.device)
        ends = torch.empty((b, h, w), dtype=torch.int32, device=pos.device)
        info = (torch.empty((b, h, w, 3 + 2 * cfg.n_track), **like) if settings.want_forward_info
                else torch.empty(0, **like))
        moments = (torch.empty((b, h, w, 3), **like) if settings.want_depth_moments
                   else torch.empty(0, **like))
        out = _native.ForwardOutputs()
        out.image, out.blend_state, out.hit_count = _ptr(image), _ptr(state), _ptr(hits)
        out.traversal_end = _ptr(ends)
        out.forward_info = _ptr(info) if settings.want_forward_info else 0
        out.depth_moments = _ptr(moments) if settings.want_depth_moments else 0
        scene = _scene_args(pos, col, rad, opacity, bg, cameras, settings.right_handed)
        try:
            token = native.forward(scene, settings.options(pos.device), out)
        except RuntimeError as error:
            _reraise_with_snapshot(error, "forward", native, settings, pos.device, dict(
                vert_pos=pos, vert_col=col, vert_rad=rad, opacity=opacity, bg_col=bg, cameras=cameras))
        ctx.native, ctx.settings, ctx.token = native, settings, token
        ctx.has_opacity = opacity is not None
        ctx.save_for_backward(pos, col, rad, opacity, bg, cameras, image, state, ends, moments)
        ctx.mark_non_differentiable(hits, info)
        # Outputs without a gradient reach backward as None, not as zero-filled tensors
        # (the hit counts [B, H, W] alone cost an allocation and a fill per backward).
        ctx.set_materialize_grads(False)
        return image, hits, info, moments

    @staticmethod
    def backward(ctx, grad_image, _grad_hits, _grad_info, grad_moments):
        # grad_image, grad_moments: None when the output got no gradient (not materialised).
        if grad_image is None and (grad_moments is None or not ctx.settings.want_depth_moments):
            return (None,) * 8
        pos, col, rad, opacity, bg, cameras, image, state, ends, moments = ctx.saved_tensors
        if grad_image is None:
            grad_image = torch.zeros_like(image)
        want_moments = ctx.settings.want_depth_moments and grad_moments is not None
        need = ctx.needs_input_grad  # (native, settings, pos, col, rad, opacity, bg, cameras)
        grads = _native.GradientOutputs()
        g_pos = torch.empty_like(pos) if need[2] else None
        g_col = torch.empty_like(col) if need[3] else None
        g_rad = torch.empty_like(rad) if need[4] else None
        g_opa = torch.empty_like(opacity) if (need[5] and opacity is not None) else None
        g_bg = torch.empty_like(bg) if need[6] else None
        g_cam = torch.empty_like(cameras) if need[7] else None
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
            scene = _scene_args(pos, col, rad, opacity, bg, cameras, ctx.settings.right_handed)
            try:
                ctx.native.backward(scene, ctx.settings.options(pos.device), args, grads, ctx.token)
            except RuntimeError as error:
                _reraise_with_snapshot(error, "backward", ctx.native, ctx.settings, pos.device, dict(
                    vert_pos=pos, vert_col=col, vert_rad=rad, opacity=opacity, bg_col=bg, cameras=cameras,
                    grad_image=grad_image,
                    grad_depth_moments=grad_moments if want_moments else None))
        return None, None, g_pos, g_col, g_rad, g_opa, g_bg, g_cam


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
        packed = torch.empty((cam_params.shape[0], _native.CAMERA_PARAMS), dtype=cam_params.dtype,
                             device=cam_params.device)
        _native.camera_params_to_packed(args, packed.data_ptr())
        ctx.args = args  # reused by backward (its pointer is refreshed from the saved tensor)
        ctx.save_for_backward(cam_params)
        return packed

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_packed: torch.Tensor):
        grad_params = None
        if ctx.needs_input_grad[0]:
            (cam_params,) = ctx.saved_tensors
            grad_packed = grad_packed.contiguous()
            grad_params = torch.empty_like(cam_params)
            args = ctx.args
            args.params = cam_params.data_ptr()
            if cam_params.device.type == "cuda":  # backward may run on another stream than forward
                args.stream = torch.cuda.current_stream(cam_params.device).cuda_stream
            _native.camera_params_backward(args, grad_packed.data_ptr(), grad_params.data_ptr())
        return grad_params, None, None, None, None, None, None, None


def _camera_params_args(cam_params: torch.Tensor, width: int, height: int, orthographic: bool, right_handed: bool,
                        first_R_then_T: bool, min_depth: float, max_depth: float) -> "_native.CameraParamsArgs":
    """The native arguments for contiguous cam_params [B, L] (the native side checks L,
    B, the image size and the pointers; the tensor's own properties are checked here)."""
    if cam_params.dim() != 2:
        raise ValueError(f"cam_params: expected a tensor of shape [B, L], got shape {tuple(cam_params.shape)}")
    if cam_params.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"cam_params: expected dtype torch.float32 or torch.float64, got {cam_params.dtype}")
    if cam_params.device.type not in ("cpu", "cuda"):
        raise ValueError(f"cam_params: expected a tensor on cpu or cuda, got {cam_params.device}")
    args = _native.CameraParamsArgs()
    args.dtype = _native.DType.float64 if cam_params.dtype == torch.float64 else _native.DType.float32
    device = cam_params.device
    if device.type == "cuda":
        args.device = _native.DeviceKind.cuda
        args.device_index = device.index if device.index is not None else torch.cuda.current_device()
        args.stream = torch.cuda.current_stream(device).cuda_stream
    args.batch_size = cam_params.shape[0]
    args.length = cam_params.shape[-1]
    args.width, args.height = width, height
    args.orthographic, args.right_handed, args.first_R_then_T = orthographic, right_handed, first_R_then_T
    args.min_depth, args.max_depth = float(min_depth), float(max_depth)
    args.params = cam_params.data_ptr()
    return args


def _reraise_with_snapshot(error: RuntimeError, stage: str, native, settings: CallSettings,
                           device: torch.device, tensors: dict) -> None:
    """Re-raises a native failure; in debug mode first saves the call's inputs."""
    if not debug_enabled(settings.debug):
        raise error
    try:
        path = save_snapshot(stage, native, settings, device, tensors)
    except Exception as save_error:  # the original failure matters more than the snapshot
        raise RuntimeError(f"{error} (saving a debug snapshot failed too: {save_error})") from error
    raise RuntimeError(f"{error}\n[pulsar_py debug] the call's inputs were saved to {path}; "
                       f"reproduce with pulsar_py.replay({path!r})") from error
