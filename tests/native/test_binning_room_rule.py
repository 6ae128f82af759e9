"""The rule by which an eager CUDA binning gets room for its lists (native/core/
binning_room.h, docs/design.md "Where the host waits"), run on call sequences by a small
C++ harness (tests/native/binning_room/check.cpp, built here with the system C++
compiler): a scene that keeps its size bins in exactly its count after its first call; a
scene that alternates between sizes more than a factor 2 apart never bins twice in one
call nor sorts more than its count; one that grows slowly keeps fitting its room; one
that jumps bins twice once. The results of every path are the same bit for bit
(tests/native/test_binning_room.py, on a GPU); this is what each path costs."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import build_cxx_check, run_cxx_check

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).resolve().parent / "binning_room" / "check.cpp"


@pytest.fixture(scope="module")
def check_exe(tmp_path_factory) -> Path:
    return build_cxx_check(tmp_path_factory, SOURCE, ROOT / "native", "binning room check")


def run(exe: Path, counts: list[int]) -> list[tuple[int, str, int]]:
    """(room given, path, padding) per call of the count sequence."""
    out = run_cxx_check(exe, *counts)
    rows = [line.split() for line in out.splitlines()]
    assert len(rows) == len(counts), out
    return [(int(given), path, int(padding)) for given, path, padding in rows]


def test_a_scene_that_keeps_its_size_bins_in_exactly_its_count(check_exe):
    calls = run(check_exe, [5000] * 6)
    assert calls[0] == (0, "count", 0)
    assert calls[1:] == [(5000, "room", 0)] * 5


def test_sizes_more_than_twice_apart_read_their_count_first(check_exe):
    calls = run(check_exe, [1000, 3000] * 5)
    assert calls[1][1] == "again"  # the one jump the rule cannot foresee
    assert all(path == "count" for _, path, _ in calls[2:])


def test_sizes_within_a_factor_two_share_one_room(check_exe):
    counts = [1000, 1500] * 5
    calls = run(check_exe, counts)
    assert [path for _, path, _ in calls[2:]] == ["room"] * 8
    for count, (given, _, padding) in zip(counts[2:], calls[2:]):
        assert given >= count and padding == given - count
        assert given <= 1.125 * 1500


def test_a_slowly_growing_scene_keeps_fitting_its_room(check_exe):
    counts = [int(10_000 * 1.02**i) for i in range(40)]
    calls = run(check_exe, counts)
    assert calls[1][1] == "again"  # one count is no trend: its room is exactly that count
    assert all(path == "room" for _, path, _ in calls[2:])
    assert all(padding <= count // 6 for count, (_, _, padding) in zip(counts, calls))


def test_a_jump_bins_twice_once_then_fits(check_exe):
    calls = run(check_exe, [4000, 4000, 8000, 8000, 8000, 2000, 2000, 2000])
    assert [path for _, path, _ in calls] == ["count", "room", "again", "room", "room", "room", "count", "room"]
    assert calls[3] == (9000, "room", 1000)  # after growing: an eighth more
    assert calls[4] == (8000, "room", 0)  # kept its size: exactly
    assert calls[5] == (8000, "room", 6000)  # a drop is sorted with padding once
    assert calls[7] == (2000, "room", 0)


def test_after_an_empty_scene_the_count_is_read_first(check_exe):
    assert run(check_exe, [0, 0, 7, 7, 7, 0, 7]) == [
        (0, "count", 0),
        (0, "count", 0),
        (0, "count", 0),  # after an empty scene
        (0, "count", 0),  # 0 and 7 are more than a factor 2 apart
        (7, "room", 0),
        (7, "room", 7),
        (0, "count", 0),
    ]
