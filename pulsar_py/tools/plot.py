"""Line plots drawn straight into image tensors (no matplotlib): for the demo's loss.png.

``line_plot`` draws one panel (a title, y range labels, a log or linear y axis, one or
more curves); ``stack_panels`` puts panels under each other. Text uses a built-in 3x5
pixel font (upper-case letters, digits and a little punctuation), drawn at any integer
scale. Images are float [H, W, 3] in [0, 1]; write them with ``pulsar_py.png.write_png``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch

Colour = Tuple[float, float, float]

BACKGROUND: Colour = (1.0, 1.0, 1.0)
INK: Colour = (0.15, 0.15, 0.15)
GRID: Colour = (0.88, 0.88, 0.88)
#: Distinct curve colours (blue, orange, green, red, purple).
PALETTE: Tuple[Colour, ...] = ((0.12, 0.38, 0.75), (0.95, 0.5, 0.05), (0.15, 0.6, 0.2), (0.82, 0.15, 0.15),
                               (0.5, 0.3, 0.7))

# 3x5 glyphs, rows top to bottom, '#' = ink.
_GLYPHS: Dict[str, Tuple[str, ...]] = {
    "0": ("###", "#.#", "#.#", "#.#", "###"), "1": (".#.", "##.", ".#.", ".#.", "###"),
    "2": ("###", "..#", "###", "#..", "###"), "3": ("###", "..#", ".##", "..#", "###"),
    "4": ("#.#", "#.#", "###", "..#", "..#"), "5": ("###", "#..", "###", "..#", "###"),
    "6": ("###", "#..", "###", "#.#", "###"), "7": ("###", "..#", ".#.", ".#.", ".#."),
    "8": ("###", "#.#", "###", "#.#", "###"), "9": ("###", "#.#", "###", "..#", "###"),
    "A": (".#.", "#.#", "###", "#.#", "#.#"), "B": ("##.", "#.#", "##.", "#.#", "##."),
    "C": (".##", "#..", "#..", "#..", ".##"), "D": ("##.", "#.#", "#.#", "#.#", "##."),
    "E": ("###", "#..", "##.", "#..", "###"), "F": ("###", "#..", "##.", "#..", "#.."),
    "G": (".##", "#..", "#.#", "#.#", ".##"), "H": ("#.#", "#.#", "###", "#.#", "#.#"),
    "I": ("###", ".#.", ".#.", ".#.", "###"), "J": ("..#", "..#", "..#", "#.#", ".#."),
    "K": ("#.#", "#.#", "##.", "#.#", "#.#"), "L": ("#..", "#..", "#..", "#..", "###"),
    "M": ("#.#", "###", "###", "#.#", "#.#"), "N": ("##.", "#.#", "#.#", "#.#", "#.#"),
    "O": (".#.", "#.#", "#.#", "#.#", ".#."), "P": ("##.", "#.#", "##.", "#..", "#.."),
    "Q": (".#.", "#.#", "#.#", "##.", ".##"), "R": ("##.", "#.#", "##.", "#.#", "#.#"),
    "S": (".##", "#..", ".#.", "..#", "##."), "T": ("###", ".#.", ".#.", ".#.", ".#."),
    "U": ("#.#", "#.#", "#.#", "#.#", "###"), "V": ("#.#", "#.#", "#.#", "#.#", ".#."),
    "W": ("#.#", "#.#", "###", "###", "#.#"), "X": ("#.#", "#.#", ".#.", "#.#", "#.#"),
    "Y": ("#.#", "#.#", ".#.", ".#.", ".#."), "Z": ("###", "..#", ".#.", "#..", "###"),
    ".": ("...", "...", "...", "...", ".#."), ",": ("...", "...", "...", ".#.", "#.."),
    "-": ("...", "...", "###", "...", "..."), "+": ("...", ".#.", "###", ".#.", "..."),
    "(": (".#.", "#..", "#..", "#..", ".#."), ")": (".#.", "..#", "..#", "..#", ".#."),
    "/": ("..#", "..#", ".#.", "#..", "#.."), ":": ("...", ".#.", "...", ".#.", "..."),
    "%": ("#.#", "..#", ".#.", "#..", "#.#"), "=": ("...", "###", "...", "###", "..."),
    "_": ("...", "...", "...", "...", "###"), " ": ("...", "...", "...", "...", "..."),
    "?": ("##.", "..#", ".#.", "...", ".#."),
}
GLYPH_W, GLYPH_H = 3, 5


def text_width(text: str, scale: int = 1) -> int:
    """Width in pixels of ``text`` drawn by ``draw_text`` (glyphs plus one-pixel gaps)."""
    return max(0, len(text) * (GLYPH_W + 1) - 1) * scale


def draw_text(image: torch.Tensor, text: str, x: int, y: int, colour: Colour = INK, scale: int = 1) -> None:
    """Draw ``text`` into ``image`` [H, W, 3] in place, top-left corner at column x, row y.

    Lower-case letters are drawn as upper-case; unknown characters as '?'. Pixels
    outside the image are clipped.
    """
    ink = torch.tensor(colour, dtype=image.dtype)
    height, width = image.shape[:2]
    for k, char in enumerate(text.upper()):
        glyph = _GLYPHS.get(char, _GLYPHS["?"])
        left = x + k * (GLYPH_W + 1) * scale
        for row, bits in enumerate(glyph):
            for col, bit in enumerate(bits):
                if bit != "#":
                    continue
                r0, c0 = y + row * scale, left + col * scale
                r1, c1 = min(r0 + scale, height), min(c0 + scale, width)
                if r0 < height and c0 < width and r1 > 0 and c1 > 0:
                    image[max(r0, 0):r1, max(c0, 0):c1] = ink


def draw_polyline(image: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor, colour: Colour,
                  thickness: int = 1) -> None:
    """Draw connected segments through pixel coordinates (xs [P], ys [P], float) in place."""
    if xs.numel() == 0:
        return
    if xs.numel() == 1:
        xs, ys = xs.repeat(2), ys.repeat(2)
    # Sample every segment densely enough that consecutive samples touch.
    lengths = torch.maximum((xs[1:] - xs[:-1]).abs(), (ys[1:] - ys[:-1]).abs()).ceil().clamp_min(1).long()
    t = [torch.arange(int(n) + 1, dtype=torch.float64) / int(n) for n in lengths]
    px = torch.cat([xs[i] + (xs[i + 1] - xs[i]) * ti for i, ti in enumerate(t)])
    py = torch.cat([ys[i] + (ys[i + 1] - ys[i]) * ti for i, ti in enumerate(t)])
    height, width = image.shape[:2]
    ink = torch.tensor(colour, dtype=image.dtype)
    for dy in range(thickness):
        for dx in range(thickness):
            cx = (px.round().long() + dx - thickness // 2)
            cy = (py.round().long() + dy - thickness // 2)
            keep = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height)
            image[cy[keep], cx[keep]] = ink


@dataclass
class Series:
    """One curve: y values at x = 0, 1, ... (or at ``xs``), a legend label and a colour."""

    label: str
    values: Sequence[float]
    colour: Colour = PALETTE[0]
    xs: Sequence[float] = ()


def format_number(value: float) -> str:
    """Short label for an axis value: 3 significant digits, exponent form when needed."""
    if not math.isfinite(value):
        return str(value).upper()
    magnitude = abs(value)
    if value == int(value) and magnitude < 1e6:
        return str(int(value))
    if 1e-2 <= magnitude < 1e4:
        text = f"{value:.3g}"
    else:
        text = f"{value:.2e}".replace("e-0", "e-").replace("e+0", "e").replace("e+", "e")
    return text.upper()


def line_plot(series: Sequence[Series], title: str, width: int = 480, height: int = 180,
              log_y: bool = True, x_label: str = "step", scale: int = 2) -> torch.Tensor:
    """One plot panel as float [height, width, 3] in [0, 1].

    Draws a frame, horizontal grid lines (at powers of ten for a log axis), the title and
    legend on top, the y range at the left, the x range below, and each series as a
    polyline. On a log axis, values <= 0 are clipped to the smallest positive value.
    """
    image = torch.tensor(BACKGROUND, dtype=torch.float64).expand(height, width, 3).clone()
    line_h = (GLYPH_H + 2) * scale
    values = [torch.as_tensor(list(s.values), dtype=torch.float64) for s in series]
    xs = [torch.as_tensor(list(s.xs), dtype=torch.float64) if len(s.xs) else torch.arange(len(v), dtype=torch.float64)
          for s, v in zip(series, values)]
    finite = torch.cat([v[torch.isfinite(v)] for v in values]) if values else torch.zeros(0)
    if log_y:
        finite = finite[finite > 0]
    if finite.numel() == 0:
        finite = torch.tensor([1.0, 10.0] if log_y else [0.0, 1.0], dtype=torch.float64)
    lo, hi = float(finite.min()), float(finite.max())

    def transform(v: torch.Tensor) -> torch.Tensor:
        return torch.log10(v.clamp_min(lo)) if log_y else v

    t_lo, t_hi = (math.log10(lo), math.log10(hi)) if log_y else (lo, hi)
    if t_hi - t_lo < 1e-12:
        t_lo, t_hi = t_lo - 0.5, t_hi + 0.5
    x_all = torch.cat(xs) if xs else torch.zeros(1)
    x_lo, x_hi = float(x_all.min()), float(x_all.max())
    if x_hi <= x_lo:
        x_hi = x_lo + 1

    # Plot area: room for the y labels at the left, title (and legend) above, x labels below.
    legend_w = sum(text_width(s.label, scale) + 4 * scale for s in series)
    legend_own_line = text_width(title, scale) + 6 * scale + legend_w > width
    label_w = text_width("-0.00E-00", scale) + 2 * scale
    left, right = label_w + 2 * scale, width - 3 * scale
    top = (2 if legend_own_line else 1) * line_h + 3 * scale
    bottom = height - line_h - 2 * scale
    if right - left < 10 or bottom - top < 10:
        raise ValueError(f"width, height: expected a panel large enough for its labels, got {width}x{height}")

    def to_px(x: torch.Tensor, y: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        px = left + (x - x_lo) / (x_hi - x_lo) * (right - left)
        py = bottom - (transform(y) - t_lo) / (t_hi - t_lo) * (bottom - top)
        return px, py

    if log_y:
        for decade in range(math.ceil(t_lo), math.floor(t_hi) + 1):
            row = round(bottom - (decade - t_lo) / (t_hi - t_lo) * (bottom - top))
            image[row, left:right + 1] = torch.tensor(GRID, dtype=image.dtype)
    image[top:bottom + 1, left] = torch.tensor(INK, dtype=image.dtype)
    image[bottom, left:right + 1] = torch.tensor(INK, dtype=image.dtype)
    for s, x, v in zip(series, xs, values):
        keep = torch.isfinite(v)
        px, py = to_px(x[keep], v[keep])
        draw_polyline(image, px, py, s.colour, thickness=max(1, scale // 2 + 1))

    draw_text(image, title, left, scale, INK, scale)
    legend_x = width - 2 * scale
    legend_y = scale + (line_h if legend_own_line else 0)
    for s in reversed(series):
        legend_x -= text_width(s.label, scale)
        draw_text(image, s.label, legend_x, legend_y, s.colour, scale)
        legend_x -= 4 * scale
    hi_label = format_number(10 ** t_hi if log_y else t_hi)
    lo_label = format_number(10 ** t_lo if log_y else t_lo)
    draw_text(image, hi_label, left - 2 * scale - text_width(hi_label, scale), top, INK, scale)
    draw_text(image, lo_label, left - 2 * scale - text_width(lo_label, scale), bottom - GLYPH_H * scale, INK, scale)
    x_text_row = bottom + 2 * scale
    draw_text(image, format_number(x_lo), left, x_text_row, INK, scale)
    x_hi_label = format_number(x_hi)
    draw_text(image, x_hi_label, right - text_width(x_hi_label, scale), x_text_row, INK, scale)
    draw_text(image, x_label, (left + right - text_width(x_label, scale)) // 2, x_text_row, INK, scale)
    return image


def stack_panels(panels: Sequence[torch.Tensor], gap: int = 4) -> torch.Tensor:
    """Panels of equal width ([H_k, W, 3] each) under each other, separated by ``gap`` rows."""
    if not panels:
        raise ValueError("panels: expected at least one panel, got none")
    width = panels[0].shape[1]
    rows: List[torch.Tensor] = []
    for k, panel in enumerate(panels):
        if panel.shape[1] != width:
            raise ValueError(f"panels[{k}]: expected width {width} like panels[0], got {panel.shape[1]}")
        if rows:
            rows.append(torch.tensor(BACKGROUND, dtype=panel.dtype).expand(gap, width, 3))
        rows.append(panel)
    return torch.cat(rows, dim=0)
