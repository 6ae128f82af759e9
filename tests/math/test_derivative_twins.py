"""Every derivative twin of include/pulsar against central finite differences (float64).

The headers hold host+device math with each forward function's derivative twin beside it.
A small C++ harness (tests/math/twins/, built here with the system C++ compiler: no torch,
no hook in the renderer's module) evaluates each twin in vector-Jacobian form, J^T g for a
random upstream g, at random points of each branch of the forward function (away from
its kinks: the harness stops if a stencil crosses a branch), next to the fourth-order
central difference of <g, f>. Here:

* each twin agrees with the finite difference, component by component, to RTOL relative
  to the component, with a floor of FLOOR times the gradient's largest component;
* each branch named by a twin's entry is the one its points lie on, and the entries that
  vary a branch per point (handedness, projection, camera conventions) cover them all;
* the comparison catches a wrong twin: a second build of the harness adds 1e-3 of the
  largest component to one component of the twin named on its command line, and every
  point of that twin must then fail while all other twins still pass;
* the harness's table lists the twins this file expects, and every function of the
  headers that is named as a derivative (…_backward, …_grad…) and every operation of
  the dual numbers is exercised by an entry.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import cxx_compiler

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "include"
TWINS_SRC = Path(__file__).resolve().parent / "twins"

# Agreement: |twin_i - fd_i| <= RTOL (|fd_i| + FLOOR max_j |fd_j|). Over 41 seeds of the
# harness the worst error in this measure is 1.5e-8 (a perspective pair: the chord
# c - t d is formed from vectors of length t up to 30); a perturbation of 1e-3 of the
# largest component gives 5e-4 or more.
RTOL = 1e-6
FLOOR = 1e-3

# The harness's table: "header/twin[/branch]".
EXPECTED_TWINS = [
    "vec3/cross_backward",
    "vec3/normalize_backward",
    "dual/add",
    "dual/subtract",
    "dual/multiply",
    "dual/divide",
    "dual/negate",
    "dual/add_assign",
    "dual/subtract_assign",
    "dual/add_constant",
    "dual/constant_add",
    "dual/subtract_constant",
    "dual/constant_subtract",
    "dual/multiply_constant",
    "dual/constant_multiply",
    "dual/divide_constant",
    "dual/constant_divide",
    "dual/sqrt",
    "dual/sin",
    "dual/cos",
    "intersection/finish_hit_backward/hit",
    "intersection/finish_hit_backward/tiny_inside",
    "intersection/finish_hit_backward/tiny_outside",
    "intersection/intersect_perspective_backward/hit",
    "intersection/intersect_perspective_backward/tiny_inside",
    "intersection/intersect_perspective_backward/tiny_outside",
    "intersection/intersect_orthographic_backward/hit_front",
    "intersection/intersect_orthographic_backward/hit_behind",
    "intersection/intersect_orthographic_backward/tiny_inside",
    "intersection/intersect_orthographic_backward/tiny_outside",
    "blend/normalized_depth_grad",
    "blend/blend_exponent_grad_opacity",
    "blend/blend_exponent_grad_depth",
    "blend/DepthRangeSums/normalized_depth",
    "blend/DepthRangeSums/blend_exponent",
    "blend/weight_grad",
    "blend/depth_grad",
    "camera/frame_backward",
    "camera/add_sensor_offset",
    "pixel_ray/pixel_ray/perspective",
    "pixel_ray/pixel_ray/orthographic",
    "camera_params/packed_camera_from_params_backward/L8",
    "camera_params/packed_camera_from_params_backward/L10",
    "camera_params/packed_camera_from_params_backward/L11",
    "camera_params/packed_camera_from_params_backward/L13",
    "camera_params/packed_camera_from_params_backward/L8_small_angle",
    "camera_params/packed_camera_from_params_backward/L10_small_angle",
    "camera_params/packed_camera_from_params_backward/L13_chunk1",
    "camera_params/packed_camera_from_params_backward/L10_chunk4",
]

# Header functions named as derivatives that no entry names, and the entries that run them.
COVERED_INSIDE = {
    "finish_hit_grads": "finish_hit_backward, intersect_perspective_backward",
    "packed_camera_from_params_backward_run": "packed_camera_from_params_backward",
    "unit_vector_backward": "normalize_backward",
}


def expected_branches(name: str) -> set[str]:
    """The branches the points of a twin must lie on, all of them covered."""
    parts = name.split("/")
    if parts[0] == "intersection":
        return {parts[2]}
    if parts[0] in ("camera", "pixel_ray") and parts[1] in ("frame_backward", "pixel_ray"):
        return {"left_handed", "right_handed"}
    if parts[0] == "camera_params":
        length = int(re.match(r"L(\d+)", parts[2]).group(1))
        rotation = ""
        if length in (8, 10):
            rotation = ",series" if parts[2].endswith("_small_angle") else ",closed_form"
        return {
            f"{projection},{hand},{order},{near}{rotation}"
            for projection in ("perspective", "orthographic")
            for hand in ("left_handed", "right_handed")
            for order in ("T_then_R", "R_then_T")
            for near in ("near_default", "near_given")
        }
    return {"-"}


@dataclass
class Point:
    name: str
    index: int
    branch: str
    twin: list[float]
    fd: list[float]


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> dict[str, Path]:
    """The harness built twice: "plain", and "perturbing" (PULSAR_TWINS_PERTURB)."""
    cxx = cxx_compiler()
    if cxx is None:
        pytest.skip("no C++ compiler (CXX, c++, g++ or clang++) on PATH to build the twin harness")
    out = tmp_path_factory.mktemp("twins")
    flags = ["-std=c++17", "-O1", f"-I{INCLUDE}", f"-I{TWINS_SRC}"]
    objects = {
        "twins.o": [TWINS_SRC / "twins.cpp"],
        "harness.o": [TWINS_SRC / "harness.cpp"],
        "harness_perturbing.o": ["-DPULSAR_TWINS_PERTURB", TWINS_SRC / "harness.cpp"],
    }
    jobs = [
        (
            obj,
            subprocess.Popen(
                [cxx, *flags, "-c", *map(str, args), "-o", str(out / obj)],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            ),
        )
        for obj, args in objects.items()
    ]
    for obj, job in jobs:
        log, _ = job.communicate()
        assert job.returncode == 0, f"compiling {obj} failed:\n{log}"
    exes = {"plain": out / "harness", "perturbing": out / "harness_perturbing"}
    for kind, main in (("plain", "harness.o"), ("perturbing", "harness_perturbing.o")):
        link = subprocess.run(
            [cxx, str(out / "twins.o"), str(out / main), "-o", str(exes[kind])], capture_output=True, text=True
        )
        assert link.returncode == 0, f"linking the {kind} harness failed:\n{link.stderr}"
    return exes


def run_harness(exe: Path, *args: str) -> dict[str, list[Point]]:
    done = subprocess.run([str(exe), *args], capture_output=True, text=True)
    assert done.returncode == 0, f"{exe.name} {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    points: dict[str, list[Point]] = {}
    for line in done.stdout.splitlines():
        name, index, branch, twin, fd = line.split("\t")
        points.setdefault(name, []).append(
            Point(name, int(index), branch, [float(v) for v in twin.split(",")], [float(v) for v in fd.split(",")])
        )
    return points


@pytest.fixture(scope="module")
def results(harness) -> dict[str, list[Point]]:
    return run_harness(harness["plain"])


def relative_errors(point: Point) -> list[float]:
    scale = max(abs(v) for v in point.fd)
    return [
        abs(t - f) / (abs(f) + FLOOR * scale) if (abs(f) + scale) > 0 else abs(t) for t, f in zip(point.twin, point.fd)
    ]


def assert_agrees(point: Point) -> float:
    """Asserts that the twin matches the finite difference at the point; returns the error."""
    errors = relative_errors(point)
    worst = max(range(len(errors)), key=errors.__getitem__)
    assert errors[worst] <= RTOL, (
        f"{point.name}, point {point.index} (branch {point.branch}): input {worst}: twin "
        f"{point.twin[worst]!r}, finite difference {point.fd[worst]!r}: relative error "
        f"{errors[worst]:.3g} > {RTOL:g}"
    )
    return errors[worst]


def test_table_lists_the_expected_twins(harness):
    listed = subprocess.run([str(harness["plain"]), "--list"], capture_output=True, text=True, check=True)
    names = [line.split("\t")[0] for line in listed.stdout.splitlines()]
    assert names == EXPECTED_TWINS


def test_every_header_twin_has_an_entry():
    """Functions named as derivatives in the headers, and the dual numbers' operations."""
    named = set()
    for header in sorted((INCLUDE / "pulsar").glob("*.h")):
        text = header.read_text()
        named |= set(re.findall(r"PULSAR_HD\b[^;{()]*?\b(\w*(?:backward|_grad)\w*)\s*\(", text))
    assert named, "no derivative found in the headers: the pattern no longer matches them"
    entries = {name.split("/")[1] for name in EXPECTED_TWINS}
    missing = sorted(n for n in named if n not in entries and n not in COVERED_INSIDE)
    assert not missing, f"twins without a finite-difference entry: {missing}"
    assert set(COVERED_INSIDE) <= named, "COVERED_INSIDE names a function the headers lost"
    dual = (INCLUDE / "pulsar" / "dual.h").read_text()
    rules = re.findall(r"PULSAR_HD\s+Dual<T, N>&?\s+(operator\S+|sqrt|sin|cos)\s*\(", dual)
    dual_entries = [name for name in EXPECTED_TWINS if name.startswith("dual/")]
    assert len(rules) == len(dual_entries) == 18, (rules, dual_entries)


@pytest.mark.parametrize("name", EXPECTED_TWINS)
def test_twin_matches_finite_differences(results, name):
    points = results[name]
    assert len(points) >= 8
    for point in points:
        assert_agrees(point)
    seen = {point.branch for point in points}
    assert seen == expected_branches(name), f"{name}: branches {sorted(seen)}"


@pytest.mark.parametrize("name", EXPECTED_TWINS)
def test_perturbed_twin_fails(harness, name):
    perturbed = run_harness(harness["perturbing"], "--perturb", name)
    assert set(perturbed) == set(EXPECTED_TWINS)
    for point in perturbed[name]:
        with pytest.raises(AssertionError, match="relative error"):
            assert_agrees(point)
    for other, points in perturbed.items():
        if other != name:
            for point in points:
                assert_agrees(point)


def test_only_the_perturbing_build_perturbs(harness):
    done = subprocess.run([str(harness["plain"]), "--perturb", EXPECTED_TWINS[0]], capture_output=True, text=True)
    assert done.returncode == 2 and "PULSAR_TWINS_PERTURB" in done.stderr
