"""Animated GIF files with the standard library and torch alone (no PIL, no imageio).

``write_gif`` stores RGB frames as a looping GIF89a: one palette of 256 colours for all
frames (median cut over a 15-bit colour histogram of every frame, so flat backgrounds stay
exact), LZW-compressed image data. ``decode_gif`` reads such files back (any GIF with
full-size frames and a global or local colour table); the tests use it.
"""

from __future__ import annotations

import os
import struct
from typing import List, Sequence, Tuple, Union

import torch

from .png import to_uint8

PathLike = Union[str, "os.PathLike[str]"]

_PALETTE_SIZE = 256
_MIN_CODE_SIZE = 8          # 8-bit pixel indices
_CLEAR = 1 << _MIN_CODE_SIZE  # 256
_END = _CLEAR + 1             # 257
_MAX_CODES = 4096             # GIF codes are at most 12 bits wide


# ---------------------------------------------------------------------------------------
# Palette

def _histogram_bins(pixels: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 3] -> int64 [...] 15-bit bins (5 bits per channel)."""
    p = pixels.to(torch.int64) >> 3
    return (p[..., 0] << 10) | (p[..., 1] << 5) | p[..., 2]


def _bin_colours(bins: torch.Tensor) -> torch.Tensor:
    """int64 [M] 15-bit bins -> float [M, 3] colour at the bin centres (0..255)."""
    channels = torch.stack([(bins >> 10) & 31, (bins >> 5) & 31, bins & 31], dim=-1)
    return channels.to(torch.float64) * 8 + 3.5


def median_cut_palette(frames: Sequence[torch.Tensor], size: int = _PALETTE_SIZE) -> torch.Tensor:
    """A palette of at most ``size`` colours for uint8 RGB frames ([H, W, 3] each).

    Median cut: start with one box holding every occupied 15-bit colour bin (weighted by
    its pixel count) and repeatedly split the box with the largest weighted extent at the
    weighted median of its longest side. Returns uint8 [P, 3], P <= size.
    """
    bins = torch.cat([_histogram_bins(f).reshape(-1) for f in frames])
    counts = torch.bincount(bins, minlength=1 << 15)
    occupied = torch.nonzero(counts)[:, 0]
    colours, weights = _bin_colours(occupied), counts[occupied].to(torch.float64)

    def score(box: torch.Tensor) -> float:
        """How much splitting this box helps: longest side times sqrt(pixel count)."""
        if box.numel() < 2:
            return 0.0
        extent = float((colours[box].amax(0) - colours[box].amin(0)).max())
        return extent * float(weights[box].sum()) ** 0.5

    boxes: List[torch.Tensor] = [torch.arange(occupied.numel())]
    scores = [score(boxes[0])]
    while len(boxes) < size:
        best = max(range(len(boxes)), key=scores.__getitem__)
        if scores[best] <= 0:
            break  # every box holds one bin: the palette is exact
        box = boxes.pop(best)
        scores.pop(best)
        channel = int((colours[box].amax(0) - colours[box].amin(0)).argmax())
        order = box[torch.argsort(colours[box, channel], stable=True)]
        cumulative = torch.cumsum(weights[order], 0)
        split = int(torch.searchsorted(cumulative, cumulative[-1] / 2)) + 1
        split = min(max(split, 1), order.numel() - 1)
        for part in (order[:split], order[split:]):
            boxes.append(part)
            scores.append(score(part))
    palette = torch.stack([(colours[b] * weights[b, None]).sum(0) / weights[b].sum() for b in boxes])
    return palette.round().clamp(0, 255).to(torch.uint8)


def palette_lookup(palette: torch.Tensor) -> torch.Tensor:
    """uint8 [P, 3] palette -> uint8 [32768]: the nearest palette index of each 15-bit bin."""
    all_bins = torch.arange(1 << 15, dtype=torch.int64)
    return torch.cdist(_bin_colours(all_bins), palette.to(torch.float64)).argmin(-1).to(torch.uint8)


def quantise(frame: torch.Tensor, lookup: torch.Tensor) -> torch.Tensor:
    """uint8 [H, W, 3] -> uint8 [H, W] palette indices, through ``palette_lookup``'s table."""
    return lookup[_histogram_bins(frame)]


# ---------------------------------------------------------------------------------------
# LZW

