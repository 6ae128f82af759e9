"""``pulsar_py.Renderer``: PyTorch3D Pulsar's renderer API over the native core.

Every entry point (``forward``, ``render``, ``visible``) checks its inputs once
(pulsar_py/_checks.py), turns its camera into one form the operators take (Pulsar camera
vectors [B, L] with plain-number depths, converted natively inside the render call; any
other camera as packed cameras [B, 15]) and calls the torch.library operators of
pulsar_py/ops.py, which alone reach the native core.
"""

from __future__ import annotations

import itertools
import math
import warnings
import weakref
from typing import NamedTuple, Optional, Tuple, Union

import torch

from . import _checks, _native, ops
from .autocast import float32_under_autocast
from .camera_layouts import PACKED, CameraVectorLayout
from .cameras.camera import Camera
from .cameras.params import NativeCamera
from .gradient_scaling import check_gradient_scaling
from .gradient_scaling import render_call as scaled_render_call
from .outputs import RenderResult, depth_from_moments, forward_info_ids, ray_axis_cosines
from .render_settings import BlendSettings, CallChecks, CameraSpec, NativeConfig, OutputSpec, RenderSettings
from .sh import check_sh_degree, sh_n_coefficients, sh_to_color
from .visibility import visible_spheres


def check_device_usable(device: torch.device) -> None:
    """ValueError naming `device` when this build or this machine cannot render there."""
    if device.type == "cuda":
        if "cuda" not in _native.build_info()["backends"]:
            raise ValueError(
                f"device: {device} requested, but this build of pulsar_py has no CUDA backend "
                f"(build_info: {_native.build_info()})"
            )
        if not torch.cuda.is_available():
            raise ValueError(
                f"device: {device} requested, but torch sees no CUDA device "
                f"(torch {torch.__version__}, CUDA {torch.version.cuda})"
            )
    elif device.type not in ("cpu", "meta"):
        raise ValueError(f"device: expected cpu or cuda, got {device}")


# Masked-out spheres (Renderer.render's mask) are moved behind the camera, where culling
# drops them: this many world units plus a share of the eye's coordinates (float32 safe).
_MASKED_DISTANCE = 2.0
_MASKED_DISTANCE_REL = 1e-3

# Each Renderer module has an id of its own: its native renderers (ops.native_renderer)
# are keyed by it, so two modules never share scratch, and a copy gets a new one.
_renderer_ids = itertools.count(1)


class _SphereArguments(NamedTuple):
    """render()'s sphere arguments as given (vert_pos, vert_col, vert_rad, opacity, bg_col),
    before the checks."""

    positions: object
    features: object
    radii: object
    opacity: object
    background: object


class CameraInput(NamedTuple):
    """A call's cameras in the form the render operator takes."""

    cameras: torch.Tensor  # [B, L] Pulsar camera vectors (length L), or [B, 15] packed (length 0)
    length: int
    batched: bool  # the caller gave a batch of cameras
    right_handed: bool
    orthographic: bool
    first_R_then_T: bool = False  # camera vectors: eye = M * position


class OutputRequest(NamedTuple):
    """Which outputs a call makes beside the image, and their batch dimension."""

    forward_info: bool
    depth_moments: bool
    batched: bool  # keep B even when neither the spheres nor the cameras were batched


