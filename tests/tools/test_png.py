"""pulsar_py.png: the standard-library PNG writer and reader."""

from __future__ import annotations

import struct
import zlib

import pytest
import torch

from pulsar_py.io.png import decode_png, encode_png, read_png, to_uint8, write_png


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_uint8_round_trip_is_exact(tmp_path, channels):
    gen = torch.Generator().manual_seed(channels)
    image = torch.randint(0, 256, (13, 17, channels), generator=gen, dtype=torch.uint8)
    path = tmp_path / "sub" / "img.png"  # the folder is created
    write_png(path, image)
    back = read_png(path)
    assert back.dtype == torch.uint8
    assert back.shape == (13, 17, channels)
    assert torch.equal(back, image)


def test_float_image_is_clamped_and_rounded():
    image = torch.tensor([[[-0.5, 0.0, 0.5], [1.0 / 255.0, 0.499 / 255.0, 2.0]]], dtype=torch.float64)
    back = decode_png(encode_png(image))
    assert back.tolist() == [[[0, 0, 128], [1, 0, 255]]]


def test_grey_image_without_channel_dimension():
    image = torch.linspace(0, 1, 20).reshape(4, 5)
    back = decode_png(encode_png(image))
    assert back.shape == (4, 5, 1)
    assert torch.equal(back[..., 0], to_uint8(image)[..., 0])
    assert int(back.max()) == 255 and int(back.min()) == 0


def test_file_structure_is_standard_png():
    data = encode_png(torch.zeros(3, 2, 3))
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height, depth, colour_type = struct.unpack(">IIBB", data[16:26])
    assert (width, height, depth, colour_type) == (2, 3, 8, 2)
    assert data.endswith(b"IEND\xaeB`\x82")


def _png_with_filters(rows, channels, filters):
    """A PNG whose scanlines carry the given (already filtered) bytes and filter types."""
    height, stride = len(rows), len(rows[0])
    raw = b"".join(bytes([f]) + bytes(r) for f, r in zip(filters, rows))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", stride // channels, height, 8, {1: 0, 3: 2}[channels], 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def test_reader_undoes_every_filter_type():
    # Grey, 4 pixels per row; the expected pixels are computed by hand from the PNG spec.
    rows = [[10, 20, 30, 40], [1, 2, 3, 4], [5, 5, 5, 5], [0, 0, 0, 0], [7, 1, 1, 1]]
    filters = [0, 1, 2, 3, 4]
    expected = [
        [10, 20, 30, 40],          # none
        [1, 3, 6, 10],             # sub: running sum
        [6, 8, 11, 15],            # up: + previous row
        [3, 5, 8, 11],             # average: floor((left + up) / 2); left of x=0 is 0
        [10, 11, 12, 13],          # paeth: first pixel picks up (3 + 7); then left wins
    ]
    back = decode_png(_png_with_filters(rows, 1, filters))
    assert back[..., 0].tolist() == expected


def test_bad_inputs_raise_named_errors(tmp_path):
    with pytest.raises(ValueError, match="image"):
        encode_png(torch.zeros(4, 4, 5))
    with pytest.raises(ValueError, match="image"):
        encode_png(torch.zeros(4))
    with pytest.raises(TypeError, match="image"):
        encode_png(torch.zeros(4, 4, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="NaN"):
        encode_png(torch.full((2, 2, 3), float("nan")))
    with pytest.raises(ValueError, match="signature"):
        decode_png(b"not a png")
    corrupt = bytearray(encode_png(torch.zeros(2, 2, 3)))
    corrupt[20] ^= 0xFF  # inside IHDR: its CRC no longer matches
    with pytest.raises(ValueError, match="CRC"):
        decode_png(bytes(corrupt))
