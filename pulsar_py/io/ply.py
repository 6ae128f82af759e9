"""PLY point clouds: read and write positions, colours, radii and opacities.

Reads ASCII, binary little-endian and binary big-endian PLY files (numpy does the binary
decoding; the header is parsed here). From the ``vertex`` element it takes

* ``x, y, z`` (required);
* colours from ``red, green, blue`` (also ``r, g, b`` or ``diffuse_red`` ...): integer
  types are scaled to [0, 1] by their maximum (255 for uchar), floats are taken as is;
* a radius from ``radius`` or ``scale`` (one value per point, world units);
* an opacity from ``opacity`` or ``alpha`` (integers scaled like colours).

Other elements (faces, ...) are skipped. ``write_ply`` writes the same properties, so a
point cloud round-trips.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple, Union

import numpy as np
import torch

PathLike = Union[str, "os.PathLike[str]"]

# PLY scalar type names -> numpy type codes (without byte order).
_TYPES: Dict[str, str] = {
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
}
_FORMATS = {"ascii": None, "binary_little_endian": "<", "binary_big_endian": ">"}
_COLOUR_NAMES: Tuple[Tuple[str, str, str], ...] = (
    ("red", "green", "blue"), ("r", "g", "b"), ("diffuse_red", "diffuse_green", "diffuse_blue"))
_RADIUS_NAMES = ("radius", "scale")
_OPACITY_NAMES = ("opacity", "alpha")


@dataclass
class PointCloud:
    """A point cloud as float32 CPU tensors.

    Attributes:
        positions: [N, 3] world coordinates.
        colours: [N, 3] RGB in [0, 1], or None when the file has no colours.
        radii: [N] sphere radii (world units), or None.
        opacity: [N] opacities, or None.
    """

    positions: torch.Tensor
    colours: Optional[torch.Tensor] = None
    radii: Optional[torch.Tensor] = None
    opacity: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return int(self.positions.shape[0])


@dataclass
class _Property:
    name: str
    type: str                       # numpy code of the value (or of the list items)
    count_type: Optional[str] = None  # numpy code of a list's length; None for scalars


@dataclass
class _Element:
    name: str
    count: int
    properties: List[_Property]


def _parse_header(data: bytes) -> Tuple[str, List[_Element], int]:
    """(format, elements, byte offset of the body)."""
    if not data.startswith(b"ply"):
        raise ValueError("ply: not a PLY file (it must start with 'ply')")
    end = data.find(b"end_header")
    if end < 0:
        raise ValueError("ply: no 'end_header' line in the header")
    body = data.index(b"\n", end) + 1
    lines = data[:end].decode("ascii", errors="replace").splitlines()[1:]
    fmt, elements = None, []
    for number, raw in enumerate(lines, start=2):
        words = raw.split()
        if not words or words[0] in ("comment", "obj_info"):
            continue
        if words[0] == "format":
            if len(words) < 2 or words[1] not in _FORMATS:
                raise ValueError(f"ply: header line {number}: expected format ascii, binary_little_endian "
                                 f"or binary_big_endian, got {raw.strip()!r}")
            fmt = words[1]
        elif words[0] == "element":
            if len(words) != 3 or not words[2].isdigit():
                raise ValueError(f"ply: header line {number}: expected 'element NAME COUNT', got {raw.strip()!r}")
            elements.append(_Element(words[1], int(words[2]), []))
        elif words[0] == "property":
            if not elements:
                raise ValueError(f"ply: header line {number}: property before any element")
            if len(words) == 5 and words[1] == "list" and words[2] in _TYPES and words[3] in _TYPES:
                elements[-1].properties.append(_Property(words[4], _TYPES[words[3]], _TYPES[words[2]]))
            elif len(words) == 3 and words[1] in _TYPES:
                elements[-1].properties.append(_Property(words[2], _TYPES[words[1]]))
            else:
                raise ValueError(f"ply: header line {number}: unknown property declaration {raw.strip()!r}")
        else:
            raise ValueError(f"ply: header line {number}: unknown keyword {words[0]!r}")
    if fmt is None:
        raise ValueError("ply: no 'format' line in the header")
    return fmt, elements, body


def _skip_list_element_binary(data: bytes, pos: int, element: _Element, order: str) -> int:
    """Byte offset after an element with list properties (walked row by row)."""
    for _ in range(element.count):
        for prop in element.properties:
            if prop.count_type is None:
                pos += np.dtype(prop.type).itemsize
            else:
                count_dtype = np.dtype(order + prop.count_type)
                n = int(np.frombuffer(data, count_dtype, 1, pos)[0])
                pos += count_dtype.itemsize + n * np.dtype(prop.type).itemsize
    return pos


def _read_vertices(data: bytes) -> Tuple[Dict[str, np.ndarray], Dict[str, str]]:
    """The vertex element's scalar properties: {name: [N] array}, {name: numpy type code}."""
    fmt, elements, pos = _parse_header(data)
    order = _FORMATS[fmt]
    names = [e.name for e in elements]
    if "vertex" not in names:
        raise ValueError(f"ply: expected a 'vertex' element, got elements {names}")
    if fmt == "ascii":
        lines = data[pos:].decode("ascii", errors="replace").splitlines()
        lines = [line for line in lines if line.strip()]
        row = 0
        for element in elements:
            if element.name != "vertex":
                row += element.count
                continue
            rows = lines[row:row + element.count]
            if len(rows) != element.count:
                raise ValueError(f"ply: expected {element.count} vertex lines, got {len(rows)}")
            if any(p.count_type is not None for p in element.properties):
                raise ValueError("ply: list properties in the vertex element are not supported")
            try:
                table = np.array([line.split() for line in rows], dtype=np.float64)
                if not rows:
                    table = table.reshape(0, len(element.properties))
            except ValueError as exc:
                raise ValueError(f"ply: vertex lines must hold {len(element.properties)} numbers each: {exc}") from None
            if table.ndim != 2 or table.shape[1] != len(element.properties):
                raise ValueError(f"ply: expected {len(element.properties)} numbers per vertex line, "
                                 f"got lines of shape {table.shape}")
            return ({p.name: table[:, k] for k, p in enumerate(element.properties)},
                    {p.name: p.type for p in element.properties})
    for element in elements:
        has_lists = any(p.count_type is not None for p in element.properties)
        if element.name == "vertex":
            if has_lists:
                raise ValueError("ply: list properties in the vertex element are not supported")
            dtype = np.dtype([(p.name, order + p.type) for p in element.properties])
            if pos + dtype.itemsize * element.count > len(data):
                raise ValueError(f"ply: file too short for {element.count} vertices of {dtype.itemsize} bytes")
            table = np.frombuffer(data, dtype, element.count, pos)
            return ({p.name: table[p.name] for p in element.properties},
                    {p.name: p.type for p in element.properties})
        if has_lists:
            pos = _skip_list_element_binary(data, pos, element, order)
        else:
            pos += element.count * sum(np.dtype(p.type).itemsize for p in element.properties)
    raise AssertionError("unreachable")


