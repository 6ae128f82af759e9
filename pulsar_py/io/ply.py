"""PLY files, read and written through plyfile: point clouds and 3D Gaussian Splatting scenes.

ASCII and binary (either byte order) files are read; of their elements only ``vertex`` is
used: the others (a mesh's faces, ...) are ignored with an ``IgnoredElementsWarning`` that
names their counts. Two layouts of its properties are understood:

**Point clouds**: ``x, y, z``; optional colours ``red, green, blue`` (also ``r, g, b`` or
``diffuse_red, ...``; integer types scaled to [0, 1] by their maximum, 255 for uchar,
floats taken as they are); an optional radius ``radius`` (or ``scale``; world units) and
an optional opacity ``opacity`` (or ``alpha``; integers scaled like colours, else in
[0, 1]).

**3D Gaussian Splatting scenes** (recognised by ``f_dc_0``): ``x, y, z``; ``f_dc_0..2``,
the degree-0 spherical-harmonics coefficients of red, green and blue; optional
``f_rest_0..f_rest_{R-1}``, the higher-degree coefficients, R = 9, 24 or 45 for degree
1, 2 or 3, stored channel by channel (all of red's, then green's, then blue's, as 3DGS
writes them); ``opacity`` as a logit (passed through a sigmoid); ``scale_0..2`` as
natural logarithms of the Gaussian's standard deviations along its axes, which become
one sphere radius (``gaussian_radius``). ``rot_0..3`` (the Gaussian's orientation) is
ignored: a sphere is isotropic, so it has none. The coefficients land in
``PointCloud.sh_coefficients`` (``[N, (degree + 1)^2, 3]``, the layout of
``Renderer.render(..., sh_degree=)``), and ``PointCloud.colours`` holds the colour of the
degree-0 term alone.

Other vertex properties (normals, ...) are ignored. A vertex element that fits neither
layout (no ``x, y, z``, a partial colour triple, a partial set of SH coefficients or
scales) is a ValueError that lists the properties found and the layouts expected. A header
whose element counts need more bytes than the file holds after it is a ValueError before
anything is read (``_check_counts``).
``write_ply`` writes point clouds (the first layout), so they round-trip. plyfile is
imported when a file is read or written.
"""

from __future__ import annotations

import io
import math
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..sh import sh_dc_to_rgb, sh_degree_of
from ._deps import require

PathLike = Union[str, "os.PathLike[str]"]

_COLOUR_NAMES: Tuple[Tuple[str, str, str], ...] = (
    ("red", "green", "blue"),
    ("r", "g", "b"),
    ("diffuse_red", "diffuse_green", "diffuse_blue"),
)
_RADIUS_NAMES = ("radius", "scale")
_OPACITY_NAMES = ("opacity", "alpha")
_GAUSSIAN_SCALES = ("scale_0", "scale_1", "scale_2")
_SH_DC = ("f_dc_0", "f_dc_1", "f_dc_2")

#: A sphere's radius per unit of a Gaussian's standard deviation (``gaussian_radius``).
GAUSSIAN_RADIUS_FACTOR = math.sqrt(2.0)
# Exponent of Knud Thomsen's formula for the surface area of an ellipsoid (relative
# error at most 1.061 %).
_THOMSEN_P = 1.6075

EXPECTED_LAYOUTS = (
    "expected a point cloud (x, y, z; optional red, green, blue or r, g, b or diffuse_red, "
    "diffuse_green, diffuse_blue; optional radius or scale; optional opacity or alpha) or a 3D "
    "Gaussian Splatting scene (x, y, z, f_dc_0, f_dc_1, f_dc_2, optional f_rest_0 ... f_rest_{R-1} "
    "with R = 9, 24 or 45, opacity, scale_0, scale_1, scale_2, rot_0 ... rot_3)"
)


