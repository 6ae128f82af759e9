"""Type stub of the pybind11 module pulsar_py._native (native/bindings/).

Pointers are passed as integers (``tensor.data_ptr()``); pulsar_py validates every tensor
behind them before calling. Shapes and layouts: include/pulsar/renderer.h and camera.h.
"""

from enum import Enum
from typing import Dict, Tuple, Union

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
    def __init__(self) -> None: ...

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
    cameras: int  # [B, 15]
    def __init__(self) -> None: ...

class ForwardOutputs:
    image: int  # [B, H, W, C]
    blend_state: int  # [B, H, W, 2]
    hit_count: int  # int32 [B, H, W]
    traversal_end: int  # int32 [B, H, W]
    forward_info: int  # [B, H, W, 3 + 2K] or 0
    depth_moments: int  # [B, H, W, 3] or 0
    def __init__(self) -> None: ...

class BackwardArgs:
    grad_image: int
    image: int
    blend_state: int
    traversal_end: int
    depth_moments: int
    grad_depth_moments: int
    def __init__(self) -> None: ...

class GradientOutputs:
    positions: int
    features: int
    radii: int
    opacities: int
    background: int
    cameras: int
    def __init__(self) -> None: ...

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
    def __init__(self) -> None: ...

def camera_params_to_packed(args: CameraParamsArgs, packed: int) -> None:
    """Writes packed [B, 15]: eye, p00_rel, pdx, pdy, focal, resolved min_depth, max_depth."""

def camera_params_backward(args: CameraParamsArgs, grad_packed: int, grad_params: int) -> None:
    """Writes grad_params [B, L] = (d packed / d params)^T grad_packed [B, 15]."""

class Renderer:
    def __init__(self, config: RendererConfig) -> None: ...
    def forward(self, scene: SceneArgs, options: RenderOptions, outputs: ForwardOutputs) -> int: ...
    def begin_forward(self, scene: SceneArgs, options: RenderOptions) -> None:
        """Starts forward's binning (CUDA: enqueues it up to its one host sync)."""
    def begin_forward_from_vectors(self, scene: SceneArgs, options: RenderOptions,
                                   camera_vectors: CameraParamsArgs, params: int) -> None:
        """use_camera_vectors, then begin_forward, in one call."""
    def use_camera_vectors(self, scene: SceneArgs, options: RenderOptions, camera_vectors: CameraParamsArgs,
                           params: int) -> None:
        """Converts the camera vectors at ``params`` ([B, L], camera_vectors' layout) into
        the renderer's own packed cameras [B, 15] on options.stream and points
        scene.cameras at them (rewritten by the next conversion)."""
    def finish_forward(self, scene: SceneArgs, options: RenderOptions, outputs: ForwardOutputs) -> int:
        """Completes the binning begin_forward started and renders; returns forward's token."""
    def backward(self, scene: SceneArgs, options: RenderOptions, args: BackwardArgs,
                 grads: GradientOutputs, forward_token: int) -> None: ...
    @property
    def config(self) -> RendererConfig: ...
    @property
    def scratch_bytes(self) -> int: ...
    @property
    def binned_instances(self) -> int: ...

def build_info() -> Dict[str, Union[str, bool, Tuple[str, ...]]]: ...
