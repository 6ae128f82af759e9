"""Type stub of the pybind11 module pulsar_py._native (native/bindings/).

Pointers are passed as integers (``tensor.data_ptr()``); pulsar_py validates every tensor
behind them before calling, and only pulsar_py/ops.py calls this module. Shapes and
layouts: include/pulsar/renderer.h and camera.h.
"""

from enum import Enum
from typing import Callable, Dict, Tuple, Union, overload

CAMERA_PARAMS: int  # 15 values per packed camera
MAX_IMAGE_SIDE: int  # 16384
MAX_TRACK: int  # 128

class DType(Enum):
    float32: "DType"
    float64: "DType"

class DeviceKind(Enum):
    cpu: "DeviceKind"
    cuda: "DeviceKind"

class RendererConfig:
    width: int
    height: int
    n_channels: int
    n_track: int
    orthographic: bool
    background_normalized_depth: float
    device: DeviceKind
    device_index: int
    num_threads: int
    backward_row_budget: int  # bytes; 0: default (CUDA backward windows)
    def __init__(self) -> None: ...

class RenderOptions:
    gamma: float
    percent_allowed_difference: float
    max_n_hits: int  # < 0: unlimited
    stream: int  # cudaStream_t as an integer; 0 on the CPU
    partial: bool  # a share's state instead of the image (include/pulsar/renderer.h)
    values: int  # float64 [4] call values in the device's memory (gamma, p, near, far), or 0
    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(self, gamma: float, percent_allowed_difference: float, max_n_hits: int, stream: int) -> None: ...

class SceneArgs:
    dtype: DType
    batch_size: int
    n_spheres: int
    shared_spheres: bool
    right_handed: bool
    positions: int  # [B?, N, 3]
    features: int  # [B?, N, C]
    radii: int  # [B?, N]
    opacities: int  # [B?, N] or 0
    background: int  # [C]
    cameras: int  # [B, 15] packed, or [B, L] camera vectors
    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(
        self,
        dtype: DType,
        batch_size: int,
        n_spheres: int,
        shared_spheres: bool,
        positions: int,
        features: int,
        radii: int,
        opacities: int,
        background: int,
        cameras: int,
        right_handed: bool,
        camera_length: int,
        first_R_then_T: bool,
        min_depth: float,
        max_depth: float,
    ) -> None:
        """camera_length 0: cameras are packed [B, 15]; else L of Pulsar camera vectors
        [B, L], converted by the renderer with first_R_then_T, min_depth, max_depth."""

class ForwardOutputs:
    image: int  # [B, H, W, C]
    blend_state: int  # [B, H, W, 2]
    hit_count: int  # int32 [B, H, W]
    traversal_end: int  # int32 [B, H, W]
    forward_info: int  # [B, H, W, 3 + 2K] or 0
    depth_moments: int  # [B, H, W, 3] or 0
    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(
        self, image: int, blend_state: int, hit_count: int, traversal_end: int, forward_info: int, depth_moments: int
    ) -> None: ...

class BackwardArgs:
    grad_image: int
    image: int
    blend_state: int
    traversal_end: int
    depth_moments: int
    grad_depth_moments: int
    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(
        self,
        grad_image: int,
        image: int,
        blend_state: int,
        traversal_end: int,
        depth_moments: int,
        grad_depth_moments: int,
    ) -> None: ...

class GradientOutputs:
    positions: int
    features: int
    radii: int
    opacities: int
    background: int
    cameras: int
    @overload
    def __init__(self) -> None: ...
    @overload
    def __init__(
        self, positions: int, features: int, radii: int, opacities: int, background: int, cameras: int
    ) -> None: ...

class CameraParamsArgs:
    """Pulsar camera vectors [B, L] -> packed cameras [B, 15] (include/pulsar/camera_params.h)."""

    dtype: DType
    device: DeviceKind
    device_index: int
    stream: int  # cudaStream_t as an integer; 0 on the CPU
    batch_size: int  # B >= 1
    length: int  # L in {8, 10, 11, 13}
    width: int
    height: int
    orthographic: bool
    right_handed: bool
    first_R_then_T: bool
    min_depth: float  # 0: focal length + 2e-6
    max_depth: float
    params: int  # [B, L]
    values: int  # call values (RenderOptions.values) whose depths replace the two above, or 0
    def __init__(self) -> None: ...

def camera_params_to_packed(args: CameraParamsArgs, packed: int) -> None:
    """Writes packed [B, 15]: eye, p00_rel, pdx, pdy, focal, resolved min_depth, max_depth."""

def camera_params_backward(args: CameraParamsArgs, grad_packed: int, grad_params: int) -> None:
    """Writes grad_params [B, L] = (d packed / d params)^T grad_packed [B, 15]."""

class Renderer:
    """One per Renderer module, device and configuration (pulsar_py.ops.native_renderer).
    A call made while another call of the same renderer runs raises RuntimeError."""
    def __init__(self, config: RendererConfig) -> None: ...
    @overload
    def forward(self, scene: SceneArgs, options: RenderOptions, make_outputs: Callable[[], ForwardOutputs]) -> None:
        """Renders; make_outputs is called once the binning's device work is enqueued."""
    @overload
    def forward(self, scene: SceneArgs, options: RenderOptions, outputs: ForwardOutputs) -> None: ...
    def backward(self, scene: SceneArgs, options: RenderOptions, args: BackwardArgs, grads: GradientOutputs) -> None:
        """Exact gradients; reuses the forward's binning when args are its last forward's."""
    @property
    def config(self) -> RendererConfig: ...
    @property
    def scratch_bytes(self) -> int: ...
    @property
    def binned_instances(self) -> int: ...
    instance_capacity: int
    def take_instance_overflow(self, stream: int) -> int: ...

def build_info() -> Dict[str, Union[str, bool, Tuple[str, ...]]]: ...
