"""The demo (pulsar-py demo) and its helpers: the animation's frames, the loss plot,
look-at cameras."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sweep
import torch

import pulsar_py
from pulsar_py.cameras.look_at import (
    look_at_matrix,
    look_at_params,
    matrix_to_axis_angle,
    rotation_angle_deg,
    rotation_from_params,
    sensor_width_for_fov,
)
from pulsar_py.cameras.params import camera_from_params
from pulsar_py.cameras.rotations import axis_angle_to_matrix
from pulsar_py.io.images import read_animation, read_image
from pulsar_py.tools.cli import main as cli_main
from pulsar_py.tools.demo import (
    GIF_FRAME_MS,
    GIF_HOLD_MS,
    AnimationFrames,
    _render_views,
    blur_sigma,
    gaussian_blur,
    learning_rate_factor,
    loss_figure,
    run_demo,
    scale_gradient,
    summary_line,
    view0_sphere_weight,
)
from pulsar_py.tools.demo_setup import DemoSettings, build_scene, perturb, pose_errors

SUMMARY_KEYS = {"initial", "final", "steps", "seconds", "device"}
ERROR_KEYS = {"rotation_error_deg", "translation_error", "focal_error", "psnr_db"}


def _tiny(**overrides) -> DemoSettings:
    """A demo small enough for a test: 64x48, ~600 + ~600 spheres."""
    values = dict(width=64, height=48, n_spheres=600, floor_spacing=0.5, steps=10, gif_frames=4)
    values.update(overrides)
    return DemoSettings(**values)


# ---------------------------------------------------------------------------------------
# The optimisation


def test_demo_recovers_the_pose_and_the_images_at_a_small_size():
    # Smaller perturbation than the default (8 degrees), as 64x48 images hold less detail.
    settings = _tiny(steps=100, rotation_error_deg=3.0, translation_error=0.2, focal_error=0.02)
    summary = run_demo(settings, torch.device("cpu"), progress=False)
    assert set(summary) == SUMMARY_KEYS
    initial, final = summary["initial"], summary["final"]
    assert set(initial) == set(final) == ERROR_KEYS
    assert initial["rotation_error_deg"] == pytest.approx(3.0, abs=1e-3)
    assert final["rotation_error_deg"] < initial["rotation_error_deg"] / 2.5, summary
    assert final["psnr_db"] > initial["psnr_db"] + 6.0, summary
    assert summary["steps"] == 100 and summary["device"] == "cpu" and summary["seconds"] > 0


def test_perturbation_has_the_configured_sizes_and_truth_has_none():
    settings = _tiny()
    scene = build_scene(settings, torch.device("cpu"))
    errors = pose_errors(perturb(scene, settings), scene)
    assert errors["rotation_error_deg"] == pytest.approx(settings.rotation_error_deg, abs=1e-3)
    assert errors["translation_error"] == pytest.approx(settings.translation_error, abs=1e-4)
    assert errors["focal_error"] == pytest.approx(settings.focal_error, abs=1e-5)
    truth = perturb(scene, _tiny(rotation_error_deg=0.0, translation_error=0.0, focal_error=0.0))
    assert all(v < 1e-3 for v in pose_errors(truth, scene).values())
    # The reference cameras are the true ones, and stay fixed.
    assert torch.equal(truth.cam_params()[1:], scene.cam_params[1:])


def test_view0_gradient_reaches_the_spheres_only_as_far_as_trusted():
    settings = _tiny(views=2)
    scene = build_scene(settings, torch.device("cpu"))
    renderer = pulsar_py.Renderer(settings.width, settings.height)
    grads = {}
    for weight in (0.0, 0.5, 1.0):
        params = perturb(scene, settings)
        images = _render_views(renderer, scene, settings, params, view0_weight=weight)
        (images[0] ** 2).sum().backward()  # a loss on view 0 alone
        grads[weight] = (params.sphere_position.grad.clone(), params.camera_rotation.grad.clone())
    assert float(grads[0.0][0].abs().max()) == 0.0
    assert float(grads[1.0][0].abs().max()) > 0
    assert torch.allclose(grads[0.5][0], 0.5 * grads[1.0][0], rtol=1e-5, atol=1e-9)
    # The camera gets its full gradient whatever the weight.
    assert float(grads[0.0][1].abs().max()) > 0
    assert torch.allclose(grads[0.0][1], grads[1.0][1], rtol=1e-4, atol=1e-9)


def test_schedules():
    s = DemoSettings(steps=100)
    assert learning_rate_factor(s, 0) == 1.0 and learning_rate_factor(s, 50) == 1.0
    assert learning_rate_factor(s, 100) == pytest.approx(s.final_lr_fraction)
    assert 0.05 < learning_rate_factor(s, 75) < 1.0
    assert view0_sphere_weight(s, 0) == 0.0 and view0_sphere_weight(s, 50) == 0.0
    assert view0_sphere_weight(s, 65) == pytest.approx(0.5)
    assert view0_sphere_weight(s, 80) == 1.0 and view0_sphere_weight(s, 99) == 1.0
    assert blur_sigma(s, 0) == pytest.approx(s.blur_start_px)
    assert blur_sigma(s, 25) == pytest.approx(s.blur_start_px / 2)
    assert blur_sigma(s, 50) == 0.0 and blur_sigma(s, 99) == 0.0


def test_scale_gradient_keeps_the_value_and_scales_the_gradient():
    x = torch.tensor([1.0, -2.0], requires_grad=True)
    y = scale_gradient(x, 0.25)
    assert torch.equal(y, x)
    (y * torch.tensor([4.0, 8.0])).sum().backward()
    assert x.grad.tolist() == [1.0, 2.0]


def test_gaussian_blur_is_a_normalised_symmetric_filter():
    images = torch.zeros(2, 31, 33, 3, dtype=torch.float64)
    images[0, 15, 16, 1] = 1.0
    blurred = gaussian_blur(images, 2.0)
    assert blurred.shape == images.shape
    assert float(blurred.sum()) == pytest.approx(1.0, abs=1e-12)  # the impulse is far from the border
    plane = blurred[0, :, :, 1]
    assert torch.allclose(plane, plane.flip(0)) and torch.allclose(plane, plane.flip(1))
    assert float(plane[15, 16]) == pytest.approx(1 / (2 * math.pi * 4), rel=0.02)  # the Gaussian's peak
    assert float(blurred[1].abs().max()) == 0 and float(blurred[0, :, :, 0].abs().max()) == 0
    assert gaussian_blur(images, 0.1) is images


def test_settings_are_checked():
    with pytest.raises(ValueError, match="views"):
        DemoSettings(views=1).check()
    with pytest.raises(ValueError, match="steps"):
        DemoSettings(steps=0).check()
    with pytest.raises(ValueError, match="gamma"):
        DemoSettings(gamma=2.0).check()


def test_demo_is_deterministic():
    a = run_demo(_tiny(steps=4), torch.device("cpu"), progress=False)
    b = run_demo(_tiny(steps=4), torch.device("cpu"), progress=False)
    a.pop("seconds"), b.pop("seconds")
    assert a == b


# ---------------------------------------------------------------------------------------
# The command


def test_demo_command_writes_every_output(tmp_path, capsys):
    out = tmp_path / "demo"
    args = [
        "demo",
        "--out",
        str(out),
        "--width",
        "48",
        "--height",
        "36",
        "--spheres",
        "240",
        "--steps",
        "12",
        "--quiet",
        "--device",
        "cpu",
    ]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert "rotation error 8.00 ->" in printed and "PSNR" in printed
    names = {"target.png", "initial.png", "final.png", "optimisation.gif", "loss.png", "summary.json"}
    assert names <= set(os.listdir(out))
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == SUMMARY_KEYS
    assert set(summary["initial"]) == set(summary["final"]) == ERROR_KEYS
    assert summary["steps"] == 12 and summary["device"] == "cpu"
    assert summary["initial"]["rotation_error_deg"] == pytest.approx(8.0, abs=1e-3)
    assert summary["initial"]["translation_error"] == pytest.approx(0.6, abs=1e-4)
    assert summary["initial"]["focal_error"] == pytest.approx(0.06, abs=1e-5)
    for name in ("target.png", "initial.png", "final.png"):
        assert read_image(out / name).shape == (36, 3 * 48 + 2 * 2, 3)  # three views, 2-pixel gaps
    target, final = read_image(out / "target.png").float(), read_image(out / "final.png").float()
    initial = read_image(out / "initial.png").float()
    assert float((final - target).abs().mean()) < float((initial - target).abs().mean())
    assert (out / "optimisation.gif").read_bytes()[:6] == b"GIF89a"
    frames = read_animation(out / "optimisation.gif")
    assert len(frames) == 13  # every step (12 < gif_frames) and the end
    # Each frame shows for GIF_FRAME_MS, the last (the result) for GIF_HOLD_MS.
    iio = pytest.importorskip("imageio.v3")
    durations = [iio.immeta(out / "optimisation.gif", index=k)["duration"] for k in range(len(frames))]
    assert durations == [GIF_FRAME_MS] * 12 + [GIF_HOLD_MS] and GIF_HOLD_MS >= 10 * GIF_FRAME_MS
    # Panels 4 x 48 pixels wide (at least 160), 2-pixel gaps, a 20-pixel caption strip.
    assert all(f.shape == (20 + 4 * 36, 3 * 4 * 48 + 2 * 2, 3) for f in frames)
    # The first frame's left panel is the target (view 0) as in target.png, up to the
    # palette: every 4th pixel of the panel.
    assert float((frames[0][20::4, :192:4].float() - target[:, :48]).abs().mean()) < 6.0
    loss = read_image(out / "loss.png")
    assert loss.shape[0] > 400 and loss.shape[1] > 400 and loss.shape[2] in (3, 4)
    assert int((loss[..., :3].int() - 255).abs().sum(-1).ne(0).sum()) > 5000  # drawn on


def test_demo_command_errors(tmp_path, capsys):
    assert cli_main(["demo", "--steps", "0", "--out", str(tmp_path)]) == 2
    assert "--steps" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert (
        cli_main(
            [
                "demo",
                "--out",
                str(blocker / "x"),
                "--width",
                "32",
                "--height",
                "24",
                "--spheres",
                "120",
                "--steps",
                "1",
                "--quiet",
                "--device",
                "cpu",
            ]
        )
        == 1
    )
    assert "--out" in capsys.readouterr().err
    if "cuda" not in pulsar_py.build_info()["backends"] or not torch.cuda.is_available():
        assert cli_main(["demo", "--device", "cuda", "--out", str(tmp_path)]) == 1
        assert "cuda" in capsys.readouterr().err


def test_python_m_pulsar_py_demo_runs(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(pulsar_py.__file__).resolve().parent.parent) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pulsar_py",
            "demo",
            "--out",
            "o",
            "--width",
            "32",
            "--height",
            "24",
            "--spheres",
            "120",
            "--steps",
            "3",
            "--device",
            "cpu",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "demo (cpu): 100%" in done.stderr and "3/3" in done.stderr  # tqdm's progress bar
    assert json.loads((tmp_path / "o" / "summary.json").read_text())["steps"] == 3


# ---------------------------------------------------------------------------------------
# Pictures


def test_animation_frame_holds_target_render_and_difference():
    gen = torch.Generator().manual_seed(0)
    target = torch.rand(10, 16, 3, generator=gen)
    current = (target + 0.1).clamp(0, 1)
    frames = AnimationFrames(10, 16)
    assert frames.scale == 10  # 160 / 16
    frame = frames.frame(target, current, 3, 7)
    assert frame.dtype == torch.uint8 and frame.shape == (20 + 100, 3 * 160 + 4, 3) == frames.size + (3,)
    panels = frame[20:]
    # Each panel: the image, every pixel drawn as a 10 x 10 block.
    expected = [target, current, ((current - target).abs() * 4).clamp(0, 1)]
    for k, image in enumerate(expected):
        panel = panels[:, k * 162 : k * 162 + 160]
        want = (image * 255).round().to(torch.uint8).repeat_interleave(10, 0).repeat_interleave(10, 1)
        assert torch.equal(panel, want), k
    assert bool((panels[:, 160:162] == 255).all())  # the gaps
    # The caption strip has dark text on white in each third; the middle one changes
    # with the step.
    caption = frame[:20].int()
    for k in range(3):
        assert int((caption[:, k * 162 : (k + 1) * 162 - 2] < 100).all(-1).sum()) > 10, k
    other = frames.frame(target, current, 4, 7)[:20]
    assert not torch.equal(other[:, 162:322], frame[:20, 162:322])
    assert torch.equal(other[:, :160], frame[:20, :160])


def test_loss_figure_draws_four_axes(tmp_path):
    steps = 50
    mse = [0.03 * math.exp(-k / 10) for k in range(steps + 1)]
    errors = {
        "rotation_error_deg": [8 * math.exp(-k / 12) for k in range(steps + 1)],
        "translation_error": [0.6 - 0.004 * k for k in range(steps + 1)],
        "focal_error": [0.06 - 0.001 * k for k in range(steps + 1)],
    }
    path = tmp_path / "loss.png"
    loss_figure(str(path), mse, errors)
    image = read_image(path)[..., :3].int()
    # Four curves, each in its own colour (matplotlib's tab:blue, orange, green, red).
    for colour in ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)):
        hit = (image - torch.tensor(colour)).abs().amax(-1) <= 8
        assert int(hit.sum()) > 100, colour
    rows = [int(r) for r in torch.nonzero((image - torch.tensor((31, 119, 180))).abs().amax(-1) <= 8)[:, 0]]
    assert max(rows) < image.shape[0] / 3  # the image error in the top panel


# ---------------------------------------------------------------------------------------
# Look-at cameras and rotation helpers


@pytest.mark.parametrize("right_handed", [False, True])
def test_look_at_camera_looks_at_the_target_with_up_upwards(right_handed):
    eye, target = (
        torch.tensor([3.0, 2.0, -5.0], dtype=torch.float64),
        torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64),
    )
    cams = {
        "axis_angle": look_at_params(eye, target, right_handed=right_handed),
        "6d": look_at_params(eye, target, right_handed=right_handed, rotation="6d"),
    }
    assert cams["axis_angle"].shape == (8,) and cams["6d"].shape == (11,)
    for cam in cams.values():
        native = camera_from_params(cam[None], 21, 15, right_handed=right_handed)
        to_target = torch.nn.functional.normalize(target - eye, dim=0)
        assert torch.allclose(native.optical_axis()[0], to_target, atol=1e-12)
        # The centre pixel (10, 7) looks at the target; pixel rows run downwards, i.e.
        # against world +y.
        centre = native.p00[0] + 10 * native.pdx[0] + 7 * native.pdy[0]
        assert torch.allclose(torch.nn.functional.normalize(centre - eye, dim=0), to_target, atol=1e-12)
        assert float(native.pdy[0][1]) < 0
    with pytest.raises(ValueError, match="up: expected a non-zero"):
        look_at_matrix(eye, target, (0.0, 0.0, 0.0))
    with pytest.raises(ValueError, match="eye, target"):
        look_at_matrix(eye, eye)


@pytest.mark.parametrize("right_handed", [False, True])
def test_look_at_straight_above_or_below_takes_the_fallback_up(right_handed):
    # The matrix's second column is the image's up direction in the world.
    f64 = dict(dtype=torch.float64)
    for eye, up, image_up in (
        ((0.0, 5.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, -1.0)),  # above: -z at the top
        ((0.0, -5.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)),  # below: +z
        ((0.0, 0.0, 5.0), (0.0, 0.0, 1.0), (0.0, 1.0, 0.0)),
    ):  # up z, above: +y
        matrix = look_at_matrix(eye, (0.0, 0.0, 0.0), up, right_handed=right_handed)
        torch.testing.assert_close(matrix[:, 1], torch.tensor(image_up, **f64), rtol=0, atol=1e-12)
        torch.testing.assert_close(matrix.T @ matrix, torch.eye(3, **f64), rtol=0, atol=1e-12)
        # The limit of a camera raised over the target from the default side.
        side = torch.tensor([0.0, 0.0, 1.0] if up[2] == 0 else [0.0, -1.0, 0.0], **f64)
        near = look_at_matrix(torch.tensor(eye, **f64) + 1e-7 * side, (0.0, 0.0, 0.0), up, right_handed=right_handed)
        torch.testing.assert_close(near, matrix, rtol=0, atol=1e-6)


def test_right_handed_look_at_is_not_mirrored():
    # Camera on +z looking at the origin, y up: world +x appears on the right.
    cam = look_at_params([0.0, 0.0, 5.0], [0.0, 0.0, 0.0], right_handed=True)
    native = camera_from_params(cam[None], 8, 8, right_handed=True)
    assert torch.allclose(native.pdx[0] / native.pdx[0].norm(), torch.tensor([1.0, 0, 0], dtype=torch.float64))


def test_rotation_helpers():
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(200, 3, generator=gen, dtype=torch.float64)
    v = v / v.norm(dim=-1, keepdim=True) * torch.rand(200, 1, generator=gen, dtype=torch.float64) * 3.1
    m = axis_angle_to_matrix(v)
    assert torch.allclose(axis_angle_to_matrix(matrix_to_axis_angle(m)), m, atol=1e-9)
    identity = torch.eye(3, dtype=torch.float64).expand(200, 3, 3)
    assert torch.allclose(rotation_angle_deg(m, identity), torch.rad2deg(v.norm(dim=-1)), atol=1e-6)
    cam = look_at_params([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    cam6 = look_at_params([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], rotation="6d")
    assert float(rotation_angle_deg(rotation_from_params(cam), rotation_from_params(cam6))) < 1e-9
    assert sensor_width_for_fov(90.0, 2.0) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="cam_params"):
        rotation_from_params(torch.zeros(9))


# ---------------------------------------------------------------------------------------
# The figures the docs quote: the run of record


ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "images" / "demo_record_cpu.json"
CUDA_RUN = ROOT / "docs" / "images" / "demo_summary_cuda.json"


def _text(path: Path) -> str:
    """The page with its lines joined (a quoted figure may wrap)."""
    return " ".join(path.read_text().split())


def test_docs_quote_the_demo_run_of_record():
    record = json.loads(RECORD.read_text())
    runs = record["summaries"]
    assert sorted(runs) == ["0", "1", "2", "3"]
    for run in runs.values():
        assert set(run) == SUMMARY_KEYS and run["steps"] == DemoSettings().steps and run["device"] == "cpu"
    seed0 = runs["0"]
    initial, final = seed0["initial"], seed0["final"]
    readme, guide = _text(ROOT / "README.md"), _text(ROOT / "docs" / "getting_started.md")
    # What the command prints, and the table.
    assert f"{summary_line(seed0)}; 400 steps on cpu in ... s" in guide
    for row, e, rotation in (("initial", initial, ".2f"), ("final", final, ".3f")):
        assert (
            f"| {row} | {e['rotation_error_deg']:{rotation}} | {e['translation_error']:.3f} | "
            f"{100 * e['focal_error']:.1f} | {e['psnr_db']:.1f} |"
        ) in guide, row
    assert (
        f"Rotation error {initial['rotation_error_deg']:.2f} -> {final['rotation_error_deg']:.3f} degrees, "
        f"PSNR {initial['psnr_db']:.1f} -> {final['psnr_db']:.1f} dB"
    ) in readme
    # The seeds' spread.
    rotations = [run["final"]["rotation_error_deg"] for run in runs.values()]
    psnrs = [run["final"]["psnr_db"] for run in runs.values()]
    assert (
        f"over seeds 0 to 3 the rotation error ended between {min(rotations):.3f} and {max(rotations):.3f} "
        f"degrees and the PSNR between {min(psnrs):.1f} and {max(psnrs):.1f} dB"
    ) in guide
    # The times: seed 0's run, and the CUDA run.
    seconds = seed0["seconds"]
    said = f"about {round(seconds / 10) * 10} s" if seconds < 90 else f"about {round(seconds / 60)} minutes"
    assert f"{said} on 2 CPU cores" in readme and f"{said} on 2 CPU cores" in guide
    cuda = json.loads(CUDA_RUN.read_text())
    assert cuda["device"] == "cuda" and f"about {round(cuda['seconds'])} s" in guide
    assert f"about {round(cuda['seconds'])} s on an H100" in readme
    # No other figure of the demo's: every PSNR and rotation error quoted is the record's.
    psnr_quoted = {f"{v:.1f}" for run in runs.values() for v in (run["initial"]["psnr_db"], run["final"]["psnr_db"])}
    degrees_quoted = {
        f"{run[k]['rotation_error_deg']:{p}}"
        for run in runs.values()
        for k, p in (("initial", ".2f"), ("final", ".3f"))
    }
    for page in (readme, guide):
        assert set(re.findall(r"(\d+\.\d+) dB", page)) <= psnr_quoted, re.findall(r"(\d+\.\d+) dB", page)
        assert set(re.findall(r"(\d+\.\d+) deg", page)) <= degrees_quoted, re.findall(r"(\d+\.\d+) deg", page)


@pytest.mark.skipif(not sweep.FULL, reason="PULSAR_PY_SWEEP=full: the demo at full size (a minute on a CPU)")
def test_demo_prints_the_figures_of_the_run_of_record():
    record = json.loads(RECORD.read_text())
    if torch.__version__ != record["torch"]:
        pytest.skip(f"the run of record used torch {record['torch']}; torch {torch.__version__} follows another path")
    summary = run_demo(DemoSettings(), torch.device("cpu"), progress=False)
    assert summary_line(summary) == summary_line(record["summaries"]["0"])
