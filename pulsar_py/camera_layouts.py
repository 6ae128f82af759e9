"""The two camera layouts the renderer reads, decoded in one place each.

* Pulsar camera vectors ``[..., L]``, L in {8, 10, 11, 13}: position (3), rotation
  (axis-angle 3, or 6D 6 for L in {11, 13}), focal length, sensor width, and for L in
  {10, 13} the principal-point offsets (2, pixels). ``CameraVectorLayout``.
* Packed cameras ``[..., 15]`` (include/pulsar/camera.h): eye (3), p00_rel (3), pdx (3),
  pdy (3), focal length, near and far depth. ``PACKED``.

Every reader of either layout takes its columns from here by name. A leaf module: it
imports nothing of the package, so the checks and the cameras can both use it.
"""

from __future__ import annotations

from typing import NamedTuple, Tuple

import torch

#: Lengths of a Pulsar camera vector.
VALID_PARAM_LENGTHS = (8, 10, 11, 13)


class CameraVectorLayout(NamedTuple):
    """The columns of Pulsar camera vectors of one length; the accessors take ``[..., L]``
    and return views (``[..., k]`` or ``[...]``)."""

    length: int

    @staticmethod
    def of(length: int) -> "CameraVectorLayout":
        """The layout of vectors of ``length`` values (ValueError for any other length)."""
        if length not in VALID_PARAM_LENGTHS:
            raise ValueError(f"cam_params: expected a last dimension of 8, 10, 11 or 13 values, got {length}")
        return CameraVectorLayout(length)

    @property
    def rotation_size(self) -> int:
        """3 (axis-angle) or 6 (the 6D representation: the rotation matrix's first two rows)."""
        return 6 if self.length in (11, 13) else 3

    @property
    def focal_index(self) -> int:
        return 3 + self.rotation_size

    @property
    def sensor_width_index(self) -> int:
        return 4 + self.rotation_size

    @property
    def has_offsets(self) -> bool:
        return self.length in (10, 13)

    def position(self, v: torch.Tensor) -> torch.Tensor:
        return v[..., 0:3]

    def rotation(self, v: torch.Tensor) -> torch.Tensor:
        return v[..., 3 : 3 + self.rotation_size]

    def focal(self, v: torch.Tensor) -> torch.Tensor:
        return v[..., self.focal_index]

    def sensor_width(self, v: torch.Tensor) -> torch.Tensor:
        return v[..., self.sensor_width_index]

    def offsets(self, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """The principal-point offsets (x, y) in pixels (only when ``has_offsets``)."""
        return v[..., 5 + self.rotation_size], v[..., 6 + self.rotation_size]


class PackedLayout:
    """The columns of packed cameras ``[..., 15]``; the accessors return views."""

    SIZE = 15

    @staticmethod
    def eye(p: torch.Tensor) -> torch.Tensor:
        return p[..., 0:3]

    @staticmethod
    def p00_rel(p: torch.Tensor) -> torch.Tensor:
        """Centre of pixel (0, 0) relative to the eye."""
        return p[..., 3:6]

    @staticmethod
    def pdx(p: torch.Tensor) -> torch.Tensor:
        return p[..., 6:9]

    @staticmethod
    def pdy(p: torch.Tensor) -> torch.Tensor:
        return p[..., 9:12]

    @staticmethod
    def focal(p: torch.Tensor) -> torch.Tensor:
        return p[..., 12]

    @staticmethod
    def near(p: torch.Tensor) -> torch.Tensor:
        return p[..., 13]

    @staticmethod
    def far(p: torch.Tensor) -> torch.Tensor:
        return p[..., 14]


PACKED = PackedLayout