@dataclass
class PointCloud:
    """A point cloud as float32 CPU tensors.

    Attributes:
        positions: [N, 3] world coordinates.
        colours: [N, 3] RGB in [0, 1] (for a 3DGS scene: the colour of the degree-0
            SH term, max(C0 f_dc + 0.5, 0)), or None when the file has no colours.
        radii: [N] sphere radii (world units), or None.
        opacity: [N] opacities in [0, 1], or None.
        sh_coefficients: [N, (degree + 1)^2, 3] spherical-harmonics coefficients of a
            3DGS scene (``pulsar_py.sh``), or None.
    """

    positions: torch.Tensor
    colours: Optional[torch.Tensor] = None
    radii: Optional[torch.Tensor] = None
    opacity: Optional[torch.Tensor] = None
    sh_coefficients: Optional[torch.Tensor] = None

    def __post_init__(self) -> None:
        # The readers' and the tools' one check of the values a renderer would refuse or
        # blend wrongly: radii must be > 0 and opacities lie in [0, 1] (NaN fails both).
        if self.radii is not None and not bool((self.radii > 0).all()):
            raise ValueError(f"ply radii: expected values > 0, got a minimum of {float(self.radii.min())}")
        if self.opacity is not None and not bool(((self.opacity >= 0) & (self.opacity <= 1)).all()):
            raise ValueError(
                f"ply opacity: expected values in [0, 1], got [{float(self.opacity.min())}, "
                f"{float(self.opacity.max())}]"
            )

    def __len__(self) -> int:
        return int(self.positions.shape[0])

    @property
    def sh_degree(self) -> Optional[int]:
        """Degree (0..3) of ``sh_coefficients``, or None without them."""
        if self.sh_coefficients is None:
            return None
        return sh_degree_of(self.sh_coefficients.shape[1])


def _plyfile() -> Any:
    return require("plyfile", "to read and write PLY files")


def gaussian_radius(log_scales: torch.Tensor) -> torch.Tensor:
    """One sphere radius per 3D Gaussian from its log standard deviations [..., 3] -> [...].

    The rule: ``GAUSSIAN_RADIUS_FACTOR`` (sqrt 2) times the radius of the sphere whose
    mean projected area equals the ellipsoid's (s0, s1, s2) = exp(log_scales)'s.

    * The mean area of a convex body's shadow over all view directions is a quarter of
      its surface area (Cauchy), so the sphere with the ellipsoid's surface area has its
      apparent size on average. Its radius is ((s0^p s1^p + s0^p s2^p + s1^p s2^p) / 3)^(1 / 2p)
      with p = 1.6075 (Thomsen's formula): s for a round Gaussian, and for the flat
      Gaussians that 3DGS fits to surfaces (one scale near 0) 0.71 sqrt(s0 s1), the
      disc's sqrt(s0 s1 / 2) to 0.5 %, where the geometric mean (s0 s1 s2)^(1/3) would
      shrink towards 0 and open holes in the surface.
    * A Gaussian's opacity profile exp(-d^2 / (2 s^2)) integrates over the image plane
      to 2 pi s^2, the area of a disc of radius sqrt(2) s: a sphere that wide covers as
      much as the Gaussian in all, opacity included.

    ``pulsar-py render --radius-scale`` scales the result for scenes that want more or less.
    """
    scales = torch.exp(log_scales.double())
    p = _THOMSEN_P
    a, b, c = (scales[..., k] ** p for k in range(3))
    equal_area = ((a * b + a * c + b * c) / 3) ** (1 / (2 * p))
    return GAUSSIAN_RADIUS_FACTOR * equal_area


def _unit_scale(values: np.ndarray) -> np.ndarray:
    """Integer channels to [0, 1] by the type's maximum; floats unchanged (float64)."""
    if values.dtype.kind in "iu":
        return values.astype(np.float64) / float(np.iinfo(values.dtype).max)
    return values.astype(np.float64)


def _tensor(values: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))


