"""The cone's row columns (include/pulsar/cone_rows.h), which the CUDA two-pixel forward
takes an entry's pixel coverage from, and the rectangle of a tile's part of a box that
holds them (ConeRows::bounds_within, the pixels the CUDA backward walks), hold every
pixel the pair test hits.

A small C++ harness (tests/native/cone_rows/check.cpp, built here with the system C++
compiler) renders random perspective cameras and spheres (projected radii 0.2 to 200
pixels, the tiny-sphere rule included) pixel by pixel over each sphere's screen box, in
float32 and float64, and counts the hits that fall outside their row's columns and
outside their 16x16 tile's rectangle:

* none may (columns and rectangles are supersets of the hits, whatever the rounding);
* they leave out a share of the box (otherwise the kernels would gain nothing);
* narrowed by one pixel on each side, they lose hits: the check can fail.

PULSAR_TEST_CONE_SPHERES sizes the run (spheres per seed, default 4000: about a second).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import build_cxx_check, run_cxx_check

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).resolve().parent / "cone_rows" / "check.cpp"
SPHERES = int(os.environ.get("PULSAR_TEST_CONE_SPHERES", "4000"))
SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def check_exe(tmp_path_factory) -> Path:
    return build_cxx_check(tmp_path_factory, SOURCE, ROOT / "include", "cone check")


def run_check(exe: Path, seed: int, shrink: float = 0.0) -> dict[str, dict[str, int]]:
    out = run_cxx_check(exe, "--seed", seed, "--spheres", SPHERES, "--shrink", shrink)
    fields = (
        "spheres",
        "active",
        "box_pixels",
        "kept_pixels",
        "hits",
        "misses_outside",
        "rect_pixels",
        "misses_outside_rect",
    )
    rows = {}
    for line in out.splitlines():
        dtype, *values = line.split()
        rows[dtype] = dict(zip(fields, map(int, values)))
    assert set(rows) == {"float32", "float64"}, out
    return rows


@pytest.mark.parametrize("seed", SEEDS)
def test_every_hit_lies_in_its_rows_columns(check_exe, seed):
    for dtype, row in run_check(check_exe, seed).items():
        assert row["active"] > 0.9 * row["spheres"] > 0, (dtype, row)
        assert row["hits"] > 0, (dtype, row)
        assert row["misses_outside"] == 0, (dtype, row)
        assert row["misses_outside_rect"] == 0, (dtype, row)
        # A disc fills pi/4 of its square; the columns' slack keeps a little more. A
        # tile's rectangle keeps the misses between its rows' columns.
        assert row["kept_pixels"] < 0.9 * row["box_pixels"], (dtype, row)
        assert row["kept_pixels"] <= row["rect_pixels"] < 0.97 * row["box_pixels"], (dtype, row)


def test_narrower_columns_lose_hits(check_exe):
    for dtype, row in run_check(check_exe, SEEDS[0], shrink=1.0).items():
        assert row["misses_outside"] > 0, (dtype, row)
        assert row["misses_outside_rect"] > 0, (dtype, row)
