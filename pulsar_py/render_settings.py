"""The settings of one call of the render and camera-conversion operators (pulsar_py.ops).

Plain records of numbers: an operator receives them encoded as ``float[]`` (a schema of
few arguments), and debug snapshots store them as dicts. They depend on nothing in the
package, so the checks, the operators and the snapshot replay can all name them.
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence


class RenderSettings(NamedTuple):
    """Everything of one render call that is not a tensor.

    The first group configures the native renderer (one per renderer, device and
    configuration, made on first use); the second is per call.
    """

    renderer_id: int  # the Renderer module's id: its native renderers are its own
    width: int
    height: int
    n_track: int  # K
    orthographic: bool
    background_normalized_depth: float  # beta
    num_threads: int  # CPU threads; 0: every core
    backward_row_budget: int  # CUDA backward: bytes of gradient rows per window (0: default)
    gamma: float
    percent_allowed_difference: float
    max_n_hits: int  # < 0: unlimited
    right_handed: bool
    want_forward_info: bool
    want_depth_moments: bool
    batch_dim: bool  # outputs keep their leading B (else B must be 1 and is dropped)
    check_values: bool  # run the value checks (NaN/Inf, ranges) before the native call
    debug: bool  # save a failing call's inputs (pulsar_py.debug)
    camera_length: int  # 0: cameras are packed [B, 15]; else L of Pulsar camera vectors
    first_R_then_T: bool  # camera vectors: eye = M * position
    min_depth: float  # camera vectors: near depth (0: focal length + 2e-6)
    max_depth: float  # camera vectors: far depth
    camera_argument: int  # the camera's argument, for messages: _checks.CAMERA_ARGUMENTS[camera_argument]
    partial: bool = False  # a share's state instead of the image (RenderOptions::partial; no depth moments)

    def encode(self) -> List[float]:
        """The operator argument (ints and bools pass through a float[] as floats)."""
        return list(self)

    @classmethod
    def decode(cls, values: Sequence[float]) -> "RenderSettings":
        """The settings of an operator argument; their values stay floats (1.0 for True),
        converted where an int or bool is needed."""
        return cls._make(values)


class PackSettings(NamedTuple):
    """The conversion of Pulsar camera vectors to packed cameras (pack_cameras): the fields
    of the native CameraParamsArgs that are not the tensor's own (its dtype, device, shape
    and pointer), under the same names; ops sets them by name."""

    width: int
    height: int
    orthographic: bool
    right_handed: bool
    first_R_then_T: bool
    min_depth: float  # 0: focal length + 2e-6
    max_depth: float

    def encode(self) -> List[float]:
        return [float(v) for v in self]

    @classmethod
    def decode(cls, values: Sequence[float]) -> "PackSettings":
        w, h, ortho, right, r_then_t, near, far = values
        return cls(int(w), int(h), bool(ortho), bool(right), bool(r_then_t), near, far)