class _Vertices:
    """The vertex element's scalar properties, with errors that name the layout found."""

    def __init__(self, element: Any) -> None:
        self.names: List[str] = [p.name for p in element.properties]
        self._scalars = {p.name for p in element.properties if not hasattr(p, "len_dtype")}
        self._data = element.data

    def __contains__(self, name: str) -> bool:
        return name in self.names

    def error(self, problem: str) -> ValueError:
        found = ", ".join(self.names) if self.names else "none"
        return ValueError(f"ply: {problem}; the vertex element has the properties {found}; {EXPECTED_LAYOUTS}")

    def column(self, name: str) -> np.ndarray:
        if name not in self._scalars:
            raise self.error(f"vertex property {name!r} is a list, expected a number per vertex")
        return np.asarray(self._data[name])

    def group(self, names: Sequence[str], what: str) -> Optional[np.ndarray]:
        """[N, len(names)] float64 when every name is present, None when none is."""
        present = [n for n in names if n in self]
        if not present:
            return None
        if len(present) != len(names):
            missing = [n for n in names if n not in self]
            raise self.error(f"{what}: found {', '.join(present)} without {', '.join(missing)}")
        return np.stack([self.column(n).astype(np.float64) for n in names], axis=-1)


def _sh_rest(vertices: _Vertices) -> Optional[np.ndarray]:
    """f_rest_* as [N, K, 3] (K = (degree + 1)^2 - 1), or None without them."""
    rest = sorted((int(m.group(1)), name) for name in vertices.names if (m := re.fullmatch(r"f_rest_(\d+)", name)))
    if not rest:
        return None
    count = len(rest)
    if [k for k, _ in rest] != list(range(count)) or count not in (9, 24, 45):
        raise vertices.error(
            f"expected f_rest_0 ... f_rest_{{R-1}} with R = 9, 24 or 45 (SH degree 1, 2 or 3), "
            f"got {count} f_rest properties numbered {rest[0][0]} to {rest[-1][0]}"
        )
    per_channel = count // 3
    values = np.stack([vertices.column(name).astype(np.float64) for _, name in rest], axis=-1)
    # 3DGS stores the coefficients channel by channel: [N, 3, K] -> [N, K, 3].
    return values.reshape(-1, 3, per_channel).transpose(0, 2, 1)


def _gaussian_scene(vertices: _Vertices, positions: np.ndarray) -> PointCloud:
    dc = vertices.group(_SH_DC, "SH coefficients")
    rest = _sh_rest(vertices)
    coefficients = dc[:, None, :] if rest is None else np.concatenate([dc[:, None, :], rest], axis=1)
    colours = sh_dc_to_rgb(torch.from_numpy(dc)).numpy()
    opacity = None
    if "opacity" in vertices:
        opacity = 1.0 / (1.0 + np.exp(-vertices.column("opacity").astype(np.float64)))
    log_scales = vertices.group(_GAUSSIAN_SCALES, "Gaussian scales")
    radii = None if log_scales is None else gaussian_radius(torch.from_numpy(log_scales)).numpy()
    return PointCloud(
        _tensor(positions),
        _tensor(colours),
        None if radii is None else _tensor(radii),
        None if opacity is None else _tensor(opacity),
        _tensor(coefficients),
    )


def _point_cloud(vertices: _Vertices, positions: np.ndarray) -> PointCloud:
    colours = None
    for names in _COLOUR_NAMES:
        if any(n in vertices for n in names):
            present = [n for n in names if n in vertices]
            if len(present) != 3:
                missing = [n for n in names if n not in vertices]
                raise vertices.error(f"colours: found {', '.join(present)} without {', '.join(missing)}")
            colours = np.stack([_unit_scale(vertices.column(n)) for n in names], axis=-1)
            break
    radius_name = next((n for n in _RADIUS_NAMES if n in vertices), None)
    opacity_name = next((n for n in _OPACITY_NAMES if n in vertices), None)
    return PointCloud(
        _tensor(positions),
        None if colours is None else _tensor(colours),
        None if radius_name is None else _tensor(vertices.column(radius_name)),
        None if opacity_name is None else _tensor(_unit_scale(vertices.column(opacity_name))),
    )


class IgnoredElementsWarning(UserWarning):
    """A PLY file holds elements besides its vertices (a mesh's faces, edges, ...), which
    are not read: each vertex becomes a sphere."""


