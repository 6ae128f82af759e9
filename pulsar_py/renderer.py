"""``pulsar_py.Renderer``: PyTorch3D Pulsar's renderer API over the native core."""

from __future__ import annotations

import warnings
from typing import NamedTuple, Optional, Tuple, Union

import torch

from . import _checks, _native
from ._autograd import CallSettings, RenderFunction
from .camera import Camera
from .camera_params import NativeCamera, VALID_PARAM_LENGTHS, camera_from_params
from .outputs import RenderResult
from .reference import depth_from_moments
from .sh import check_sh_degree, sh_n_coefficients, sh_to_color
from .visibility import visible_spheres

# Pulsar's "unlimited" max_n_hits.
_UNLIMITED_HITS = 2**32 - 1


def check_device_usable(device: torch.device) -> None:
    """ValueError naming `device` when this build or this machine cannot render there."""
    if device.type == "cuda":
        if "cuda" not in _native.build_info()["backends"]:
            raise ValueError(f"device: {device} requested, but this build of pulsar_py has no CUDA backend "
                             f"(build_info: {_native.build_info()})")
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device} requested, but torch sees no CUDA device "
                             f"(torch {torch.__version__}, CUDA {torch.version.cuda})")
    elif device.type not in ("cpu", "meta"):
        raise ValueError(f"device: expected cpu or cuda, got {device}")


def _device_key(device: torch.device) -> Tuple[str, int]:
    if device.type == "cuda":
        return ("cuda", device.index if device.index is not None else torch.cuda.current_device())
    return (device.type, 0)


class _RawOutputs(NamedTuple):
    """Outputs of the shared native call, with the depth range it used."""

    image: torch.Tensor  # [B, H, W, C]
    hit_count: torch.Tensor  # [B, H, W] int32
    forward_info: torch.Tensor  # [B, H, W, 3 + 2K] or empty
    depth_moments: torch.Tensor  # [B, H, W, 3] or empty
    near: torch.Tensor  # [B] resolved min_depth
    far: torch.Tensor  # [B] max_depth


# Masked-out spheres (Renderer.render's mask) are moved behind the camera, where culling
# drops them: this many world units plus a share of the eye's coordinates (float32 safe).
_MASKED_DISTANCE = 2.0
_MASKED_DISTANCE_REL = 1e-3