class RawOutputs(NamedTuple):
    """The render operator's outputs a caller uses ([B?, H, W, ...])."""

    image: torch.Tensor
    hit_count: torch.Tensor  # int32
    forward_info: Optional[torch.Tensor]  # when asked for ([0] from traced code)
    depth_moments: Optional[torch.Tensor]
    batched: bool  # outputs carry the leading B


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
        n_channels: C, feature channels per sphere (1..2^20).
        n_track: K, closest hits per pixel reported in forward info (1..128).
        num_threads: CPU threads for the CPU backend (0..4096); 0 uses every core.
        deterministic: ask for bitwise reproducible results. Honoured at no cost: both
            backends are deterministic by construction (fixed-order reductions, no
            atomics), with or without this flag or torch.use_deterministic_algorithms.
        debug: when a native call fails, save its inputs to a file named in the error
            (pulsar_py.replay(path) repeats it); also PULSAR_PY_DEBUG=1. See
            docs/reliability.md.
        gradient_scaling: "exact" (default): the exact gradients. "pulsar": the exact
            gradients rescaled to the magnitudes PyTorch3D's Pulsar gives (per sphere 1 /
            its tracked pixels, per camera Pulsar's area weighting), so learning rates
            tuned for Pulsar carry over (pulsar_py/gradient_scaling.py,
            docs/migrating_from_pytorch3d.md).

    State dicts: the module holds Pulsar's persistent buffer ``device_tracker`` (float32
    [1], zero), so state dicts load both ways with PyTorch3D's Renderer.

    A renderer serves one call at a time: a call made while another thread's call on the
    same renderer runs raises RuntimeError (give each thread its own renderer).
    """

    # Class-level default: a module pickled before the attribute existed unpickles with it.
    _instance_capacity: Optional[int] = None

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
        gradient_scaling: str = "exact",
    ) -> None:
        super().__init__()
        self.width = _checks.check_int("width", width, 1, _checks.MAX_IMAGE_SIDE)
        self.height = _checks.check_int("height", height, 1, _checks.MAX_IMAGE_SIDE)
        self.max_num_balls = None if max_num_balls is None else _checks.check_int("max_num_balls", max_num_balls, 1)
        self.orthogonal_projection = _checks.check_bool("orthogonal_projection", orthogonal_projection)
        self.right_handed_system = _checks.check_bool("right_handed_system", right_handed_system)
        self.background_normalized_depth = _checks.check_float(
            "background_normalized_depth", background_normalized_depth, 0.0, 1.0, low_open=True, high_open=True
        )
        self.n_channels = _checks.check_int("n_channels", n_channels, 1, _checks.MAX_CHANNELS)
        self.n_track = _checks.check_int("n_track", n_track, 1, _checks.MAX_TRACK)
        self.num_threads = _checks.check_int("num_threads", num_threads, 0, _checks.MAX_THREADS)
        #: Always True in effect (docs/reliability.md, "Determinism"); kept for the record.
        self.deterministic = _checks.check_bool("deterministic", deterministic)
        #: Save a failing native call's inputs for pulsar_py.replay (pulsar_py/debug.py).
        self.debug = _checks.check_bool("debug", debug)
        #: Check tensor values (NaN/Inf, magnitudes, ranges) on every call: one device
        #: synchronisation per call on CUDA. False skips them (docs/reliability.md).
        self.check_values = True
        # CUDA backward: bytes of gradient rows per window (0: default). For tests that
        # exercise many windows; any budget computes the same gradients.
        self._backward_row_budget = 0
        self.gradient_scaling = gradient_scaling
        # Tracks the module's device through .to(), .cuda(), .cpu(). Persistent under
        # Pulsar's name and shape: state dicts load both ways with PyTorch3D's Renderer.
        self.register_buffer("device_tracker", torch.zeros(1))
        self._device = self.device_tracker.device
        self._warned_small_gamma = False
        self._warned_setting_grad = False
        self._new_id()

    def _new_id(self) -> None:
        self._renderer_id = next(_renderer_ids)
        # The native renderers (and their scratch) go with the module.
        weakref.finalize(self, ops.release_natives, self._renderer_id)
        if self._instance_capacity is not None:
            ops.set_instance_capacity(self._renderer_id, self._instance_capacity)

    @property
    def instance_capacity(self) -> Optional[int]:
        """CUDA: how many (tile, sphere) instances a call's binning has room for when it
        does not read its count back (docs/design.md, "Capture"). None (the default): a
        call outside a CUDA-graph capture reads its count back (one host synchronisation)
        and lists exactly its instances (built in room earlier calls' counts call for,
        and again should the count outgrow it); a captured call is sized by the largest
        count seen so far and a quarter more, so a capture needs one call of the same
        scene before it (the usual warm-up). An int (1..2^31-1) sizes every call by it,
        and no call waits for the device. A call whose instances exceed its capacity
        returns NaN (image and gradients), never a partial image, and the overflow is
        raised as a RuntimeError naming this setting by the next call that reads its
        count back, or by ``check_instance_capacity()``. No effect on the CPU."""
        return self._instance_capacity

    @instance_capacity.setter
    def instance_capacity(self, value: Optional[int]) -> None:
        capacity = None if value is None else _checks.check_int("instance_capacity", value, 1, 2**31 - 1)
        self._instance_capacity = capacity
        ops.set_instance_capacity(self._renderer_id, 0 if capacity is None else capacity)

    def check_instance_capacity(self) -> None:
        """Raises RuntimeError if a CUDA call of this renderer since the last check (a
        replayed CUDA graph, or a call sized by ``instance_capacity``) had more (tile,
        sphere) instances than its capacity, and so returned NaN. Waits for the device
        (torch's current stream). With the capacity learnt (``instance_capacity`` None), the
        next capture is sized for the count that overflowed."""
        needed = ops.take_instance_overflow(self._renderer_id)
        if needed:
            raise RuntimeError(
                f"instance_capacity: a CUDA call of this renderer needed {needed} (tile, sphere) instances, "
                f"more than its capacity ({self._instance_capacity or 'learnt'}); its outputs were NaN. "
                f"Set Renderer.instance_capacity to at least {needed}, or leave it None and capture again"
            )

    def __setstate__(self, state: dict) -> None:
        # Unpickled or deep-copied: a module of its own, whose native renderers are made
        # again on first use.
        super().__setstate__(state)
        self._new_id()

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def gradient_scaling(self) -> str:
        """ "exact" or "pulsar" (see the class docstring); may be changed between calls."""
        return "pulsar" if self._pulsar_gradients else "exact"

    @gradient_scaling.setter
    def gradient_scaling(self, value: str) -> None:
        self._pulsar_gradients = check_gradient_scaling(value) == "pulsar"

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # State dicts saved without the buffer (it carries no information) still load strictly.
        state_dict.setdefault(prefix + "device_tracker", self.device_tracker)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        self._device = self.device_tracker.device
        return module

    def to(self, *args, **kwargs) -> "Renderer":
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is not None:
            check_device_usable(torch.device(device))
        return super().to(*args, **kwargs)

    def cuda(self, device=None) -> "Renderer":
        check_device_usable(
            torch.device("cuda")
            if device is None
            else torch.device("cuda", device)
            if isinstance(device, int)
            else torch.device(device)
        )
        return super().cuda(device)

    @float32_under_autocast
    def forward(
        self,
        vert_pos: torch.Tensor,
        vert_col: torch.Tensor,
        vert_rad: torch.Tensor,
        cam_params: Union[torch.Tensor, Camera],
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
            gamma: blending softness in [1e-5, 1] (small: hard, 1: soft); a float or a
                one-element tensor (read at every call; it gets no gradient).
            max_depth: far depth (world units); a float or a one-element tensor.
            min_depth: near depth; 0 means focal length + 2e-6.
            bg_col: [C] background features (default ones).
            opacity: [B?, N] in [0, 1] (default ones).
            percent_allowed_difference: p in [0, 1) of the early termination rule.
            max_n_hits: hard cap on processed hits per pixel (None: unlimited).
            mode: 0 renders features; 1 returns the hit count [B?, H, W, 1] (no gradient).
            return_forward_info: also return forward info [B?, H, W, 3 + 2K] (mode 0; None
                in mode 1, as Pulsar returns).
            first_R_then_T: camera position is rotated first (``M @ pos``).

        Returns:
            image [B?, H, W, C] (mode 0) or hit counts [B?, H, W, 1] (mode 1), and the
            forward info (None in mode 1) when requested. The batch dimension is present
            when any input was batched.
        """
        mode = _checks.check_int("mode", mode, 0, 1)
        want_info = _checks.check_bool("return_forward_info", return_forward_info)
        self._check_traceable()
        scene = self._check_scene(vert_pos, vert_col, vert_rad, opacity, bg_col)
        settings = _checks.check_call_settings(gamma, percent_allowed_difference, max_n_hits)
        depths = _checks.check_depths(max_depth, min_depth)
        camera_input = self._camera_input(cam_params, scene.positions, depths, first_R_then_T, "cam_params")
        request = OutputRequest(want_info and mode == 0, False, False)
        raw = self._call(scene, camera_input, settings, depths, request, "cam_params")
        if mode == 0:
            return (raw.image, raw.forward_info) if want_info else raw.image
        hits = raw.hit_count[..., None].to(raw.image.dtype)
        return (hits, None) if want_info else hits  # mode 1 has no forward info (as Pulsar)

    # ----------------------------------------------------------------------------------
    def _check_traceable(self) -> None:
        """RuntimeError under torch.func transforms, which the native calls cannot follow."""
        if not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active():
            raise RuntimeError(
                "pulsar_py.Renderer: torch.func transforms (vmap, grad, jacrev, ...) are not "
                "supported; use torch.autograd (backward(), torch.autograd.grad) instead"
            )

    def _call(
        self,
        scene: _checks.SceneTensors,
        camera_input: CameraInput,
        checked: _checks.CallSettings,
        depths: _checks.DepthRange,
        request: OutputRequest,
        camera_name: str,
    ) -> RawOutputs:
        """The one call into the render operator, shared by every entry point, with
        checked arguments: the spheres, the cameras in the operator's form, the per-call
        settings and depth range, the outputs asked for; ``camera_name``: the camera's
        argument, for messages."""
        eager = not torch.compiler.is_compiling()
        cams = camera_input.cameras
        if cams.dim() == 2 and cams.shape[0] > 1:  # one image always fits
            _checks.check_batch(cams.shape[0], self.width, self.height)
        batched = request.batched or scene.batched or camera_input.batched
        vectors = camera_input.length > 0
        # An eager call's Python numbers travel in the settings. When any of the four is
        # a tensor, or the call is traced (where a number may be a symbol: the settings
        # would make it a constant the graph guards on), all four travel in the values
        # tensor on the render's device, whose slots the settings then hold as
        # placeholders (0). Packed cameras carry their own depths (the settings' are 0),
        # which the values still bring to be checked.
        gamma, percent = checked.gamma, checked.percent_allowed_difference
        near, far = depths
        values = None
        if not eager or not all(map(_checks.is_number, (gamma, percent, near, far))):
            values = ops.call_values(gamma, percent, near, far, scene.positions.device)
            gamma = percent = near = far = 0.0
        if not vectors:
            near = far = 0.0
        settings = RenderSettings(
            NativeConfig(
                self._renderer_id,
                self.width,
                self.height,
                self.n_track,
                camera_input.orthographic,
                self.background_normalized_depth,
                self.num_threads,
                self._backward_row_budget,
            ),
            BlendSettings(gamma, percent, checked.max_n_hits),
            CameraSpec(
                camera_input.length,
                camera_input.right_handed,
                vectors and camera_input.first_R_then_T,
                near,
                far,
                _checks.CAMERA_ARGUMENTS.index(camera_name),
            ),
            OutputSpec(request.forward_info, request.depth_moments, batched),
            CallChecks(self.check_values, self.debug),
        )
        image, _state, counts, info, moments = self._render(
            scene.positions, scene.features, scene.radii, scene.opacities, scene.background, cams, values, settings
        )
        if eager:  # after the call: the device works meanwhile
            self._warn_once(checked, scene, cams.requires_grad)
        return RawOutputs(image, counts[0], info, moments, batched)

    def _render(
        self,
        positions,
        features,
        radii,
        opacities,
        background,
        cameras,
        values: Optional[torch.Tensor],
        settings: ops.RenderSettings,
    ) -> Tuple[torch.Tensor, ...]:
        """The render operator's call with checked arguments: its five outputs."""
        call = scaled_render_call if self._pulsar_gradients else ops.render_call
        return call(positions, features, radii, opacities, background, cameras, values, settings)

    def _check_scene(self, vert_pos, vert_col, vert_rad, opacity, bg_col) -> _checks.SceneTensors:
        return _checks.check_scene(
            vert_pos,
            vert_col,
            vert_rad,
            opacity,
            bg_col,
            n_channels=self.n_channels,
            device=self.device,
            max_num_balls=self.max_num_balls,
        )

    def _resolve_camera(
        self, camera, pos: torch.Tensor, first_R_then_T: object, name: str
    ) -> Tuple[Union[torch.Tensor, NativeCamera], bool, bool, bool]:
        """(cameras, batched, right_handed, orthographic) of a ``Camera`` (a NativeCamera,
        expanded to batched spheres) or of Pulsar camera vectors (checked [B, L])."""
        first_R_then_T = _checks.check_bool("first_R_then_T", first_R_then_T)
        if isinstance(camera, Camera):
            if first_R_then_T:
                raise ValueError("first_R_then_T: applies to camera vectors only, not to a pulsar_py.Camera; got True")
            if camera.dtype != pos.dtype:
                raise TypeError(
                    f"{name}: expected a Camera of dtype {pos.dtype} like vert_pos (mixed dtypes are "
                    f"not cast), got {camera.dtype}"
                )
            if camera.device != self.device:
                raise ValueError(
                    f"{name}: expected a Camera on {self.device} (the renderer's device), got {camera.device}"
                )
            if self.check_values and not torch.compiler.is_compiling():
                camera.validate()
            native = camera.native(self.width, self.height)
            if pos.dim() == 3:
                native = _expand_camera(native, pos.shape[0], name)
            return native, camera.batched, camera.right_handed, camera.orthographic
        if not isinstance(camera, torch.Tensor):
            raise TypeError(
                f"{name}: expected a pulsar_py.Camera or camera vectors (torch.Tensor [B?, L]), "
                f"got {type(camera).__name__}"
            )
        cams = _checks.check_cam_params(camera, pos, device=self.device, name=name)
        return cams, camera.dim() == 2, self.right_handed_system, self.orthogonal_projection

    def _native_camera(
        self, cams: Union[torch.Tensor, NativeCamera], depths: _checks.DepthRange, first_R_then_T: bool
    ) -> NativeCamera:
        """The NativeCamera of resolved cameras: Pulsar camera vectors [B, L] converted by
        ``pulsar::pack_cameras`` (differentiable)."""
        if isinstance(cams, NativeCamera):
            return cams
        plain = lambda d: d if _checks.is_number(d) else 0.0  # noqa: E731  (packed depths replace them)
        pack = ops.PackSettings(
            self.width,
            self.height,
            self.orthogonal_projection,
            self.right_handed_system,
            bool(first_R_then_T),
            plain(depths.min_depth),
            plain(depths.max_depth) or 1.0,
        )
        packed = ops.pack_cameras(cams.contiguous(), pack.encode())
        return NativeCamera.from_packed(packed, self.right_handed_system, self.orthogonal_projection)

    @staticmethod
    def _pack(native: NativeCamera, depths: _checks.DepthRange) -> torch.Tensor:
        """Packed cameras [B, 15] of a NativeCamera and the call's depth range (min_depth 0:
        focal length + 2e-6; tensor depths keep their graph)."""
        near = _checks.resolve_near(depths.min_depth, native.focal)
        return native.pack(near, _checks.depth_like(depths.max_depth, near))

    def _camera_input(
        self, camera, pos: torch.Tensor, depths: _checks.DepthRange, first_R_then_T: object, name: str
    ) -> CameraInput:
        if (
            _checks.plain_camera_vectors(camera, pos, self.device)
            and not depths.differentiable
            and (first_R_then_T is False or first_R_then_T is True)
        ):
            # The common call, tested without building messages: [L] or [B, L] as given.
            return CameraInput(
                camera,
                camera.shape[-1],
                camera.dim() == 2,
                self.right_handed_system,
                self.orthogonal_projection,
                first_R_then_T,
            )
        cams, batched, right_handed, orthographic = self._resolve_camera(camera, pos, first_R_then_T, name)
        if isinstance(cams, torch.Tensor) and not depths.differentiable:
            return CameraInput(cams, cams.shape[-1], batched, right_handed, orthographic, bool(first_R_then_T))
        native = self._native_camera(cams, depths, bool(first_R_then_T))
        return CameraInput(self._pack(native, depths), 0, batched, right_handed, orthographic)

    def _warn_once(self, checked: _checks.CallSettings, scene: _checks.SceneTensors, camera_grad: bool) -> None:
        """Warnings, once per renderer: a small gamma with geometry or camera gradients
        (``camera_grad``: whether the cameras require grad; a gamma given as a tensor is
        not read for it), and a gamma or percent_allowed_difference tensor that requires
        grad (it gets none)."""
        gamma = checked.gamma
        if not self._warned_setting_grad:
            for name, value in (("gamma", gamma), ("percent_allowed_difference", checked.percent_allowed_difference)):
                if isinstance(value, torch.Tensor) and value.requires_grad:
                    warnings.warn(
                        f"{name}: a tensor that requires grad was given; the renderer reads its value "
                        "and gives it no gradient",
                        stacklevel=4,
                    )
                    self._warned_setting_grad = True
        if not _checks.is_number(gamma) or gamma >= 1e-3 or self._warned_small_gamma or not torch.is_grad_enabled():
            return
        if scene.positions.requires_grad or scene.radii.requires_grad or camera_grad:
            warnings.warn(
                f"gamma={gamma} < 1e-3: geometry and camera gradients become very sharp and "
                "may be unstable for optimisation",
                stacklevel=4,
            )
            self._warned_small_gamma = True

    @float32_under_autocast
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
        z_depth: bool = False,
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
            z_depth: also fill ``z_depth``, the expected depth along the optical axis
                (what depth cameras measure; ``depth`` is the distance along the ray).

        Returns:
            RenderResult: image [B?, H, W, C], depth, coverage, distortion [B?, H, W]
            (differentiable; see its docstring), hit_count and optional forward_info.
            B is present when spheres, camera or mask were batched; a batch of cameras
            with unbatched spheres renders the same spheres from every camera.
        """
        want_info = _checks.check_bool("return_forward_info", return_forward_info)
        z_depth_wanted = _checks.check_bool("z_depth", z_depth)
        self._check_traceable()
        pos = _checks.check_tensor("vert_pos", vert_pos, dims=(2, 3), last=3, device=self.device)
        depths = _checks.check_depths(max_depth, min_depth)
        mask_batched = False
        if sh_degree is None and mask is None:
            scene = self._check_scene(vert_pos, vert_col, vert_rad, opacity, bg_col)
            camera_input = self._camera_input(camera, pos, depths, first_R_then_T, "camera")
        else:
            spheres = _SphereArguments(pos, vert_col, vert_rad, opacity, bg_col)
            scene, camera_input, mask_batched = self._masked_sh_scene(
                spheres, camera, depths, first_R_then_T, sh_degree, mask
            )
        native = None
        if z_depth_wanted and camera_input.length:
            # One conversion serves the render and z_depth: the render takes the packed form.
            native = self._native_camera(
                camera_input.cameras.reshape(-1, camera_input.length), depths, camera_input.first_R_then_T
            )
            camera_input = camera_input._replace(cameras=self._pack(native, depths), length=0, first_R_then_T=False)
        settings = _checks.check_call_settings(gamma, percent_allowed_difference, max_n_hits)
        request = OutputRequest(want_info, True, mask_batched)
        raw = self._call(scene, camera_input, settings, depths, request, "camera")
        near, far = _near_far(camera_input, depths)
        if raw.batched:
            near, far = near[:, None, None], far[:, None, None]
        else:
            near, far = near[0], far[0]
        depth, distortion = depth_from_moments(raw.depth_moments, near, far)
        z_depth = None
        if z_depth_wanted:
            if native is None:
                cams = camera_input.cameras.reshape(-1, 15)
                native = NativeCamera.from_packed(cams, camera_input.right_handed, camera_input.orthographic)
            cosines = ray_axis_cosines(native, self.width, self.height)
            z_depth = depth * (cosines if raw.batched else cosines[0])
        return RenderResult(
            image=raw.image,
            depth=depth,
            coverage=raw.depth_moments[..., 0],
            distortion=distortion,
            hit_count=raw.hit_count,
            forward_info=raw.forward_info if want_info else None,
            z_depth=z_depth,
        )

    def _masked_sh_scene(self, spheres: "_SphereArguments", camera, depths, first_R_then_T, sh_degree, mask):
        """render() with SH features or a mask: (scene, packed camera input, mask batched).
        Both need the cameras' eyes, so the cameras are packed first."""
        pos, col, rad, opacity, bg_col = spheres
        if sh_degree is not None:
            sh_degree = check_sh_degree(sh_degree)
            _checks.check_tensor("vert_col", col, dims=(pos.dim() + 1,), dtype=pos.dtype, device=self.device)
            want = tuple(pos.shape[:-1]) + (sh_n_coefficients(sh_degree), self.n_channels)
            if tuple(col.shape) != want:
                raise ValueError(
                    f"vert_col: expected SH coefficients of shape {want} for sh_degree {sh_degree}, "
                    f"got {tuple(col.shape)}"
                )
        # Types, dtypes, devices and shapes now (values are checked on what is rendered).
        self._check_scene(pos, col if sh_degree is None else col[..., 0, :], rad, opacity, bg_col)
        cams, batched, right_handed, orthographic = self._resolve_camera(camera, pos, first_R_then_T, "camera")
        native = self._native_camera(cams, depths, bool(first_R_then_T))
        mask_batched = False
        if mask is not None:
            mask, native = self._check_mask(mask, pos, native)
            mask_batched = mask.dim() == 2
            pos, col, rad, opacity = self._apply_mask(mask, pos, col, rad, opacity, native, sh_degree is not None)
        if sh_degree is not None:
            col = self._sh_features(col, pos, native, sh_degree)
        pos, col, rad, opacity = _unify_sphere_batch(pos, col, rad, opacity)
        scene = self._check_scene(pos, col, rad, opacity, bg_col)
        if pos.dim() == 3:
            native = _expand_camera(native, pos.shape[0], "camera")
        return scene, CameraInput(self._pack(native, depths), 0, batched, right_handed, orthographic), mask_batched

    @float32_under_autocast
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

        The arguments are checked as for rendering (docs/reliability.md): types, shapes
        and devices always, values (finite positions within the magnitude limit, radii >
        0, the camera's values, the depth range against the focal length) unless
        ``check_values`` is off; a failed check raises ValueError or TypeError naming the
        argument.
        """
        pos = _checks.check_tensor("vert_pos", vert_pos, dims=(2, 3), last=3, device=self.device)
        rad = _checks.check_tensor("vert_rad", vert_rad, dims=(pos.dim() - 1,), dtype=pos.dtype, device=self.device)
        if rad.shape != pos.shape[:-1]:
            raise ValueError(
                f"vert_rad: expected shape {tuple(pos.shape[:-1])} to match vert_pos, got {tuple(rad.shape)}"
            )
        if pos.dim() == 3 and pos.shape[0] == 0:
            raise ValueError(f"vert_pos: expected a batch of at least 1 sphere set, got shape {tuple(pos.shape)}")
        if max_depth is None:  # no far culling
            depths = _checks.DepthRange(_checks.check_depth("min_depth", min_depth), math.inf)
        else:
            depths = _checks.check_depths(max_depth, min_depth)
        cams, batched, _, orthographic = self._resolve_camera(camera, pos, first_R_then_T, "camera")
        native = self._native_camera(cams, depths, bool(first_R_then_T))
        packed = self._pack(native, depths)
        if self.check_values and not torch.compiler.is_compiling():
            _checks.check_visible_values(
                pos, rad, cams if isinstance(cams, torch.Tensor) else None, packed, orthographic, depths
            )
        result = visible_spheres(pos, rad, native, self.width, self.height, PACKED.near(packed), PACKED.far(packed))
        return result if (pos.dim() == 3 or batched) else result[0]

    # ----------------------------------------------------------------------------------
    def _check_mask(self, mask, pos: torch.Tensor, camera: NativeCamera) -> Tuple[torch.Tensor, NativeCamera]:
        """The validated mask [B?, N] and the camera expanded to its batch."""
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"mask: expected a torch.Tensor of dtype bool, got {type(mask).__name__}")
        if mask.dtype != torch.bool:
            raise TypeError(f"mask: expected dtype torch.bool, got {mask.dtype}")
        if mask.device != self.device:
            raise ValueError(f"mask: expected a tensor on {self.device} (the renderer's device), got {mask.device}")
        n = pos.shape[-2]
        if (
            mask.dim() not in (1, 2)
            or mask.shape[-1] != n
            or (pos.dim() == 3 and mask.dim() == 2 and mask.shape[0] != pos.shape[0])
        ):
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
            directions = directions.expand(
                pos.shape[:-1] + (3,) if not per_camera else (camera.batch_size, pos.shape[-2], 3)
            )
        else:
            directions = pos - (camera.eye[:, None, :] if per_camera else camera.eye[0])
        return sh_to_color(coefficients, directions, degree)

    @staticmethod
    def sphere_ids_from_result_info_nograd(result_info: torch.Tensor) -> torch.Tensor:
        """Sphere ids of the K closest hits: int32 [B, H, W, K], -1 where empty.

        Always 4-dimensional, as Pulsar's: unbatched forward info [H, W, 3 + 2K] gives
        [1, H, W, K]. float32 forward info stores ids as int32 bits (Pulsar's layout);
        float64 stores the id's value.
        """
        result_info = _checks.check_forward_info("result_info", result_info)
        if result_info.dim() == 3:
            result_info = result_info[None]
        return forward_info_ids(result_info.detach()).clone()

    @staticmethod
    def depth_map_from_result_info_nograd(result_info: torch.Tensor) -> torch.Tensor:
        """Intersection depth of the closest hit: [B?, H, W] (as Pulsar's: no batch
        dimension for unbatched forward info), -1 where nothing is hit."""
        return _checks.check_forward_info("result_info", result_info)[..., 4].detach().clone()

    def extra_repr(self) -> str:
        return (
            f"width={self.width}, height={self.height}, n_channels={self.n_channels}, n_track={self.n_track}, "
            f"orthogonal_projection={self.orthogonal_projection}, "
            f"right_handed_system={self.right_handed_system}"
        )


def _expand_camera(camera: NativeCamera, batch: int, name: str) -> NativeCamera:
    """``camera`` with batch size ``batch``: unchanged, or its single camera repeated."""
    if camera.batch_size not in (1, batch):
        raise ValueError(
            f"{name}: expected 1 camera or a batch of {batch} like the spheres/mask, got {camera.batch_size}"
        )
    return camera.expand(batch)


def _near_far(camera_input: CameraInput, depths: _checks.DepthRange) -> Tuple[torch.Tensor, torch.Tensor]:
    """[B] resolved near and far depths of a call's cameras (differentiable)."""
    cams = camera_input.cameras
    cams = cams if cams.dim() == 2 else cams[None]
    if camera_input.length == 0:
        return PACKED.near(cams), PACKED.far(cams)
    layout = CameraVectorLayout.of(camera_input.length)
    focal = layout.focal(cams)
    if camera_input.orthographic:
        focal = torch.zeros_like(focal)
    near = _checks.resolve_near(depths.min_depth, focal)
    return near, _checks.depth_like(depths.max_depth, near)


def _unify_sphere_batch(pos, col, rad, opacity):
    """Per-sphere tensors all unbatched, or all batched with one B (the native call
    shares spheres across cameras only when every per-sphere input is shared)."""
    sizes = [
        t.shape[0] for t, rank in ((pos, 2), (col, 2), (rad, 1), (opacity, 1)) if t is not None and t.dim() == rank + 1
    ]
    if not sizes:
        return pos, col, rad, opacity
    batch = max(sizes)

    def grow(t, rank):
        if t is None or t.dim() == rank + 1:
            return t
        return t.unsqueeze(0).expand((batch,) + tuple(t.shape))

    return grow(pos, 2), grow(col, 2), grow(rad, 1), grow(opacity, 1)
