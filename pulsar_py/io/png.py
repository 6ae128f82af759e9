"""PNG files with the standard library alone (zlib + struct): no PIL needed.

``write_png`` stores an 8-bit grey, grey+alpha, RGB or RGBA image; ``read_png`` reads
8-bit non-interlaced PNGs back (every file ``write_png`` makes, and most simple ones
other programs make), which is what the tests and the command line need.
"""

from __future__ import annotations

import os
import struct
import zlib
from typing import Union

import torch

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# PNG colour type for each channel count: grey, grey+alpha, RGB, RGBA.
_COLOUR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}
_CHANNELS = {v: k for k, v in _COLOUR_TYPE.items()}

PathLike = Union[str, "os.PathLike[str]"]


def to_uint8(image: torch.Tensor) -> torch.Tensor:
    """An image as uint8 [H, W, C] on the CPU.

    Args:
        image: [H, W] or [H, W, C] with C in 1..4; uint8 is taken as is, a floating
            tensor is clamped to [0, 1] and scaled to 0..255 (rounded).
    """
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"image: expected a torch.Tensor, got {type(image).__name__}")
    img = image.detach().cpu()
    if img.dim() == 2:
        img = img[:, :, None]
    if img.dim() != 3 or img.shape[-1] not in _COLOUR_TYPE:
        raise ValueError(f"image: expected shape [H, W] or [H, W, C] with C in 1..4, got {tuple(image.shape)}")
    if img.shape[0] < 1 or img.shape[1] < 1:
        raise ValueError(f"image: expected at least one pixel, got shape {tuple(image.shape)}")
    if img.dtype == torch.uint8:
        return img.contiguous()
    if not img.is_floating_point():
        raise TypeError(f"image: expected uint8 or a floating dtype, got {img.dtype}")
    if not bool(torch.isfinite(img).all()):
        raise ValueError("image: expected finite values, got NaN or Inf")
    return (img.float().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).contiguous()


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def encode_png(image: torch.Tensor, compression: int = 6) -> bytes:
    """The bytes of a PNG file holding ``image`` (see ``to_uint8`` for what it accepts)."""
    pixels = to_uint8(image)
    height, width, channels = pixels.shape
    header = struct.pack(">IIBBBBB", width, height, 8, _COLOUR_TYPE[channels], 0, 0, 0)
    # Each scanline starts with its filter type; 0 (none) keeps the writer trivial.
    rows = pixels.reshape(height, width * channels)
    raw = torch.cat([torch.zeros(height, 1, dtype=torch.uint8), rows], dim=1)
    body = zlib.compress(raw.numpy().tobytes(), compression)
    return _SIGNATURE + _chunk(b"IHDR", header) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def write_png(path: PathLike, image: torch.Tensor) -> None:
    """Write ``image`` ([H, W] or [H, W, C], C in 1..4, float in [0, 1] or uint8) to
    ``path`` as an 8-bit PNG. Parent folders are created as needed."""
    data = encode_png(image)
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(raw: bytes, height: int, stride: int, bpp: int) -> bytearray:
    """Undo PNG's per-scanline filters (types 0-4). Returns height * stride bytes."""
    out = bytearray(height * stride)
    prev = bytearray(stride)
    pos = 0
    for y in range(height):
        kind = raw[pos]
        line = bytearray(raw[pos + 1 : pos + 1 + stride])
        pos += 1 + stride
        if kind == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev))
        elif kind == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                up_left = prev[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + _paeth(left, prev[i], up_left)) & 0xFF
        elif kind != 0:
            raise ValueError(f"png: unknown scanline filter type {kind} in row {y}")
        out[y * stride : (y + 1) * stride] = line
        prev = line
    return out


def decode_png(data: bytes) -> torch.Tensor:
    """Decode an 8-bit, non-interlaced PNG to uint8 [H, W, C] (C = 1, 2, 3 or 4)."""
    if data[:8] != _SIGNATURE:
        raise ValueError("png: not a PNG file (bad signature)")
    pos, header, idat = 8, None, []
    while pos < len(data):
        if pos + 8 > len(data):
            raise ValueError("png: truncated chunk header")
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length : pos + 12 + length])
        if len(body) != length or zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            raise ValueError(f"png: chunk {kind!r} is truncated or fails its CRC")
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if header is None or not idat:
        raise ValueError("png: missing IHDR or IDAT chunk")
    width, height, depth, colour_type, _compression, _filter, interlace = header
    if depth != 8 or colour_type not in _CHANNELS or interlace != 0:
        raise ValueError(f"png: only 8-bit non-interlaced grey/RGB(A) is supported, got bit depth {depth}, "
                         f"colour type {colour_type}, interlace {interlace}")
    channels = _CHANNELS[colour_type]
    stride = width * channels
    raw = zlib.decompress(b"".join(idat))
    if len(raw) != height * (stride + 1):
        raise ValueError(f"png: expected {height * (stride + 1)} bytes of image data, got {len(raw)}")
    if all(raw[y * (stride + 1)] == 0 for y in range(height)):
        # Fast path (every file write_png makes): drop the filter byte of each row.
        rows = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(height, stride + 1)[:, 1:]
        return rows.reshape(height, width, channels).clone()
    pixels = _unfilter(raw, height, stride, channels)
    return torch.frombuffer(pixels, dtype=torch.uint8).reshape(height, width, channels).clone()


def read_png(path: PathLike) -> torch.Tensor:
    """Read an 8-bit, non-interlaced PNG file to uint8 [H, W, C]."""
    with open(path, "rb") as f:
        return decode_png(f.read())