def _unit_scale(values: np.ndarray, type_code: str) -> np.ndarray:
    """Integer channels to [0, 1] by the type's maximum; floats unchanged."""
    if type_code[0] in "iu":
        return values.astype(np.float64) / float(np.iinfo(np.dtype(type_code)).max)
    return values.astype(np.float64)


def decode_ply(data: bytes) -> PointCloud:
    """Parse the bytes of a PLY file (see the module docstring for what is read)."""
    props, types = _read_vertices(data)
    missing = [axis for axis in "xyz" if axis not in props]
    if missing:
        raise ValueError(f"ply: vertex element needs properties x, y, z; missing {', '.join(missing)} "
                         f"(has {', '.join(props)})")

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

    positions = tensor(np.stack([props[a] for a in "xyz"], axis=-1))
    colours = None
    for names in _COLOUR_NAMES:
        if all(n in props for n in names):
            colours = tensor(np.stack([_unit_scale(props[n], types[n]) for n in names], axis=-1))
            break
    radii = next((tensor(props[n]) for n in _RADIUS_NAMES if n in props), None)
    opacity = next((tensor(_unit_scale(props[n], types[n])) for n in _OPACITY_NAMES if n in props), None)
    return PointCloud(positions, colours, radii, opacity)


def read_ply(path: PathLike) -> PointCloud:
    """Read a PLY point cloud (ascii or binary; see ``decode_ply``)."""
    with open(path, "rb") as f:
        return decode_ply(f.read())


