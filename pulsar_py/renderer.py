"""``pulsar_py.Renderer``: PyTorch3D Pulsar's renderer API over the native core."""

from __future__ import annotations

import warnings
from typing import NamedTuple, Optional, Tuple, Union

import torch

from . import _checks, _native
from ._autograd import (CallSettings, CameraParamsFunction, RenderFunction, begin_forward,
                        camera_conversion_args, convert_camera_vectors)
from .cameras.camera import Camera
from .cameras.params import NativeCamera, VALID_PARAM_LENGTHS, camera_from_params
from .outputs import RenderResult, depth_from_moments
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


class _CheckedCall(NamedTuple):
    """What the hot path's plain arguments resolve to (Renderer._checked_call), with the
    native renderer they pick (its look-up, _native_for, took 1.0 us of Python per frame
    on the project's machine before the first kernel; the lent GPU machine's host runs
    such Python several times slower)."""

    settings: CallSettings
    camera_args: "_native.CameraParamsArgs"
    mode: int
    native: "_native.Renderer"


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
        deterministic: ask for bitwise reproducible results. Honoured at no cost: both
            backends are deterministic by construction (fixed-order reductions, no
            atomics), with or without this flag or torch.use_deterministic_algorithms.
        debug: when a native call fails, save its inputs to a file named in the error
            (pulsar_py.replay(path) repeats it); also PULSAR_PY_DEBUG=1. See
            docs/reliability.md.
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
        deterministic: bool = False,
        debug: bool = False,
    ) -> None:
        super().__init__()
        self.width = _checks.check_int("width", width, 1, _checks.MAX_IMAGE_SIDE)
        self.height = _checks.check_int("height", height, 1, _checks.MAX_IMAGE_SIDE)
        self.max_num_balls = None if max_num_balls is None else _checks.check_int("max_num_balls", max_num_balls, 1)
        self.orthogonal_projection = _checks.check_bool("orthogonal_projection", orthogonal_projection)
        self.right_handed_system = _checks.check_bool("right_handed_system", right_handed_system)
        self.background_normalized_depth = _checks.check_float(
            "background_normalized_depth", background_normalized_depth, 0.0, 1.0, low_open=True, high_open=True)
        self.n_channels = _checks.check_int("n_channels", n_channels, 1)
        self.n_track = _checks.check_int("n_track", n_track, 1, _checks.MAX_TRACK)
        self.num_threads = _checks.check_int("num_threads", num_threads, 0)
        #: Always True in effect (docs/reliability.md, "Determinism"); kept for the record.
        self.deterministic = _checks.check_bool("deterministic", deterministic)
        #: Save a failing native call's inputs for pulsar_py.replay (pulsar_py/debug.py).
        self.debug = _checks.check_bool("debug", debug)
        #: Check tensor values (NaN/Inf, magnitudes, ranges) on every call: one device
        #: sync per call on CUDA. False skips them (docs/reliability.md, "check_values").
        self.check_values = True
        # CUDA backward: bytes of gradient rows per window (0: default). For tests that
        # exercise many windows; any budget computes the same gradients.
        self._backward_row_budget = 0
        # Tracks the module's device through .to(), .cuda(), .cpu().
        self.register_buffer("_device_tracker", torch.empty(0), persistent=False)
        # Its device as a plain attribute, refreshed by _apply (which .to(), .cuda() and
        # .cpu() go through): a buffer's lookup takes nn.Module.__getattr__, about 0.8 us
        # per call on the project's machine, twice or more per frame.
        self._device = self._device_tracker.device
        self._natives: dict = {}
        self._warned_small_gamma = False
        # The last call's CallSettings, and the hot path's checked call, with their keys:
        # rebuilt only when a call's settings differ (saves checks, pybind and dataclass
        # work per frame).
        self._last_settings: Optional[tuple] = None
        self._last_call: Optional[tuple] = None  # (key, _CheckedCall)

    @property
    def device(self) -> torch.device:
        return self._device

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        self._device = self._device_tracker.device
        return module

    def to(self, *args, **kwargs) -> "Renderer":
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is not None:
            check_device_usable(torch.device(device))
        return super().to(*args, **kwargs)

    def cuda(self, device=None) -> "Renderer":
        check_device_usable(torch.device("cuda") if device is None else torch.device("cuda", device)
                            if isinstance(device, int) else torch.device(device))
        return super().cuda(device)

    def _native_for(self, device: torch.device, orthographic: Optional[bool] = None) -> "_native.Renderer":
        # One native renderer per device and projection (a Camera carries its own
        # projection; None: the renderer's); the renderer's own keeps the plain device key.
        if orthographic is None:
            orthographic = self.orthogonal_projection
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
            cfg.backward_row_budget = self._backward_row_budget
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
            cam_params: [B?, L], L in {8, 10, 11, 13}: Pulsar camera vectors (the
                renderer's projection and handedness apply), or a ``pulsar_py.Camera``
                (its own projection and handedness apply; docs/cameras.md).
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
        depths = _checks.depth_numbers(max_depth, min_depth)
        if depths is not None and isinstance(cam_params, torch.Tensor):
            return self._forward_camera_vectors(vert_pos, vert_col, vert_rad, cam_params, gamma, max_depth, min_depth,
                                                depths, bg_col, opacity, percent_allowed_difference, max_n_hits,
                                                mode, return_forward_info, first_R_then_T)
        checks = _checks.DeferredValueChecks() if self.check_values else None
        pos, col, rad, opacity, bg, batched = self._check_scene(vert_pos, vert_col, vert_rad, opacity, bg_col, checks)
        camera, camera_batched = self._resolve_camera(cam_params, pos, checks, first_R_then_T, "cam_params",
                                                      depths=depths)
        raw = self._render(pos, col, rad, opacity, bg, camera, gamma, max_depth, min_depth,
                           percent_allowed_difference, max_n_hits, mode, return_forward_info, checks)
        info = raw.forward_info
        result = raw.image if mode == 0 else raw.hit_count[..., None].to(pos.dtype)
        if not (batched or camera_batched):
            result = _drop_batch(result)
            info = _drop_batch(info) if return_forward_info else info
        return (result, info) if return_forward_info else result

    def _forward_camera_vectors(self, vert_pos, vert_col, vert_rad, cam_params: torch.Tensor, gamma, max_depth,
                                min_depth, depths: Tuple[float, float], bg_col, opacity, percent_allowed_difference,
                                max_n_hits, mode, return_forward_info, first_R_then_T):
        """``forward`` with camera vectors and plain-number depths: the hot path.

        The same checks and the same native calls as the general path, with the camera
        conversion outside the autograd graph: RenderFunction carries the camera gradient
        back through the conversion's exact derivative, so a frame is one autograd node
        and its outputs are allocated in their final shape (no squeeze node). On the lent
        GPU machine's host the Python of a small frame is most of its time
        (benchmarks/host_path.py, docs/benchmarks.md).
        """
        checks = _checks.DeferredValueChecks() if self.check_values else None
        pos, col, rad, opacity, bg, batched = self._check_scene(vert_pos, vert_col, vert_rad, opacity, bg_col, checks)
        # cam_params itself enters RenderFunction; the conversion reads its values only.
        batch = _checks.plain_camera_batch(cam_params, pos, self.device) if checks is None else 0
        if batch:
            cams = cam_params  # [L] or [B, L] as they are (their pointer is read)
        else:
            # Checked and shaped [B, L] outside the graph.
            cams = self._check_cam_params(cam_params.detach(), pos, checks).contiguous()
            batch = cams.shape[0]
        call = self._checked_call((gamma, percent_allowed_difference, max_n_hits, mode, return_forward_info,
                                   first_R_then_T, max_depth, min_depth), depths, batch, cams.shape[-1], pos,
                                  batched or cam_params.dim() == 2)
        # Vectors used as they are: the renderer converts them itself in begin_forward's
        # native call (and the backward again from cam_params). Checked ones (their values
        # are read below) or reshaped ones are converted here.
        packed = None if cams is cam_params else convert_camera_vectors(cams, call.camera_args)
        if checks is not None:
            _checks.run_camera_checks(checks, packed[:, 13], packed[:, 14], packed[:, 12], packed[:, :13],
                                      self.orthogonal_projection, max_depth, min_depth, "cam_params")
        # The binning starts before the autograd node is built: the device works while
        # the host builds it and allocates the outputs.
        native = call.native
        begun = begin_forward(native, call.settings, pos, col, rad, opacity, bg, packed, cams, call.camera_args)
        self._warn_if_sharp(call.settings.gamma, pos, rad, cam_params)
        image, hits, info, _ = RenderFunction.apply(native, call.settings, pos, col, rad, opacity, bg, packed,
                                                    cam_params, call.camera_args, begun)
        result = image if call.mode == 0 else hits[..., None].to(pos.dtype)
        return (result, info) if call.settings.want_forward_info else result

    def _checked_call(self, scalars: tuple, depths: Tuple[float, float], batch: int, length: int,
                      pos: torch.Tensor, batch_dim: bool) -> "_CheckedCall":
        """The hot path's checked settings and camera-conversion arguments for the
        call's plain arguments ``scalars`` (gamma,
        percent_allowed_difference, max_n_hits, mode, return_forward_info, first_R_then_T,
        max_depth, min_depth), reused while calls repeat them. On the lent GPU machine's
        host these checks and look-ups took about 30 us before the first kernel of every
        frame (benchmarks/host_stamps.py, docs/benchmarks.md). The key holds the
        arguments' types ahead of their values: a value equal to a checked one but of
        another type (True for 1, a tensor for a number) is checked again, and compared
        with nothing."""
        key = (tuple(map(type, scalars)), scalars, batch, length, pos.dtype, pos.device, batch_dim, self.debug,
               self.right_handed_system, self.orthogonal_projection, self.width, self.height)
        last = self._last_call
        if last is not None and last[0] == key:
            return last[1]
        gamma, percent, max_n_hits, mode, return_forward_info, first_R_then_T, max_depth, min_depth = scalars
        first_R_then_T = _checks.check_bool("first_R_then_T", first_R_then_T)
        gamma, percent, hit_cap, mode, want_info = _checks.check_call_settings(
            gamma, percent, max_n_hits, mode, return_forward_info)
        _checks.check_batch(batch, self.width, self.height)
        _checks.check_depth_numbers(max_depth, min_depth)
        call = _CheckedCall(
            settings=self._call_settings(gamma, percent, hit_cap, self.right_handed_system, want_info,
                                         batch_dim=batch_dim),
            camera_args=camera_conversion_args(batch, length, pos.dtype, pos.device, self.width, self.height,
                                               self.orthogonal_projection, self.right_handed_system,
                                               first_R_then_T, *depths),
            mode=mode, native=self._native_for(pos.device))
        self._last_call = (key, call)
        return call

    def _call_settings(self, gamma: float, percent: float, hit_cap: int, right_handed: bool, want_info: bool,
                       want_moments: bool = False, batch_dim: bool = True) -> CallSettings:
        """The call's CallSettings, reused while they stay the same (they are frozen)."""
        key = (gamma, percent, hit_cap, right_handed, want_info, want_moments, self.debug, batch_dim)
        if self._last_settings is None or self._last_settings[0] != key:
            self._last_settings = (key, CallSettings(
                gamma=gamma, percent_allowed_difference=percent, max_n_hits=hit_cap, right_handed=right_handed,
                want_forward_info=want_info, want_depth_moments=want_moments, debug=self.debug,
                batch_dim=batch_dim))
        return self._last_settings[1]

    def _warn_if_sharp(self, gamma: float, pos: torch.Tensor, rad: torch.Tensor, camera_leaf: torch.Tensor) -> None:
        """Warns once per renderer when a small gamma meets geometry or camera gradients."""
        if gamma >= 1e-3 or self._warned_small_gamma or not torch.is_grad_enabled():
            return
        if pos.requires_grad or rad.requires_grad or camera_leaf.requires_grad:
            warnings.warn(f"gamma={gamma} < 1e-3: geometry and camera gradients become very sharp and "
                          "may be unstable for optimisation", stacklevel=4)
            self._warned_small_gamma = True

    def render(
        self,
        vert_pos: torch.Tensor,
        vert_col: torch.Tensor,
        vert_rad: torch.Tensor,
        camera: Union[Camera, torch.Tensor],
        gamma: float,
        max_depth: float,
        min_depth: float = 0.0,
        bg_col: Optional[torch.Tensor] = None,
        opacity: Optional[torch.Tensor] = None,
        percent_allowed_difference: float = 0.01,
        max_n_hits: Optional[int] = None,
        return_forward_info: bool = False,
        sh_degree: Optional[int] = None,
        mask: Optional[torch.Tensor] = None,
        first_R_then_T: bool = False,
    ) -> RenderResult:
        """Render image, expected depth, coverage and depth distortion in one native call.

        Args:
            vert_pos: [B?, N, 3] sphere centres (world units).
            vert_col: [B?, N, C] features, or with ``sh_degree`` spherical-harmonics
                coefficients [B?, N, (sh_degree + 1)^2, C] (pulsar_py.sh): each camera
                sees colour max(SH(d) + 0.5, 0), d the direction from its centre to the
                sphere's (orthographic: its optical axis).
            vert_rad: [B?, N] radii (> 0).
            camera: a ``pulsar_py.Camera`` (its projection and handedness are used) or
                Pulsar camera vectors [B?, L] (the renderer's flags apply).
            gamma, max_depth, min_depth, bg_col, opacity, percent_allowed_difference,
                max_n_hits, first_R_then_T: as for ``forward`` (first_R_then_T only with
                camera vectors).
            return_forward_info: also fill ``forward_info``.
            sh_degree: None (plain features) or 0..3.
            mask: [B?, N] bool, False marks padding: those spheres contribute nothing,
                get zero gradients, and their values are ignored (they may hold anything,
                NaN included). Lets B scenes with different sphere counts share one call
                (pad each to N). They are moved behind the camera, where culling drops
                them before any pixel work.

        Returns:
            RenderResult: image [B?, H, W, C], depth, coverage, distortion [B?, H, W]
            (differentiable; see its docstring), hit_count and optional forward_info.
            B is present when spheres, camera or mask were batched; a batch of cameras
            with unbatched spheres renders the same spheres from every camera.
        """
        checks = _checks.DeferredValueChecks() if self.check_values else None
        pos = _checks.check_tensor("vert_pos", vert_pos, dims=(2, 3), last=3, device=self.device)
        camera_native, camera_batched = self._resolve_camera(camera, pos, checks, first_R_then_T, "camera",
                                                             depths=_checks.depth_numbers(max_depth, min_depth))
        col, rad = vert_col, vert_rad
        if sh_degree is not None:
            sh_degree = check_sh_degree(sh_degree)
            _checks.check_tensor("vert_col", col, dims=(pos.dim() + 1,), dtype=pos.dtype, device=self.device)
            want = tuple(pos.shape[:-1]) + (sh_n_coefficients(sh_degree), self.n_channels)
            if tuple(col.shape) != want:
                raise ValueError(f"vert_col: expected SH coefficients of shape {want} for sh_degree {sh_degree}, "
                                 f"got {tuple(col.shape)}")
        # Types, dtypes, devices and shapes now (values are checked on what is rendered).
        self._check_scene(pos, col if sh_degree is None else col[..., 0, :], rad, opacity, bg_col, None)
        mask_batched = False
        if mask is not None:
            mask, camera_native = self._check_mask(mask, pos, camera_native)
            mask_batched = mask.dim() == 2
            pos, col, rad, opacity = self._apply_mask(mask, pos, col, rad, opacity, camera_native,
                                                      sh_degree is not None)
        if sh_degree is not None:
            col = self._sh_features(col, pos, camera_native, sh_degree)
        pos, col, rad, opacity = _unify_sphere_batch(pos, col, rad, opacity)
        pos, col, rad, opacity, bg, _ = self._check_scene(pos, col, rad, opacity, bg_col, checks)
        if pos.dim() == 3:
            camera_native = _expand_camera(camera_native, pos.shape[0], "camera")
        raw = self._render(pos, col, rad, opacity, bg, camera_native, gamma, max_depth, min_depth,
                           percent_allowed_difference, max_n_hits, 0, return_forward_info, checks,
                           want_depth_moments=True)
        moments = raw.depth_moments
        depth, distortion = depth_from_moments(moments, raw.near[:, None, None], raw.far[:, None, None])
        result = RenderResult(image=raw.image, depth=depth, coverage=moments[..., 0], distortion=distortion,
                              hit_count=raw.hit_count, forward_info=raw.forward_info if return_forward_info else None)
        if not (vert_pos.dim() == 3 or camera_batched or mask_batched):
            result = RenderResult(**{k: (None if v is None else _drop_batch(v)) for k, v in result.__dict__.items()})
        return result

    @torch.no_grad()
    def visible(
        self,
        vert_pos: torch.Tensor,
        vert_rad: torch.Tensor,
        camera: Union[Camera, torch.Tensor],
        max_depth: Optional[float] = None,
        min_depth: float = 0.0,
        first_R_then_T: bool = False,
    ) -> torch.Tensor:
        """Which spheres a camera can see (no gradient): bool [B?, N].

        True when the sphere survives culling (model.md section 3: closest depth in
        [min_depth, max_depth], centre in front) and its hit region's bounding box on the
        image overlaps the pixel centres (pulsar_py.visibility): conservative, so a sphere
        that renders into some pixel is always True, and a True sphere may still miss
        every pixel centre.

        Args:
            vert_pos: [B?, N, 3]; vert_rad: [B?, N] (> 0).
            camera: a ``pulsar_py.Camera`` or Pulsar camera vectors [B?, L].
            max_depth: far depth (None: no far culling); min_depth: near depth (0 means
                focal length / film distance + 2e-6), as for rendering.
        """
        pos = _checks.check_tensor("vert_pos", vert_pos, dims=(2, 3), last=3, device=self.device)
        rad = _checks.check_tensor("vert_rad", vert_rad, dims=(pos.dim() - 1,), dtype=pos.dtype, device=self.device)
        if rad.shape != pos.shape[:-1]:
            raise ValueError(f"vert_rad: expected shape {tuple(pos.shape[:-1])} to match vert_pos, "
                             f"got {tuple(rad.shape)}")
        camera_native, camera_batched = self._resolve_camera(camera, pos, None, first_R_then_T, "camera")
        min_depth_t = torch.as_tensor(min_depth, dtype=pos.dtype, device=pos.device)
        near = torch.where(min_depth_t == 0, camera_native.focal + 2e-6, min_depth_t)
        far = torch.full_like(near, float("inf") if max_depth is None else float(max_depth))
        result = visible_spheres(pos, rad, camera_native, self.width, self.height, near, far)
        return result if (pos.dim() == 3 or camera_batched) else result[0]

    # ----------------------------------------------------------------------------------
    def _check_scene(self, vert_pos, vert_col, vert_rad, opacity, bg_col, checks):
        """Contiguous (pos, col, rad, opacity, bg, batched) after _checks.check_scene."""
        return _checks.check_scene(vert_pos, vert_col, vert_rad, opacity, bg_col, n_channels=self.n_channels,
                                   device=self.device, max_num_balls=self.max_num_balls, checks=checks)

    def _check_cam_params(self, cam_params, pos, checks, name: str = "cam_params") -> torch.Tensor:
        """Camera vectors [B, L] after _checks.check_cam_params."""
        return _checks.check_cam_params(cam_params, pos, device=self.device, orthographic=self.orthogonal_projection,
                                        checks=checks, name=name)

    def _render(self, pos, col, rad, opacity, bg, camera: NativeCamera, gamma, max_depth, min_depth,
                percent_allowed_difference, max_n_hits, mode, return_forward_info, checks=None,
                want_depth_moments: bool = False) -> _RawOutputs:
        """Shared by every entry point: depth range, settings, and the native call."""
        gamma, percent, hit_cap, mode, return_forward_info = _checks.check_call_settings(
            gamma, percent_allowed_difference, max_n_hits, mode, return_forward_info)
        _checks.check_batch(camera.batch_size, self.width, self.height)
        depths = _checks.depth_numbers(max_depth, min_depth)
        if camera.native_packed is not None and depths is not None and camera.native_depths == depths:
            # Camera vectors with number depths (render()): CameraParamsFunction already
            # resolved near/far into the packed cameras [B, 15]; no tensor is built from
            # the depth numbers. (forward() takes _forward_camera_vectors instead.)
            _checks.check_depth_numbers(max_depth, min_depth)
            cameras = camera.native_packed.contiguous()  # a copy only when expanded
            near, far = cameras[:, 13], cameras[:, 14]
        else:
            max_depth_t, min_depth_t = _checks.check_depth_range(max_depth, min_depth, pos.dtype, pos.device)
            near = torch.where(min_depth_t == 0, camera.focal + 2e-6, min_depth_t.expand_as(camera.focal))
            far = max_depth_t.expand_as(camera.focal)
            cameras = None
        if checks is not None:
            _checks.run_camera_checks(checks, near, far, camera.focal, camera.packed(), camera.orthographic,
                                      max_depth, min_depth, "cam_params or the Camera")
        if cameras is None:
            cameras = torch.cat([camera.packed(), near[:, None], far[:, None]], dim=-1).contiguous()
        self._warn_if_sharp(gamma, pos, rad, cameras)
        settings = self._call_settings(gamma, percent, hit_cap, camera.right_handed, bool(return_forward_info),
                                       bool(want_depth_moments))
        native = self._native_for(pos.device, camera.orthographic)
        image, hits, info, moments = RenderFunction.apply(native, settings, pos, col, rad, opacity, bg, cameras)
        return _RawOutputs(image, hits, info, moments, near, far)

    def _resolve_camera(self, camera, pos: torch.Tensor, checks, first_R_then_T: bool, name: str,
                        depths: Optional[Tuple[float, float]] = None) -> Tuple[NativeCamera, bool]:
        """(native camera, whether the camera input was batched) of a Camera or camera
        vectors; expanded to pos's batch when spheres are batched and the camera is one.

        Camera vectors with ``depths`` = (min_depth, max_depth) given as numbers are
        converted by one native op (CameraParamsFunction) into packed cameras [B, 15],
        near/far included, which the returned camera carries for ``_render``; without
        ``depths`` (tensor depths, ``visible``) the torch reference camera_from_params
        converts them.
        """
        first_R_then_T = _checks.check_bool("first_R_then_T", first_R_then_T)
        if isinstance(camera, Camera):
            if first_R_then_T:
                raise ValueError("first_R_then_T: applies to camera vectors only, not to a pulsar_py.Camera; got True")
            if camera.dtype != pos.dtype:
                raise TypeError(f"{name}: expected a Camera of dtype {pos.dtype} like vert_pos (mixed dtypes are "
                                f"not cast), got {camera.dtype}")
            if camera.device != self.device:
                raise ValueError(f"{name}: expected a Camera on {self.device} (the renderer's device), "
                                 f"got {camera.device}")
            if checks is not None:
                camera.add_value_checks(checks)
            native = camera.native(self.width, self.height)
            if pos.dim() == 3:
                native = _expand_camera(native, pos.shape[0], name)
            return native, camera.batched
        if not isinstance(camera, torch.Tensor):
            raise TypeError(f"{name}: expected a pulsar_py.Camera or camera vectors (torch.Tensor [B?, L]), "
                            f"got {type(camera).__name__}")
        cams = self._check_cam_params(camera, pos, checks, name)
        if depths is not None:
            min_depth, max_depth = depths
            packed = CameraParamsFunction.apply(cams, self.width, self.height, self.orthogonal_projection,
                                                self.right_handed_system, first_R_then_T, min_depth, max_depth)
            native = NativeCamera.from_packed(packed, self.right_handed_system, self.orthogonal_projection, depths)
        else:
            native = camera_from_params(cams, self.width, self.height, self.orthogonal_projection,
                                        self.right_handed_system, first_R_then_T)
        return native, camera.dim() == 2

    def _check_mask(self, mask, pos: torch.Tensor, camera: NativeCamera) -> Tuple[torch.Tensor, NativeCamera]:
        """The validated mask [B?, N] and the camera expanded to its batch."""
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask: expected a torch.Tensor of dtype bool, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise TypeError(f"mask: expected dtype torch.bool, got {mask.dtype}")
        if mask.device != self.device:
            raise ValueError(f"mask: expected a tensor on {self.device} (the renderer's device), got {mask.device}")
        n = pos.shape[-2]
        if mask.dim() not in (1, 2) or mask.shape[-1] != n or (pos.dim() == 3 and mask.dim() == 2
                                                                and mask.shape[0] != pos.shape[0]):
            want = f"[{n}] or [{pos.shape[0]}, {n}]" if pos.dim() == 3 else f"[{n}] or [B, {n}]"
            raise ValueError(f"mask: expected shape {want} like vert_pos {tuple(pos.shape)}, got {tuple(mask.shape)}")
        if mask.dim() == 2:
            camera = _expand_camera(camera, mask.shape[0], "camera")
        return mask, camera

    @staticmethod
    def _apply_mask(mask, pos, col, rad, opacity, camera: NativeCamera, is_sh: bool):
        """Replace masked-out spheres by finite stand-ins behind the camera (culled).

        torch.where passes zero gradient to the replaced entries whatever they held.
        A stand-in is a sphere of radius 1 at a distance > 1 straight behind the eye: its
        centre is not in front (perspective) and its closest depth is negative
        (orthographic), so culling drops it (model.md section 3) and it costs no pixel work.
        """
        eye, axis = camera.eye.detach(), camera.optical_axis().detach()  # [Bc, 3]
        distance = _MASKED_DISTANCE + _MASKED_DISTANCE_REL * eye.abs().amax(-1, keepdim=True)
        behind = eye - distance * axis  # [Bc, 3]
        # One camera and nothing batched: keep the spheres unbatched.
        per_camera = camera.batch_size > 1 or pos.dim() == 3 or mask.dim() == 2
        behind = behind[:, None, :] if per_camera else behind[0]
        keep = mask[..., None]
        pos = torch.where(keep, pos, behind.to(pos.dtype))
        rad = torch.where(mask, rad, torch.ones((), dtype=rad.dtype, device=rad.device))
        col = torch.where(keep[..., None] if is_sh else keep, col, torch.zeros((), dtype=col.dtype, device=col.device))
        if opacity is not None:
            opacity = torch.where(mask, opacity, torch.ones((), dtype=opacity.dtype, device=opacity.device))
        return pos, col, rad, opacity

    @staticmethod
    def _sh_features(coefficients, pos, camera: NativeCamera, degree: int) -> torch.Tensor:
        """Per-camera colours [B?, N, C] of SH coefficients [B?, N, K, C]: B when the
        spheres or the cameras are batched."""
        per_camera = camera.batch_size > 1 or pos.dim() == 3
        if camera.orthographic:
            direction = camera.optical_axis()  # one view direction for every sphere
            directions = direction[:, None, :] if per_camera else direction[0]
            directions = directions.expand(pos.shape[:-1] + (3,) if not per_camera else
                                           (camera.batch_size, pos.shape[-2], 3))
        else:
            directions = pos - (camera.eye[:, None, :] if per_camera else camera.eye[0])
        return sh_to_color(coefficients, directions, degree)

    # ----------------------------------------------------------------------------------
    @staticmethod
    def sphere_ids_from_result_info_nograd(result_info: torch.Tensor) -> torch.Tensor:
        """Sphere ids of the K closest hits: int32 [B?, H, W, K], -1 where empty.

        float32 forward info stores ids as int32 bits (Pulsar's layout); float64 stores
        the id's value.
        """
        result_info = _checks.check_forward_info("result_info", result_info)
        n_track = (result_info.shape[-1] - 3) // 2
        slots = result_info[..., 3 : 3 + 2 * n_track : 2].detach().contiguous()
        if slots.dtype == torch.float32:
            return slots.view(torch.int32).clone()
        return slots.round().to(torch.int32)

    @staticmethod
    def depth_map_from_result_info_nograd(result_info: torch.Tensor) -> torch.Tensor:
        """Intersection depth of the closest hit: [B?, H, W], -1 where nothing is hit."""
        return _checks.check_forward_info("result_info", result_info)[..., 4].detach().clone()

    def extra_repr(self) -> str:
        return (f"width={self.width}, height={self.height}, n_channels={self.n_channels}, n_track={self.n_track}, "
                f"orthogonal_projection={self.orthogonal_projection}, "
                f"right_handed_system={self.right_handed_system}")


def _drop_batch(t: torch.Tensor) -> torch.Tensor:
    """[1, ...] -> [...] as a view. Indexing ``t[0]`` gives the same values, but its
    backward allocates and zeroes a tensor of the full batch (two kernels per call)."""
    return t.squeeze(0)


def _expand_camera(camera: NativeCamera, batch: int, name: str) -> NativeCamera:
    """``camera`` with batch size ``batch``: unchanged, or its single camera repeated."""
    if camera.batch_size == batch:
        return camera
    if camera.batch_size != 1:
        raise ValueError(f"{name}: expected 1 camera or a batch of {batch} like the spheres/mask, "
                         f"got {camera.batch_size}")
    grow = lambda t: t.expand((batch,) + tuple(t.shape[1:]))  # noqa: E731
    if camera.native_packed is not None:  # keep the views of one packed tensor
        return NativeCamera.from_packed(grow(camera.native_packed), camera.right_handed, camera.orthographic,
                                        camera.native_depths)
    return NativeCamera(eye=grow(camera.eye), p00_rel=grow(camera.p00_rel), pdx=grow(camera.pdx),
                        pdy=grow(camera.pdy), focal=grow(camera.focal), right_handed=camera.right_handed,
                        orthographic=camera.orthographic)


def _unify_sphere_batch(pos, col, rad, opacity):
    """Per-sphere tensors all unbatched, or all batched with one B (the native call
    shares spheres across cameras only when every per-sphere input is shared)."""
    sizes = [t.shape[0] for t, rank in ((pos, 2), (col, 2), (rad, 1), (opacity, 1))
             if t is not None and t.dim() == rank + 1]
    if not sizes:
        return pos, col, rad, opacity
    batch = max(sizes)
    grow = lambda t, rank: None if t is None else (  # noqa: E731
        t if t.dim() == rank + 1 else t.unsqueeze(0).expand((batch,) + tuple(t.shape)))
    return grow(pos, 2), grow(col, 2), grow(rad, 1), grow(opacity, 1)