def lzw_encode(indices: bytes) -> bytes:
    """GIF-flavoured LZW of 8-bit indices: variable code width 9..12 bits, LSB first,
    a clear code first and whenever the 4096-entry table is full, an end code last."""
    out = bytearray()
    acc, acc_bits = 0, 0
    width = _MIN_CODE_SIZE + 1

    def emit(code: int) -> None:
        nonlocal acc, acc_bits
        acc |= code << acc_bits
        acc_bits += width
        while acc_bits >= 8:
            out.append(acc & 0xFF)
            acc >>= 8
            acc_bits -= 8

    emit(_CLEAR)
    if not indices:
        emit(_END)
        if acc_bits:
            out.append(acc & 0xFF)
        return bytes(out)
    table = {}
    next_code = _END + 1
    prefix = indices[0]
    codes_since_clear = 0
    for pixel in indices[1:]:
        key = (prefix << 8) | pixel
        code = table.get(key)
        if code is not None:
            prefix = code
            continue
        emit(prefix)
        codes_since_clear += 1
        if next_code < _MAX_CODES:
            table[key] = next_code
            # The decoder adds this entry one code later and widens its codes when its
            # table reaches the next power of two: widen in step with it.
            if next_code == (1 << width) and width < 12:
                width += 1
            next_code += 1
        else:
            emit(_CLEAR)
            table.clear()
            next_code, width, codes_since_clear = _END + 1, _MIN_CODE_SIZE + 1, 0
        prefix = pixel
    emit(prefix)
    # Reading that last code, the decoder adds one more entry (unless it is the first
    # code after a clear) and may widen before the end code.
    if codes_since_clear >= 1 and next_code < _MAX_CODES and next_code == (1 << width) and width < 12:
        width += 1
    emit(_END)
    if acc_bits:
        out.append(acc & 0xFF)
    return bytes(out)


def lzw_decode(data: bytes, min_code_size: int, expected: int) -> bytes:
    """Inverse of ``lzw_encode`` for any GIF minimum code size; stops at the end code,
    at the end of the data or after ``expected`` indices."""
    clear, end = 1 << min_code_size, (1 << min_code_size) + 1
    width = min_code_size + 1
    table: List[bytes] = [bytes([i]) for i in range(clear)] + [b"", b""]
    out = bytearray()
    previous = None
    acc, acc_bits, pos = 0, 0, 0
    while len(out) < expected:
        while acc_bits < width and pos < len(data):
            acc |= data[pos] << acc_bits
            acc_bits += 8
            pos += 1
        if acc_bits < width:
            break
        code = acc & ((1 << width) - 1)
        acc >>= width
        acc_bits -= width
        if code == clear:
            table = table[: end + 1]
            width, previous = min_code_size + 1, None
            continue
        if code == end:
            break
        if previous is None:
            entry = table[code]
        else:
            if code < len(table):
                entry = table[code]
                new = table[previous] + entry[:1]
            elif code == len(table):
                entry = new = table[previous] + table[previous][:1]
            else:
                raise ValueError(f"gif: LZW code {code} is beyond the table ({len(table)} entries)")
            if len(table) < _MAX_CODES:
                table.append(new)
                if len(table) == (1 << width) and width < 12:
                    width += 1
        out += entry
        previous = code
    return bytes(out[:expected])


# ---------------------------------------------------------------------------------------
# Files

def _sub_blocks(data: bytes) -> bytes:
    """GIF data sub-blocks: length-prefixed pieces of at most 255 bytes, then a 0."""
    pieces = [bytes([len(data[i:i + 255])]) + data[i:i + 255] for i in range(0, len(data), 255)]
    return b"".join(pieces) + b"\x00"


