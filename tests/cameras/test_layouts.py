"""The camera layouts' decoders (pulsar_py/camera_layouts.py) read the columns the native
core and the Pulsar convention put where they are."""

from __future__ import annotations

import pytest
import torch

from pulsar_py.camera_layouts import PACKED, CameraVectorLayout
from pulsar_py.cameras.params import NativeCamera


@pytest.mark.parametrize("length, rotation, offsets", [(8, 3, False), (10, 3, True), (11, 6, False), (13, 6, True)])
def test_camera_vector_columns(length, rotation, offsets):
    v = torch.arange(float(2 * length)).reshape(2, length)
    layout = CameraVectorLayout.of(length)
    assert (layout.rotation_size, layout.has_offsets) == (rotation, offsets)
    assert torch.equal(layout.position(v), v[:, :3])
    assert torch.equal(layout.rotation(v), v[:, 3 : 3 + rotation])
    assert torch.equal(layout.focal(v), v[:, 3 + rotation]) and layout.focal_index == 3 + rotation
    assert torch.equal(layout.sensor_width(v), v[:, 4 + rotation])
    if offsets:
        x, y = layout.offsets(v)
        assert torch.equal(torch.stack([x, y], -1), v[:, -2:])
    else:
        assert layout.sensor_width_index == length - 1


def test_a_camera_vector_of_another_length_is_refused():
    with pytest.raises(ValueError, match="cam_params: expected a last dimension of 8, 10, 11 or 13 values, got 9"):
        CameraVectorLayout.of(9)


def test_packed_columns_are_what_native_camera_packs():
    g = torch.Generator().manual_seed(0)
    parts = [torch.rand(2, 3, generator=g) for _ in range(4)]
    focal, near, far = (torch.rand(2, generator=g) for _ in range(3))
    packed = NativeCamera(*parts, focal, False, False).pack(near, far)
    assert packed.shape == (2, PACKED.SIZE)
    got = [PACKED.eye(packed), PACKED.p00_rel(packed), PACKED.pdx(packed), PACKED.pdy(packed)]
    assert all(torch.equal(a, b) for a, b in zip(got, parts))
    assert torch.equal(PACKED.focal(packed), focal)
    assert torch.equal(PACKED.near(packed), near) and torch.equal(PACKED.far(packed), far)