def _column(name: str, t: Optional[torch.Tensor], n: int, width: int) -> Optional[np.ndarray]:
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor or None, got {type(t).__name__}")
    expected = (n,) if width == 1 else (n, width)
    if tuple(t.shape) != expected:
        raise ValueError(f"{name}: expected shape {expected}, got {tuple(t.shape)}")
    return t.detach().cpu().double().numpy()


def encode_ply(positions: torch.Tensor, colours: Optional[torch.Tensor] = None,
               radii: Optional[torch.Tensor] = None, opacity: Optional[torch.Tensor] = None,
               binary: bool = True, colour_type: str = "uchar") -> bytes:
    """The bytes of a PLY file with one vertex per point.

    Args:
        positions: [N, 3] (written as float).
        colours: [N, 3] in [0, 1], or None; written as ``colour_type`` "uchar"
            (0..255, rounded) or "float".
        radii: [N] or None (property ``radius``, float).
        opacity: [N] or None (property ``opacity``, float).
        binary: binary little-endian (default) or ASCII.
    """
    if not isinstance(positions, torch.Tensor) or positions.dim() != 2 or positions.shape[1] != 3:
        raise ValueError(f"positions: expected a tensor of shape [N, 3], got "
                         f"{tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__}")
    if colour_type not in ("uchar", "float"):
        raise ValueError(f"colour_type: expected 'uchar' or 'float', got {colour_type!r}")
    n = int(positions.shape[0])
    pos = positions.detach().cpu().double().numpy()
    col = _column("colours", colours, n, 3)
    rad = _column("radii", radii, n, 1)
    opa = _column("opacity", opacity, n, 1)
    fields: List[Tuple[str, str, np.ndarray]] = [("x", "float", pos[:, 0]), ("y", "float", pos[:, 1]),
                                                 ("z", "float", pos[:, 2])]
    if col is not None:
        if colour_type == "uchar":
            col = np.clip(np.round(col * 255), 0, 255)
        fields += [(c, colour_type, col[:, k]) for k, c in enumerate(("red", "green", "blue"))]
    if rad is not None:
        fields.append(("radius", "float", rad))
    if opa is not None:
        fields.append(("opacity", "float", opa))
    header = ["ply", f"format {'binary_little_endian' if binary else 'ascii'} 1.0",
              "comment written by pulsar_py", f"element vertex {n}"]
    header += [f"property {kind} {name}" for name, kind, _ in fields]
    header.append("end_header")
    head = ("\n".join(header) + "\n").encode("ascii")
    if binary:
        dtype = np.dtype([(name, "<" + _TYPES[kind]) for name, kind, _ in fields])
        table = np.empty(n, dtype)
        for name, _, values in fields:
            table[name] = values
        return head + table.tobytes()
    columns = [values.astype(np.int64).astype(str) if kind == "uchar" else np.char.mod("%.9g", values)
               for _, kind, values in fields]
    rows = [" ".join(items) for items in zip(*columns)] if n else []
    return head + ("\n".join(rows) + ("\n" if rows else "")).encode("ascii")


def write_ply(path: PathLike, positions: torch.Tensor, colours: Optional[torch.Tensor] = None,
              radii: Optional[torch.Tensor] = None, opacity: Optional[torch.Tensor] = None,
              binary: bool = True, colour_type: str = "uchar") -> None:
    """Write a point cloud to ``path`` (see ``encode_ply``); parent folders are created."""
    data = encode_ply(positions, colours, radii, opacity, binary, colour_type)
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