def encode_gif(frames: Sequence[torch.Tensor], frame_ms: int = 100, loop: int = 0) -> bytes:
    """The bytes of an animated GIF of ``frames``.

    Args:
        frames: one or more images, each [H, W, 3] (float in [0, 1] or uint8), all the
            same size (at most 65535 pixels a side).
        frame_ms: display time of each frame in milliseconds (GIF stores hundredths).
        loop: how often to repeat; 0 loops forever.
    """
    if len(frames) == 0:
        raise ValueError("frames: expected at least one frame, got none")
    pixels = [to_uint8(f) for f in frames]
    height, width, channels = pixels[0].shape
    for i, p in enumerate(pixels):
        if p.shape != (height, width, 3):
            raise ValueError(f"frames[{i}]: expected shape ({height}, {width}, 3) like frames[0] "
                             f"(RGB), got {tuple(p.shape)}")
    if width > 0xFFFF or height > 0xFFFF:
        raise ValueError(f"frames: expected at most 65535 pixels a side, got {width}x{height}")
    if not 0 <= loop <= 0xFFFF:
        raise ValueError(f"loop: expected 0 (forever) .. 65535, got {loop}")
    delay = max(1, round(frame_ms / 10))
    palette = median_cut_palette(pixels)
    lookup = palette_lookup(palette)
    table = torch.zeros(_PALETTE_SIZE, 3, dtype=torch.uint8)
    table[: palette.shape[0]] = palette
    out = bytearray(b"GIF89a")
    # Logical screen: global colour table of 2^(7+1) entries, 8 bits per primary.
    out += struct.pack("<HHBBB", width, height, 0xF7, 0, 0)
    out += table.numpy().tobytes()
    out += b"\x21\xFF\x0BNETSCAPE2.0" + struct.pack("<BBHB", 3, 1, loop, 0)
    for p in pixels:
        # Graphic control: disposal "do not dispose", no transparency, the delay.
        out += b"\x21\xF9\x04" + struct.pack("<BHBB", 0x04, delay, 0, 0)
        out += b"\x2C" + struct.pack("<HHHHB", 0, 0, width, height, 0)
        indices = quantise(p, lookup).reshape(-1).numpy().tobytes()
        out += bytes([_MIN_CODE_SIZE]) + _sub_blocks(lzw_encode(indices))
    out += b"\x3B"
    return bytes(out)


def write_gif(path: PathLike, frames: Sequence[torch.Tensor], frame_ms: int = 100, loop: int = 0) -> None:
    """Write ``frames`` (see ``encode_gif``) to ``path`` as an animated GIF; parent folders are created."""
    data = encode_gif(frames, frame_ms, loop)
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _read_sub_blocks(data: bytes, pos: int) -> Tuple[bytes, int]:
    pieces = []
    while True:
        if pos >= len(data):
            raise ValueError("gif: truncated data sub-blocks")
        n = data[pos]
        pos += 1
        if n == 0:
            return b"".join(pieces), pos
        pieces.append(data[pos:pos + n])
        pos += n


def decode_gif(data: bytes) -> List[torch.Tensor]:
    """Decode a GIF to its frames, uint8 [H, W, 3] each (frames that cover the whole
    screen, not interlaced; transparency ignored)."""
    if data[:6] not in (b"GIF87a", b"GIF89a"):
        raise ValueError("gif: not a GIF file (bad signature)")
    width, height, packed, _bg, _aspect = struct.unpack("<HHBBB", data[6:13])
    pos = 13
    global_table = None
    if packed & 0x80:
        n = 2 << (packed & 7)
        global_table = torch.frombuffer(bytearray(data[pos:pos + 3 * n]), dtype=torch.uint8).reshape(n, 3)
        pos += 3 * n
    frames = []
    while pos < len(data):
        kind = data[pos]
        pos += 1
        if kind == 0x3B:
            break
        if kind == 0x21:  # extension: label, then sub-blocks
            _, pos = _read_sub_blocks(data, pos + 1)
            continue
        if kind != 0x2C:
            raise ValueError(f"gif: unexpected block 0x{kind:02x} at byte {pos - 1}")
        left, top, w, h, flags = struct.unpack("<HHHHB", data[pos:pos + 9])
        pos += 9
        if (left, top, w, h) != (0, 0, width, height) or flags & 0x40:
            raise ValueError("gif: only full-screen, non-interlaced frames are supported")
        table = global_table
        if flags & 0x80:
            n = 2 << (flags & 7)
            table = torch.frombuffer(bytearray(data[pos:pos + 3 * n]), dtype=torch.uint8).reshape(n, 3)
            pos += 3 * n
        if table is None:
            raise ValueError("gif: frame without a colour table")
        min_code_size = data[pos]
        compressed, pos = _read_sub_blocks(data, pos + 1)
        indices = lzw_decode(compressed, min_code_size, width * height)
        if len(indices) != width * height:
            raise ValueError(f"gif: expected {width * height} pixels in a frame, got {len(indices)}")
        idx = torch.frombuffer(bytearray(indices), dtype=torch.uint8).to(torch.int64)
        frames.append(table[idx].reshape(height, width, 3).clone())
    return frames


def read_gif(path: PathLike) -> List[torch.Tensor]:
    """Read the frames of a GIF file (see ``decode_gif``)."""
    with open(path, "rb") as f:
        return decode_gif(f.read())
