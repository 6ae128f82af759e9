"""The command line (pulsar-py, python -m pulsar_py) and the benchmark driver's inputs."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

import pulsar_py
from pulsar_py.cameras.params import camera_from_params
from pulsar_py.io.images import read_image
from pulsar_py.tools import bench
from pulsar_py.tools.cli import main
from pulsar_py.tools.sample_scene import make_sample_scene

SMALL = ["--width", "64", "--height", "48", "--spheres", "600"]


def _env_for(package) -> dict:
    """Environment in which a child Python imports the same pulsar_py as this one."""
    env = dict(os.environ)
    root = str(Path(package.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_module_sample_writes_a_png_of_the_scene(tmp_path):
    out = tmp_path / "out" / "sample.png"
    done = subprocess.run(
        [sys.executable, "-m", "pulsar_py", "sample", "--out", str(out), *SMALL],
        cwd=tmp_path,
        env=_env_for(pulsar_py),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout and " ms" in done.stdout
    image = read_image(out)
    assert image.shape == (48, 64, 3) and image.dtype == torch.uint8
    scene = make_sample_scene(64, 48, n_spheres=600)
    background = (scene.bg_col * 255).round().to(torch.uint8)
    is_background = (image.int() - background.int()).abs().amax(-1) <= 1
    # The corners show the background; the knot covers a good part of the image in
    # many colours (a rainbow along the knot).
    assert bool(is_background[0, 0]) and bool(is_background[-1, -1])
    covered = float((~is_background).float().mean())
    assert 0.15 < covered < 0.9, covered
    object_pixels = image[~is_background].int()
    distinct_hues = torch.unique(object_pixels.argmax(-1)).numel()
    assert distinct_hues == 3
    assert int(object_pixels.amax()) > 150


def test_sample_is_deterministic(tmp_path):
    paths = [tmp_path / "a.png", tmp_path / "b.png"]
    for p in paths:
        assert main(["sample", "--out", str(p), *SMALL]) == 0
    assert paths[0].read_bytes() == paths[1].read_bytes()


def test_sample_writes_jpeg_for_a_jpg_name(tmp_path):
    png, jpg = tmp_path / "s.png", tmp_path / "s.jpg"
    assert main(["sample", "--out", str(png), *SMALL]) == 0
    assert main(["sample", "--out", str(jpg), *SMALL]) == 0
    assert jpg.read_bytes()[:3] == b"\xff\xd8\xff" and png.read_bytes()[:4] == b"\x89PNG"
    # The same picture, up to JPEG's losses.
    difference = (read_image(jpg).float() - read_image(png).float()).abs()
    assert read_image(jpg).shape == (48, 64, 3) and float(difference.mean()) < 8.0


def test_version(tmp_path, capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"pulsar_py {pulsar_py.__version__}"
    done = subprocess.run(
        [sys.executable, "-m", "pulsar_py", "--version"],
        cwd=tmp_path,
        env=_env_for(pulsar_py),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"pulsar_py {pulsar_py.__version__}"


def test_help_names_the_program_as_invoked(tmp_path, capsys):
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: pulsar-py ")
    for command in ("demo", "render", "selftest", "sample"):
        assert main([command, "--help"]) == 0
        assert capsys.readouterr().out.startswith(f"usage: pulsar-py {command} "), command
        assert main([command, "--help"], prog="python -m pulsar_py") == 0
        assert capsys.readouterr().out.startswith(f"usage: python -m pulsar_py {command} "), command
    done = subprocess.run(
        [sys.executable, "-m", "pulsar_py", "render", "--help"],
        cwd=tmp_path,
        env=_env_for(pulsar_py),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m pulsar_py render "), done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "pulsar_py", "--help"],
        cwd=tmp_path,
        env=_env_for(pulsar_py),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.startswith("usage: python -m pulsar_py "), done.stdout


def test_help_names_only_modules_that_exist(capsys):
    assert main(["--help"]) == 0
    named = set(re.findall(r"\bpulsar_py(?:\.\w+)+", capsys.readouterr().out))
    assert "pulsar_py.tools.bench" in named
    for name in sorted(named):
        assert importlib.util.find_spec(name) is not None, f"pulsar-py --help names {name}, which does not exist"


def test_info_prints_version_and_backends(capsys):
    assert main(["info"]) == 0
    printed = capsys.readouterr().out
    assert f"pulsar_py {pulsar_py.__version__}" in printed
    assert "cpu" in printed


def test_bad_arguments_exit_non_zero(tmp_path, capsys):
    assert main(["sample"]) != 0  # --out missing
    assert main(["sample", "--out", str(tmp_path / "x.png"), "--width", "-3"]) != 0
    assert main(["no-such-command"]) != 0
    assert main([]) != 0
    capsys.readouterr()
    assert main(["sample", "--out", str(tmp_path / "x.png"), "--device", "tpu"]) == 1
    assert "--device" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_unwritable_output_is_a_clear_error(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert main(["sample", "--out", str(blocker / "x.png"), *SMALL]) == 1
    assert "--out" in capsys.readouterr().err


def test_bench_arguments_are_forwarded(capsys):
    assert main(["bench", "--workloads", "W9"]) == 2
    assert "W9" in capsys.readouterr().err
    assert main(["bench", "--help"]) == 0
    assert "--workloads" in capsys.readouterr().out


def test_bench_inputs_follow_performance_md():
    w = bench.WORKLOADS["W4"]
    small = bench.Workload("t", "t", 1000, 8, 8, w.radius_scale, w.radius_offset, w.opacity_range, 1, w.reference)
    inputs = bench.make_inputs(small, torch.device("cpu"))
    gen = torch.Generator().manual_seed(1)
    expected_pos = torch.rand(1000, 3, generator=gen) * 10 + torch.tensor([-5.0, -5.0, 25.0])
    assert torch.allclose(inputs.positions, expected_pos)
    assert torch.equal(inputs.colours, torch.rand(1000, 3, generator=gen))
    u = torch.rand(1000, generator=gen)
    assert torch.allclose(inputs.radii, 0.038 * (0.5 + u))
    assert torch.allclose(inputs.opacity, 0.1 + 0.8 * torch.rand(1000, generator=gen))
    assert inputs.cam_params.tolist() == [0, 0, 0, 0, 0, 0, 5, 2]
    assert bench.make_inputs(bench.WORKLOADS["W3"], torch.device("cpu")).opacity.min() >= 0.1


def test_bench_multiview_cameras_look_at_the_centre():
    cams = bench.workload_cameras(bench.WORKLOADS["W6"])
    assert cams.shape == (8, 8)
    camera = camera_from_params(cams, 512, 512)
    to_centre = torch.nn.functional.normalize(torch.tensor([0.0, 0.0, 30.0], dtype=cams.dtype) - camera.eye, dim=-1)
    assert torch.allclose(camera.optical_axis(), to_centre, atol=1e-12)
    assert torch.allclose(
        (camera.eye - torch.tensor([0.0, 0.0, 30.0], dtype=cams.dtype)).norm(dim=-1),
        torch.full((8,), 30.0, dtype=cams.dtype),
    )
    assert math.isclose(float(cams[2, 4]), math.pi / 2)


def test_bench_scratch_accessor_sees_the_renderers_buffers():
    renderer = pulsar_py.Renderer(32, 24)
    cpu = torch.device("cpu")
    assert bench.scratch_bytes(renderer, cpu) is None  # nothing rendered yet
    scene = make_sample_scene(32, 24, n_spheres=120)
    renderer(**scene.render_kwargs())
    assert bench.scratch_bytes(renderer, cpu) > 0


def test_bench_native_counters_survive_missing_internals():
    cpu = torch.device("cpu")
    assert bench.binned_instances(torch.nn.Linear(2, 2), cpu) is None  # no native objects at all

    class Odd(torch.nn.Module):
        def __init__(self, natives):
            super().__init__()
            self._natives = natives

    assert bench.scratch_bytes(Odd([1, 2]), cpu) is None  # not a dict
    assert bench.scratch_bytes(Odd({("cpu", 0): object()}), cpu) is None  # no such counter


def test_bench_json_names_the_run(tmp_path, monkeypatch, capsys):
    w3 = bench.WORKLOADS["W3"]
    small = bench.Workload(
        "W3", w3.label, 200, 32, 24, w3.radius_scale, w3.radius_offset, w3.opacity_range, 1, w3.reference
    )
    monkeypatch.setitem(bench.WORKLOADS, "W3", small)
    out = tmp_path / "bench.json"
    assert (
        bench.main(
            [
                "--device",
                "cpu",
                "--workloads",
                "W3",
                "--repeats",
                "2",
                "--warmup",
                "0",
                "--no-peer",
                "--quiet",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split()[:4] == ["workload", "N", "image", "fwd"]
    report = json.loads(out.read_text())
    assert list(report)[:6] == ["device", "driver", "torch", "commit", "date", "command"]
    assert report["driver"] is None and report["torch"].startswith(torch.__version__)
    assert (
        report["command"] == "pulsar-py bench --device cpu --workloads W3 --repeats 2 --warmup 0 --no-peer "
        f"--quiet --json {out}"
    )
    assert report["settings"]["repeats"] == 2 and report["settings"]["device_type"] == "cpu"
    assert set(report["host_load_average"]) == {"start", "end"}
    (row,) = report["rows"]
    assert (row["workload"], row["n_spheres"], row["image"]) == ("W3", 200, "32x24")
    assert len(row["fwd_times_ms"]) == 2 and row["fwd_ms"] > 0 and row["fwd_bwd_ms"] > 0
    assert row["scratch_mib"] > 0 and row["memory_mib"] == row["scratch_mib"]