def _warn_ignored(data: Any) -> None:
    """IgnoredElementsWarning naming the rows of every non-empty element but the vertices."""
    ignored = [
        (element.name, element.count) for element in data.elements if element.name != "vertex" and element.count > 0
    ]
    if ignored:

        def counted(count: int, one: str, many: str) -> str:
            return f"{count} {one if count == 1 else many}"

        listed = ", ".join(
            counted(count, "face", "faces") if name == "face" else f"{counted(count, 'row', 'rows')} of '{name}'"
            for name, count in ignored
        )
        warnings.warn(
            f"ply: ignored the file's {listed}: only its {counted(data['vertex'].count, 'vertex', 'vertices')} "
            f"are read, each drawn as a sphere (no mesh surface)",
            IgnoredElementsWarning,
            stacklevel=5,
        )


def _from_plydata(data: Any) -> PointCloud:
    names = [element.name for element in data.elements]
    if "vertex" not in names:
        raise ValueError(f"ply: expected a 'vertex' element, got the elements {', '.join(names) or 'none'}")
    _warn_ignored(data)
    vertices = _Vertices(data["vertex"])
    positions = vertices.group(("x", "y", "z"), "positions")
    if positions is None:
        raise vertices.error("no positions (x, y, z)")
    if any(n in vertices for n in _SH_DC):
        return _gaussian_scene(vertices, positions)
    return _point_cloud(vertices, positions)


def _smallest_row(plyfile: Any, element: Any, text: bool) -> int:
    """Bytes that one row of ``element`` takes at least: in ASCII a character and a
    separator (or the newline) per property; in binary its scalars' sizes, and a list's
    length field."""
    if text:
        return 2 * len(element.properties)
    return sum(
        np.dtype(p.len_dtype if isinstance(p, plyfile.PlyListProperty) else p.val_dtype).itemsize
        for p in element.properties
    )


def _check_counts(plyfile: Any, stream: Any) -> None:
    """ValueError when the header declares more rows than the bytes after it can hold.

    plyfile allocates each element's array from the header's count before it reads any
    data, so a damaged header (10^15 vertices, a face element of 10^12 rows) would end in
    numpy's out-of-memory error. This reads the header with plyfile's own parser (the one
    ``PlyData.read`` calls; plyfile has no public one), weighs each element's smallest
    size against the file's remaining bytes and puts the stream back where it was.
    """
    parse_header = getattr(plyfile.PlyData, "_parse_header", None)
    if parse_header is None or not stream.seekable():
        return  # another plyfile, or a stream without a length: plyfile's own checks only
    start = stream.tell()
    header = parse_header(stream)
    data_start = stream.tell()
    available = stream.seek(0, io.SEEK_END) - data_start
    stream.seek(start)
    needs = [(element.count * _smallest_row(plyfile, element, header.text), element) for element in header.elements]
    # The last row of an ASCII file may end the file without its newline.
    needed = sum(need for need, _ in needs) - (1 if header.text else 0)
    if needed > available:
        described = ", ".join(
            f"{element.count} '{element.name}' rows (at least {need} bytes)" for need, element in needs if need
        )
        raise ValueError(
            f"ply: the header declares {described}, but the file holds {available} bytes after its "
            f"header: a damaged header or a truncated file"
        )


def _parse(source: Any) -> PointCloud:
    plyfile = _plyfile()
    try:
        _check_counts(plyfile, source)
        data = plyfile.PlyData.read(source)
    except plyfile.PlyHeaderParseError as exc:
        if "expected 'ply'" in str(exc):
            raise ValueError("ply: not a PLY file (it must start with the line 'ply')") from None
        raise ValueError(f"ply: bad header: {exc}") from None
    except plyfile.PlyParseError as exc:
        raise ValueError(f"ply: bad data: {exc}") from None
    return _from_plydata(data)


def decode_ply(data: bytes) -> PointCloud:
    """Parse the bytes of a PLY file (see the module docstring for what is read)."""
    return _parse(io.BytesIO(data))


