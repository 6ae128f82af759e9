"""The settings of one call of the render and camera-conversion operators (pulsar_py.ops).

Plain records of numbers: an operator receives them encoded as ``float[]`` (a schema of
few arguments), and debug snapshots store them as dicts. They depend on nothing in the
package, so the checks, the operators and the snapshot replay can all name them.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Sequence


class NativeConfig(NamedTuple):
    """What a native renderer is made from: one per Renderer module, device and
    configuration (ops.native_renderer), made on first use."""

    renderer_id: int  # the Renderer module's id: its native renderers are its own
    width: int
    height: int
    n_track: int  # K
    orthographic: bool
    background_normalized_depth: float  # beta
    num_threads: int  # CPU threads; 0: every core
    backward_row_budget: int  # CUDA backward: bytes of gradient rows per window (0: default)


class BlendSettings(NamedTuple):
    """The blend of one call (model.md sections 4 and 6)."""

    gamma: float
    percent_allowed_difference: float
    max_n_hits: int  # < 0: unlimited


class CameraSpec(NamedTuple):
    """How the call's camera tensor is to be read."""

    camera_length: int  # 0: cameras are packed [B, 15]; else L of Pulsar camera vectors
    right_handed: bool
    first_R_then_T: bool  # camera vectors: eye = M * position
    min_depth: float  # camera vectors: near depth (0: focal length + 2e-6)
    max_depth: float  # camera vectors: far depth
    camera_argument: int  # the camera's argument, for messages: _checks.CAMERA_ARGUMENTS[camera_argument]


class OutputSpec(NamedTuple):
    """What the call returns."""

    want_forward_info: bool
    want_depth_moments: bool
    batch_dim: bool  # outputs keep their leading B (else B must be 1 and is dropped)
    partial: bool = False  # a share's state instead of the image (RenderOptions::partial; no depth moments)


class CallChecks(NamedTuple):
    """What the call checks and records when it fails."""

    check_values: bool  # run the value checks (NaN/Inf, ranges) before the native call
    debug: bool  # save a failing call's inputs (pulsar_py.debug)


_PARTS = (NativeConfig, BlendSettings, CameraSpec, OutputSpec, CallChecks)
# [start, end) of each part in the encoding.
_SPANS = []
_at = 0
for _part in _PARTS:
    _SPANS.append((_at, _at + len(_part._fields)))
    _at += len(_part._fields)
_CONFIG, _BLEND, _CAMERA, _OUTPUTS, _CHECKS = (slice(a, b) for a, b in _SPANS)  # for decode
#: Every field of RenderSettings, in the order of its encoding (and of debug snapshots).
FIELDS = tuple(name for part in _PARTS for name in part._fields)


class RenderSettings(NamedTuple):
    """Everything of one render call that is not a tensor, by kind."""

    config: NativeConfig
    blend: BlendSettings
    camera: CameraSpec
    outputs: OutputSpec
    checks: CallChecks

    def encode(self) -> List[float]:
        """The operator argument, every field in FIELDS order (ints and bools pass through
        a float[] as floats)."""
        return [*self.config, *self.blend, *self.camera, *self.outputs, *self.checks]

    @classmethod
    def decode(cls, values: Sequence[float]) -> "RenderSettings":
        """The settings of an operator argument (or the settings themselves, as an eager
        call's autograd node keeps them); encoded values stay floats (1.0 for True),
        converted where an int or bool is needed."""
        if type(values) is cls:
            return values
        # A compiled call decodes the same few encodings on every call: they are kept (a
        # few hundred distinct ones at most), each made once with tuple.__new__ per part.
        key = tuple(values)
        settings = _decoded.get(key)
        if settings is None:
            if len(_decoded) > 256:
                _decoded.clear()
            new = tuple.__new__
            settings = _decoded[key] = new(
                cls,
                (
                    new(NativeConfig, key[_CONFIG]),
                    new(BlendSettings, key[_BLEND]),
                    new(CameraSpec, key[_CAMERA]),
                    new(OutputSpec, key[_OUTPUTS]),
                    new(CallChecks, key[_CHECKS]),
                ),
            )
        return settings

    def flat(self) -> Dict[str, float]:
        """Every field by its name (FIELDS): a debug snapshot's record."""
        return dict(zip(FIELDS, self.encode()))

    @classmethod
    def from_flat(cls, fields: Dict[str, float]) -> "RenderSettings":
        """The settings of ``flat()``'s record."""
        return cls.decode([fields[name] for name in FIELDS])


_decoded: Dict[tuple, RenderSettings] = {}


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