class Renderer(torch.nn.Module):
    """Differentiable sphere renderer with Pulsar's constructor and call signature.

    Construct once per image size; call per frame. Buffers grow as needed and are
    reused call after call.

    Args:
        width, height: image size in pixels (1..16384 each).
        max_num_balls: accepted for compatibility; None (default) lets buffers grow as
            needed. When given, calls with more spheres raise ValueError.
        orthogonal_projection: orthographic instead of perspective projection.
        right_handed_system: interpret ``cam_params`` in a right-handed system.
        background_normalized_depth: beta, the background's normalised depth, in (0, 1).
        n_channels: C, feature channels per sphere (>= 1).
        n_track: K, closest hits per pixel reported in forward info (1..128).
        num_threads: CPU threads for the CPU backend; 0 uses every core.
    """

    def __init__(
        self,
        width: int,
        height: int,
        max_num_balls: Optional[int] = None,
        orthogonal_projection: bool = False,
        right_handed_system: bool = False,
        background_normalized_depth: float = 1e-6,
        n_channels: int = 3,
        n_track: int = 5,
        num_threads: int = 0,
    ) -> None:
        super().__init__()
        self.width = _checks.check_int("width", width, 1, _checks.MAX_IMAGE_SIDE)
        self.height = _checks.check_int("height", height, 1, _checks.MAX_IMAGE_SIDE)
        self.max_num_balls = None if max_num_balls is None else _checks.check_int("max_num_balls", max_num_balls, 1)
        self.orthogonal_projection = bool(orthogonal_projection)
        self.right_handed_system = bool(right_handed_system)
        self.background_normalized_depth = _checks.check_float(
            "background_normalized_depth", background_normalized_depth, 0.0, 1.0, low_open=True, high_open=True)
        self.n_channels = _checks.check_int("n_channels", n_channels, 1)
        self.n_track = _checks.check_int("n_track", n_track, 1, _checks.MAX_TRACK)
        self.num_threads = _checks.check_int("num_threads", num_threads, 0)
        #: Check tensor values (NaN/Inf, ranges) on every call. On CUDA this costs a sync.
        self.check_values = True
        # Tracks the module's device through .to(), .cuda(), .cpu().
        self.register_buffer("_device_tracker", torch.empty(0), persistent=False)
        self._natives: dict = {}
        self._warned_small_gamma = False

    @property
    def device(self) -> torch.device:
        return self._device_tracker.device

    def to(self, *args, **kwargs) -> "Renderer":
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is not None:
            check_device_usable(torch.device(device))
        return super().to(*args, **kwargs)

    def cuda(self, device=None) -> "Renderer":
        check_device_usable(torch.device("cuda") if device is None else torch.device("cuda", device)
                            if isinstance(device, int) else torch.device(device))
        return super().cuda(device)

    def _native_for(self, device: torch.device, orthographic: bool) -> "_native.Renderer":
        # One native renderer per device and projection (a Camera carries its own
        # projection); the renderer's own projection keeps the plain device key.
        key = _device_key(device)
        if bool(orthographic) != self.orthogonal_projection:
            key = key + ("orthographic" if orthographic else "perspective",)
        native = self._natives.get(key)
        if native is None:
            check_device_usable(device)
            cfg = _native.RendererConfig()
            cfg.width, cfg.height = self.width, self.height
            cfg.n_channels, cfg.n_track = self.n_channels, self.n_track
            cfg.orthographic = bool(orthographic)
            cfg.background_normalized_depth = self.background_normalized_depth
            cfg.device = _native.DeviceKind.cuda if device.type == "cuda" else _native.DeviceKind.cpu
            cfg.device_index = key[1]
            cfg.num_threads = self.num_threads
            native = _native.Renderer(cfg)
            self._natives[key] = native
        return native

    def forward(
        self,
        vert_pos: torch.Tensor,
        vert_col: torch.Tensor,
        vert_rad: torch.Tensor,
        cam_params: torch.Tensor,
        gamma: float,
        max_depth: float,
        min_depth: float = 0.0,
        bg_col: Optional[torch.Tensor] = None,
        opacity: Optional[torch.Tensor] = None,
        percent_allowed_difference: float = 0.01,
        max_n_hits: Optional[int] = None,
        mode: int = 0,
        return_forward_info: bool = False,
        first_R_then_T: bool = False,
    ) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
        """Render spheres (Pulsar's signature and semantics; exact gradients).

        Args:
            vert_pos: [B?, N, 3] sphere centres (world units).
            vert_col: [B?, N, C] features.
            vert_rad: [B?, N] radii (> 0, world units).
            cam_params: [B?, L], L in {8, 10, 11, 13}: Pulsar camera vectors.
            gamma: blending softness in [1e-5, 1] (small: hard, 1: soft).
            max_depth: far depth (world units).
            min_depth: near depth; 0 means focal length + 2e-6.
            bg_col: [C] background features (default ones).
            opacity: [B?, N] in [0, 1] (default ones).
            percent_allowed_difference: p in [0, 1) of the early termination rule.
            max_n_hits: hard cap on processed hits per pixel (None: unlimited).
            mode: 0 renders features; 1 returns the hit count [B?, H, W, 1] (no gradient).
            return_forward_info: also return forward info [B?, H, W, 3 + 2K].
            first_R_then_T: camera position is rotated first (``M @ pos``).

        Returns:
            image [B?, H, W, C] (mode 0) or hit counts [B?, H, W, 1] (mode 1), and the
            forward info when requested. The batch dimension is present when any input
            was batched.
        """
        checks = _checks.DeferredValueChecks() if self.check_values else None
        pos, col, rad, opacity, bg, batched = self._check_scene(vert_pos, vert_col, vert_rad, opacity, bg_col, checks)
        cams = self._check_cam_params(cam_params, pos, checks)
        batched = batched or cam_params.dim() == 2
        camera = camera_from_params(cams, self.width, self.height, self.orthogonal_projection,
                                    self.right_handed_system, first_R_then_T)
        image, hits, info, _ = self._render(pos, col, rad, opacity, bg, camera, gamma, max_depth, min_depth,
                                            percent_allowed_difference, max_n_hits, mode, return_forward_info,
                                            checks)
        result = image if mode == 0 else hits[..., None].to(pos.dtype)
        if not batched:
            result = result[0]
            info = info[0] if return_forward_info else info
        return (result, info) if return_forward_info else result

    # ----------------------------------------------------------------------------------
    def _check_scene(self, vert_pos, vert_col, vert_rad, opacity, bg_col, checks):
        pos = _checks.check_tensor("vert_pos", vert_pos, dims=(2, 3), last=3)
        dtype, device = pos.dtype, self.device
        _checks.check_tensor("vert_pos", pos, dims=(2, 3), device=device)
        col = _checks.check_tensor("vert_col", vert_col, dims=(pos.dim(),), last=self.n_channels,
                                   dtype=dtype, device=device)
        rad = _checks.check_tensor("vert_rad", vert_rad, dims=(pos.dim() - 1,), dtype=dtype, device=device)
        n = pos.shape[-2]
        if col.shape[:-1] != pos.shape[:-1]:
            raise ValueError(f"vert_col: expected shape {tuple(pos.shape[:-1]) + (self.n_channels,)} "
                             f"to match vert_pos {tuple(pos.shape)}, got {tuple(col.shape)}")
        if rad.shape != pos.shape[:-1]:
            raise ValueError(f"vert_rad: expected shape {tuple(pos.shape[:-1])} to match vert_pos "
                             f"{tuple(pos.shape)}, got {tuple(rad.shape)}")
        if opacity is not None:
            _checks.check_tensor("opacity", opacity, dims=(pos.dim() - 1,), dtype=dtype, device=device)
            if opacity.shape != pos.shape[:-1]:
                raise ValueError(f"opacity: expected shape {tuple(pos.shape[:-1])} to match vert_pos, "
                                 f"got {tuple(opacity.shape)}")
        if bg_col is None:
            bg = torch.ones(self.n_channels, dtype=dtype, device=device)
        else:
            bg = _checks.check_tensor("bg_col", bg_col, dims=(1,), last=self.n_channels, dtype=dtype, device=device)
        if self.max_num_balls is not None and n > self.max_num_balls:
            raise ValueError(f"vert_pos: expected at most max_num_balls={self.max_num_balls} spheres, got {n}")
        if checks is not None:
            for name, t in (("vert_pos", pos), ("vert_col", col), ("vert_rad", rad), ("bg_col", bg)):
                checks.finite(name, t)
            checks.in_range("vert_rad", rad, 0.0, float("inf"), low_open=True)
            if opacity is not None:
                checks.finite("opacity", opacity)
                checks.in_range("opacity", opacity, 0.0, 1.0)
        return (pos.contiguous(), col.contiguous(), rad.contiguous(),
                None if opacity is None else opacity.contiguous(), bg.contiguous(), pos.dim() == 3)

    def _check_cam_params(self, cam_params, pos, checks) -> torch.Tensor:
        cams = _checks.check_tensor("cam_params", cam_params, dims=(1, 2), dtype=pos.dtype, device=self.device)
        if cams.shape[-1] not in VALID_PARAM_LENGTHS:
            raise ValueError(f"cam_params: expected a last dimension of 8, 10, 11 or 13 values, "
                             f"got shape {tuple(cams.shape)}")
        if checks is not None:
            checks.finite("cam_params", cams)
        cams = cams if cams.dim() == 2 else cams[None]
        if pos.dim() == 3 and cams.shape[0] != pos.shape[0]:
            if cams.shape[0] != 1:
                raise ValueError(f"cam_params: expected a batch of {pos.shape[0]} cameras like vert_pos, "
                                 f"got {cams.shape[0]}")
            cams = cams.expand(pos.shape[0], -1)
        n_rot = 6 if cams.shape[-1] in (11, 13) else 3
        focal, sensor = cams[:, 3 + n_rot], cams[:, 4 + n_rot]
        if checks is not None:
            checks.add((sensor <= 0).any(), lambda: _checks.fail(
                f"cam_params: expected sensor width (index {4 + n_rot}) > 0, got {sensor.min().item()}"))
            if self.orthogonal_projection:
                checks.add((focal != 0).any(), lambda: _checks.fail(
                    f"cam_params: expected focal length (index {3 + n_rot}) 0 for an orthographic renderer, "
                    f"got {focal.abs().max().item()}"))
            else:
                checks.add((focal <= 0).any(), lambda: _checks.fail(
                    f"cam_params: expected focal length (index {3 + n_rot}) > 0, got {focal.min().item()}"))
        return cams

    def _render(self, pos, col, rad, opacity, bg, camera: NativeCamera, gamma, max_depth, min_depth,
                percent_allowed_difference, max_n_hits, mode, return_forward_info, checks=None):
        """Shared by every entry point: depth range, settings, and the native call."""
        gamma = _checks.check_float("gamma", gamma, 1e-5, 1.0)
        percent = _checks.check_float("percent_allowed_difference", percent_allowed_difference, 0.0, 1.0, high_open=True)
        mode = _checks.check_int("mode", mode, 0, 1)
        if max_n_hits is None or max_n_hits == _UNLIMITED_HITS:
            hit_cap = -1
        else:
            hit_cap = _checks.check_int("max_n_hits", max_n_hits, 1)
        max_depth_t = torch.as_tensor(max_depth, dtype=pos.dtype, device=pos.device)
        min_depth_t = torch.as_tensor(min_depth, dtype=pos.dtype, device=pos.device)
        if max_depth_t.dim() != 0 or min_depth_t.dim() != 0:
            raise ValueError("max_depth, min_depth: expected scalars")
        near = torch.where(min_depth_t == 0, camera.focal + 2e-6, min_depth_t.expand_as(camera.focal))
        far = max_depth_t.expand_as(camera.focal)
        if checks is not None:
            checks.add(~(torch.isfinite(far).all() & torch.isfinite(near).all()), lambda: _checks.fail(
                f"max_depth, min_depth: expected finite values, got {max_depth}, {min_depth}"))
            checks.add((near < 0).any(), lambda: _checks.fail(f"min_depth: expected >= 0, got {min_depth}"))
            if not self.orthogonal_projection:
                checks.add((near <= camera.focal).any(), lambda: _checks.fail(
                    f"min_depth: expected > focal length {camera.focal.max().item()}, got {min_depth}"))
            checks.add((far <= near).any(), lambda: _checks.fail(
                f"max_depth: expected > min_depth ({near.max().item()}), got {max_depth}"))
            checks.run()
        wants_geometry_grad = torch.is_grad_enabled() and (
            pos.requires_grad or rad.requires_grad or camera.eye.requires_grad or camera.pdx.requires_grad)
        if gamma < 1e-3 and wants_geometry_grad and not self._warned_small_gamma:
            warnings.warn(f"gamma={gamma} < 1e-3: geometry and camera gradients become very sharp and "
                          "may be unstable for optimisation", stacklevel=3)
            self._warned_small_gamma = True
        cameras = torch.cat([camera.packed(), near[:, None], far[:, None]], dim=-1).contiguous()
        settings = CallSettings(gamma=gamma, percent_allowed_difference=percent, max_n_hits=hit_cap,
                                right_handed=camera.right_handed,
                                want_forward_info=bool(return_forward_info))
        native = self._native_for(pos.device)
        return RenderFunction.apply(native, settings, pos, col, rad, opacity, bg, cameras)

    # ----------------------------------------------------------------------------------
    @staticmethod
    def sphere_ids_from_result_info_nograd(result_info: torch.Tensor) -> torch.Tensor:
        """Sphere ids of the K closest hits: int32 [B?, H, W, K], -1 where empty.

        float32 forward info stores ids as int32 bits (Pulsar's layout); float64 stores
        the id's value.
        """
        n_track = (result_info.shape[-1] - 3) // 2
        slots = result_info[..., 3 : 3 + 2 * n_track : 2].detach().contiguous()
        if slots.dtype == torch.float32:
            return slots.view(torch.int32).clone()
        return slots.round().to(torch.int32)

    @staticmethod
    def depth_map_from_result_info_nograd(result_info: torch.Tensor) -> torch.Tensor:
        """Intersection depth of the closest hit: [B?, H, W], -1 where nothing is hit."""
        return result_info[..., 4].detach().clone()

    def extra_repr(self) -> str:
        return (f"width={self.width}, height={self.height}, n_channels={self.n_channels}, n_track={self.n_track}, "
                f"orthogonal_projection={self.orthogonal_projection}, "
                f"right_handed_system={self.right_handed_system}")