def read_ply(path: PathLike) -> PointCloud:
    """Read a PLY point cloud or 3DGS scene (ascii or binary; see the module docstring)."""
    with open(path, "rb") as f:
        return _parse(f)


def _column(name: str, t: Optional[torch.Tensor], n: int, width: int) -> Optional[np.ndarray]:
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(t).__name__}")
    expected = (n,) if width == 1 else (n, width)
    if tuple(t.shape) != expected:
        raise ValueError(f"{name}: expected shape {expected}, got {tuple(t.shape)}")
    return t.detach().cpu().double().numpy()


def _plydata(
    positions: torch.Tensor,
    colours: Optional[torch.Tensor],
    radii: Optional[torch.Tensor],
    opacity: Optional[torch.Tensor],
    binary: bool,
    colour_type: str,
) -> Any:
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or positions.shape[1] != 3:
        raise ValueError(
            f"positions: expected a tensor of shape [N, 3], got "
            f"{tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__}"
        )
    if colour_type not in ("uchar", "float"):
        raise ValueError(f"colour_type: expected 'uchar' or 'float', got {colour_type!r}")
    n = int(positions.shape[0])
    pos = positions.detach().cpu().double().numpy()
    col = _column("colours", colours, n, 3)
    rad = _column("radii", radii, n, 1)
    opa = _column("opacity", opacity, n, 1)
    fields: List[Tuple[str, str, np.ndarray]] = [("x", "f4", pos[:, 0]), ("y", "f4", pos[:, 1]), ("z", "f4", pos[:, 2])]
    if col is not None:
        colour_code = "u1" if colour_type == "uchar" else "f4"
        if colour_type == "uchar":
            col = np.clip(np.round(col * 255), 0, 255)
        fields += [(c, colour_code, col[:, k]) for k, c in enumerate(("red", "green", "blue"))]
    if rad is not None:
        fields.append(("radius", "f4", rad))
    if opa is not None:
        fields.append(("opacity", "f4", opa))
    table = np.empty(n, np.dtype([(name, code) for name, code, _ in fields]))
    for name, _, values in fields:
        table[name] = values
    plyfile = _plyfile()
    vertex = plyfile.PlyElement.describe(table, "vertex")
    return plyfile.PlyData([vertex], text=not binary, byte_order="<", comments=["written by pulsar_py"])


def encode_ply(
    positions: torch.Tensor,
    colours: Optional[torch.Tensor] = None,
    radii: Optional[torch.Tensor] = None,
    opacity: Optional[torch.Tensor] = None,
    binary: bool = True,
    colour_type: str = "uchar",
) -> bytes:
    """The bytes of a PLY point cloud with one vertex per point.

    Args:
        positions: [N, 3] (written as float).
        colours: [N, 3] in [0, 1], or None; written as ``colour_type`` "uchar"
            (0..255, rounded) or "float".
        radii: [N] or None (property ``radius``, float).
        opacity: [N] or None (property ``opacity``, float).
        binary: binary little-endian (default) or ASCII.
    """
    buffer = io.BytesIO()
    _plydata(positions, colours, radii, opacity, binary, colour_type).write(buffer)
    return buffer.getvalue()


def write_ply(
    path: PathLike,
    positions: torch.Tensor,
    colours: Optional[torch.Tensor] = None,
    radii: Optional[torch.Tensor] = None,
    opacity: Optional[torch.Tensor] = None,
    binary: bool = True,
    colour_type: str = "uchar",
) -> None:
    """Write a point cloud to ``path`` (see ``encode_ply``); parent folders are created."""
    data = _plydata(positions, colours, radii, opacity, binary, colour_type)
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as f:
        data.write(f)


__all__ = [
    "PointCloud",
    "IgnoredElementsWarning",
    "read_ply",
    "decode_ply",
    "write_ply",
    "encode_ply",
    "gaussian_radius",
    "GAUSSIAN_RADIUS_FACTOR",
    "EXPECTED_LAYOUTS",
]
