"""benchmarks/profile: the A/B tool's checks of build folders, its summary of made-up
timings, its copy of the workload generator, and one real run over two package copies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import pulsar_py
from pulsar_py.tools import bench

PROFILE = Path(__file__).resolve().parents[2] / "benchmarks" / "profile"
sys.path.insert(0, str(PROFILE))
import ab  # noqa: E402
import harness  # noqa: E402


def _build(root: Path, name: str, content: bytes) -> str:
    package = root / name / "pulsar_py"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_native.cpython-312-x86_64-linux-gnu.so").write_bytes(content)
    return str(root / name)


def test_distinct_modules_pass(tmp_path):
    digests = harness.check_builds([_build(tmp_path, "a", b"one"), _build(tmp_path, "b", b"two")])
    assert len(set(digests)) == 2


def test_same_module_twice_is_refused(tmp_path):
    a, b = _build(tmp_path, "a", b"same"), _build(tmp_path, "b", b"same")
    with pytest.raises(ValueError, match="carry the same native module"):
        harness.check_builds([a, b])
    # An A/B of the Python package alone asks for exactly that ...
    assert len(set(harness.check_builds([a, b], same_native=True))) == 1
    # ... and refuses folders whose modules differ.
    c = _build(tmp_path, "c", b"other")
    with pytest.raises(ValueError, match="different native"):
        harness.check_builds([a, c], same_native=True)


def test_unusable_folders_are_refused(tmp_path):
    (tmp_path / "empty" / "pulsar_py").mkdir(parents=True)
    (tmp_path / "empty" / "pulsar_py" / "__init__.py").write_text("")
    with pytest.raises(ValueError, match="expected one pulsar_py/_native module, found none"):
        harness.module_digest(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="no pulsar_py package"):
        harness.module_digest(str(tmp_path))
    a = _build(tmp_path, "a", b"one")
    with pytest.raises(ValueError, match="named twice"):
        harness.check_builds([a, a + "/"])
    with pytest.raises(ValueError, match="at least two"):
        harness.check_builds([a])


def test_command_line_refuses_same_module(tmp_path, capsys):
    a, b = _build(tmp_path, "a", b"same"), _build(tmp_path, "b", b"same")
    with pytest.raises(SystemExit) as exit_info:
        ab.main(["--builds", a, b, "--workloads", "W3"])
    assert exit_info.value.code == 2
    assert "carry the same native module" in capsys.readouterr().err


def _child_result(times: dict) -> dict:
    """A child's result with times {workload: {variant: (fwd list, fwd+bwd list)}}."""
    return {
        "build": {"version": "x"},
        "workloads": {
            w: {v: {"fwd": f, "fwd+bwd": b} for v, (f, b) in variants.items()} for w, variants in times.items()
        },
    }


def test_summary_takes_medians_of_round_medians_and_ratios():
    runs = {
        "A": [
            _child_result({"W3": {"eager": ([1.0, 9.0, 2.0], [4.0, 4.0, 5.0])}}),
            _child_result({"W3": {"eager": ([3.0, 3.0, 3.0], [6.0, 6.0, 6.0])}}),
            _child_result({"W3": {"eager": ([4.0, 5.0, 4.0], [8.0, 7.0, 8.0])}}),
        ],
        "B": [
            _child_result({"W3": {"eager": ([1.0, 1.0, 1.0], [2.0, 2.0, 2.0]), "compiled": ([0.5], [1.0])}}),
            _child_result({"W3": {"eager": ([1.5, 2.0, 2.5], [3.0, 3.0, 9.0])}}),
        ],
    }
    rows = ab.summarise(runs, ["A", "B"], ["W3"])
    eager, compiled = rows
    assert (eager["workload"], eager["variant"], compiled["variant"]) == ("W3", "eager", "compiled")
    # Round medians A: 2, 3, 4 (fwd) and 4, 6, 8 (fwd+bwd); B: 1, 2 and 2, 3.
    assert eager["fwd"]["A"]["round_medians_ms"] == [2.0, 3.0, 4.0]
    assert eager["fwd"]["A"]["median_ms"] == 3.0
    assert eager["fwd"]["B"]["median_ms"] == 1.5
    assert eager["fwd"]["B"]["ratio_to_A"] == pytest.approx(0.5)
    assert eager["fwd+bwd"]["B"]["ratio_to_A"] == pytest.approx(2.5 / 6.0)
    # Paired by round (B ran two): B's 1 and 2 against A's 2 and 3; a tie is no win.
    assert eager["fwd"]["B"]["rounds_faster_than_A"] == [2, 2]
    # A variant only B ran has no figure for A and no ratio.
    assert compiled["fwd"]["A"]["median_ms"] is None
    assert compiled["fwd"]["B"]["ratio_to_A"] is None
    table = ab.format_table(rows, ["A", "B"])
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["workload", "A", "fwd", "ms"]
    assert "B/A fwd+bwd" in lines[0]
    assert lines[2].split() == ["W3", "3.000", "1.500", "0.500", "[2/2]", "6.000", "2.500", "0.417", "[2/2]"]
    assert lines[3].split() == ["W3", "compiled", "-", "0.500", "-", "-", "1.000", "-"]


def test_round_wins_count_only_rounds_where_the_later_build_is_faster():
    runs = {
        "A": [_child_result({"W3": {"eager": ([2.0], [5.0])}}) for _ in range(3)],
        "B": [_child_result({"W3": {"eager": ([t], [5.0])}}) for t in (1.0, 2.0, 3.0)],
    }
    eager = ab.summarise(runs, ["A", "B"], ["W3"])[0]
    assert eager["fwd"]["B"]["rounds_faster_than_A"] == [1, 3]
    assert eager["fwd+bwd"]["B"]["rounds_faster_than_A"] == [0, 3]


