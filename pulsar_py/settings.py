"""The settings of a render call that are not tensors: what the operators take as ``float[]``.

The lowest layer of the package around the operators (it imports nothing of it): the
input checks (``_checks``) name these types, the operators (``ops``) encode and decode
them. Settings are graph constants of a compiled call (torch.compile specialises on
them), so they hold what shapes the call: image size, K, which outputs, the camera form,
the instance capacity. The numbers a training loop changes call by call (gamma,
percent_allowed_difference, the depth range) travel as data instead when they are tensors
or when the call is traced: the render operator's ``values`` tensor (``CallValue``); the
fields below then hold placeholders.
"""

from __future__ import annotations

from typing import List, NamedTuple, Sequence


class CallValue:
    """Slots of the render operator's ``values`` tensor (float64 [4] on the scene's device;
    include/pulsar/renderer.h ``CallValue``)."""

    GAMMA = 0
    PERCENT_ALLOWED_DIFFERENCE = 1
    MIN_DEPTH = 2  # camera vectors only: near depth (0: focal length + 2e-6)
    MAX_DEPTH = 3  # camera vectors only: far depth
    COUNT = 4


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
    gamma: float  # with no values tensor
    percent_allowed_difference: float  # with no values tensor
    max_n_hits: int  # < 0: unlimited
    right_handed: bool
    want_forward_info: bool
    want_depth_moments: bool
    batch_dim: bool  # outputs keep their leading B (else B must be 1 and is dropped)
    check_values: bool  # run the value checks (NaN/Inf, ranges) before the native call
    debug: bool  # save a failing call's inputs (pulsar_py.debug)
    camera_length: int  # 0: cameras are packed [B, 15]; else L of Pulsar camera vectors
    first_R_then_T: bool  # camera vectors: eye = M * position
    min_depth: float  # camera vectors, with no values tensor: near depth (0: focal length + 2e-6)
    max_depth: float  # camera vectors, with no values tensor: far depth
    camera_argument: int  # the camera's argument, for messages: _checks.CAMERA_ARGUMENTS[camera_argument]
    # CUDA: (camera, tile, sphere) instances the lists have room for (the entries output is
    # int32 [2, capacity]); 0: the call chooses (eager: the renderer's learned capacity, or
    # a count). The CPU takes 0.
    capacity: int = 0
    # Read the binning's instance count back after the call is enqueued, and render again
    # with more room when it did not fit (one host synchronisation); False: never wait for
    # the device (an overflow leaves NaN outputs and is reported later).
    verify: bool = True
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
    """The conversion of Pulsar camera vectors to packed cameras (pack_cameras)."""

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