def test_host_times_are_summarised_like_the_event_spans():
    """CUDA rounds carry each call's host time beside its event span; the host table
    summarises those, and a round without them (an older child) counts as none."""

    def run(fwd_host, fwd_bwd_host):
        times = {"fwd": [1.0], "fwd+bwd": [2.0]}
        if fwd_host is not None:
            times.update({"fwd host": fwd_host, "fwd+bwd host": fwd_bwd_host})
        return {"build": {"version": "x"}, "workloads": {"W3": {"eager": times}}}

    runs = {"A": [run([0.4, 0.2, 0.3], [0.9]), run(None, None)], "B": [run([0.2], [0.6]), run([0.1], [0.3])]}
    eager = ab.summarise(runs, ["A", "B"], ["W3"], ab.HOST_MODES)[0]
    assert eager["fwd host"]["A"]["round_medians_ms"] == [pytest.approx(0.3)]
    assert eager["fwd host"]["B"]["median_ms"] == pytest.approx(0.15)
    assert eager["fwd+bwd host"]["B"]["ratio_to_A"] == pytest.approx(0.45 / 0.9)
    header = ab.format_table([eager], ["A", "B"], ab.HOST_MODES).splitlines()[0]
    assert "A fwd host ms" in header and "B/A fwd+bwd host" in header


def test_kernel_summary_counts_missing_kernels_as_zero():
    def run(kernels):
        return {"workloads": {"W4": {"eager": {"fwd": [1.0], "fwd+bwd": [1.0], "kernels": kernels}}}}

    runs = {
        "A": [run({"render": [1.0, 1.0], "sort": [0.2, 4.0]}), run({"render": [3.0, 1.0]})],
        "B": [run({"render": [0.5, 1.0], "sort": [0.2, 4.0]}), run({"render": [0.7, 1.0], "sort": [0.4, 4.0]})],
    }
    table = ab.summarise_kernels(runs, ["A", "B"], "W4")
    assert table["render"] == {"A": 2.0, "B": pytest.approx(0.6)}
    assert table["sort"] == {"A": pytest.approx(0.1), "B": pytest.approx(0.3)}
    text = ab.format_kernel_table(table, ["A", "B"])
    assert text.splitlines()[-1].split() == ["sum", "2.100", "0.900", "0.429"]


def test_kernel_names_are_grouped_by_base_name():
    assert harness.kernel_base_name("void ns::render_forward_kernel<float, 3>(Args)") == "render_forward_kernel"
    assert harness.kernel_base_name("ns::(anonymous namespace)::maps_kernel(long, int const*)") == "maps_kernel"
    assert harness.kernel_base_name("Memset (Device)") == "Memset"
    assert harness.kernel_base_name("plain_kernel") == "plain_kernel"


def test_tool_draws_the_drivers_spheres():
    """The tool's copy of the generator (it cannot import the driver from a build under
    test) draws what the driver draws, for every standard workload."""
    for name, w in bench.WORKLOADS.items():
        mine = harness.WORKLOADS[name]
        assert (
            mine.n_spheres,
            mine.width,
            mine.height,
            mine.radius_scale,
            mine.radius_offset,
            mine.opacity_range,
            mine.views,
        ) == (w.n_spheres, w.width, w.height, w.radius_scale, w.radius_offset, w.opacity_range, w.views), name
        small = bench.Workload(
            name,
            w.label,
            500,
            w.width,
            w.height,
            w.radius_scale,
            w.radius_offset,
            w.opacity_range,
            w.views,
            w.reference,
        )
        theirs = bench.make_inputs(small, torch.device("cpu"))
        ours = harness.make_inputs(
            harness.Workload(name, 500, w.width, w.height, w.radius_scale, w.radius_offset, w.opacity_range, w.views),
            torch.device("cpu"),
        )
        for a, b in zip(ours, [theirs.positions, theirs.colours, theirs.radii, theirs.opacity, theirs.cam_params]):
            assert (a is None and b is None) or torch.equal(a, b), name
    assert set(bench.WORKLOADS) <= set(harness.WORKLOADS)


def test_ab_runs_two_package_copies(tmp_path):
    """One round over two copies of this package (one native module: --same-native) on
    the one-sphere workload: each child imports its own copy, and the JSON holds both."""
    source = Path(pulsar_py.__file__).resolve().parent
    # An editable install keeps the native module in its build folder, not in the package.
    native = Path(pulsar_py._native.__file__).resolve()
    builds = []
    for name in ("a", "b"):
        copy = tmp_path / name / "pulsar_py"
        shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
        if not (copy / native.name).exists():
            shutil.copy2(native, copy / native.name)
        builds.append(str(tmp_path / name))
    out = tmp_path / "ab.json"
    core = min(os.sched_getaffinity(0))  # every child pinned to one core the test may use
    done = subprocess.run(
        [
            sys.executable,
            str(PROFILE / "ab.py"),
            "--builds",
            *builds,
            "--same-native",
            "--device",
            "cpu",
            "--workloads",
            "tiny",
            "--rounds",
            "1",
            "--repeats",
            "2",
            "--cpus",
            str(core),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["settings"]["cpus"] == [core]
    assert [b["description"]["file"] for b in report["builds"]] == [str(Path(b, "pulsar_py")) for b in builds]
    row = report["rows"][0]
    assert row["workload"] == "tiny" and len(row["fwd"]["A"]["round_medians_ms"]) == 1
    assert row["fwd+bwd"]["B"]["ratio_to_A"] > 0
    assert "B/A fwd" in done.stdout
