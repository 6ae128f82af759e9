"""pulsar_py.gradcheck: passes on correct gradients, fails on wrong ones, tolerates kinks;
and its command line (``main``)."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from helpers import DEVICES, HAS_CUDA
from scenes import Scene, pixel_deltas, random_scene

import pulsar_py.gradcheck as gc
import pulsar_py.tools.gradcheck_command as gc_tool
from pulsar_py import Renderer, ops

ALL_GROUPS = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")


def _scene(**kwargs) -> Scene:
    defaults = dict(width=16, height=12, n_spheres=6, cam_length=13, right_handed=True, gamma=0.2)
    defaults.update(kwargs)
    return random_scene(21, **defaults)


def _check(scene: Scene, renderer=None, device: str = "cpu", **options) -> gc.GradcheckReport:
    renderer = renderer if renderer is not None else scene.renderer(device)
    kwargs = scene.call_kwargs(torch.float64, device)
    return gc.gradcheck(renderer, **kwargs, **options)


class _TransformGrad(torch.autograd.Function):
    """Identity forward; backward applies ``transform`` to the incoming gradient."""

    @staticmethod
    def forward(ctx, x, transform):
        ctx.transform = transform
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return ctx.transform(grad), None


class WrongGradient:
    """A renderer whose gradient for one input is transformed (a deliberately wrong backward)."""

    def __init__(self, renderer: Renderer, group: str, transform: Callable[[torch.Tensor], torch.Tensor]):
        self.renderer, self.group, self.transform = renderer, group, transform

    @property
    def device(self):
        return self.renderer.device

    def __call__(self, **kwargs):
        t = kwargs[self.group]
        if t is not None and t.requires_grad:
            kwargs[self.group] = _TransformGrad.apply(t, self.transform)
        return self.renderer(**kwargs)


# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_passes_on_a_correct_scene(device):
    scene = _scene()
    report = _check(scene, device=device)
    assert report.passed, str(report)
    assert tuple(report.groups) == ALL_GROUPS
    for name, group in report.groups.items():
        assert group.passed and not group.failing
        assert group.n_checked == group.n_entries or name == "cam_params"
        assert group.numeric_scale > 0, f"{name}: zero gradient, the check would be empty"
        assert group.cosine_similarity > 1 - 1e-9
        assert group.max_rel_error <= report.rtol
    # The table names every group and the result.
    text = str(report)
    assert text == report.table()
    assert "max abs err" in text and "cosine" in text and "result: PASSED" in text
    for name in ALL_GROUPS:
        assert name in text


def test_orthographic_focal_length_is_not_perturbed():
    scene = _scene(orthographic=True, cam_length=10)
    report = _check(scene)
    assert report.passed, str(report)
    cam = report["cam_params"]
    assert cam.n_entries == 10 and cam.n_checked == 9  # focal length fixed at 0


def test_groups_follow_the_inputs():
    """No opacity: no opacity group; bg_col None: the default background (ones) is checked."""
    scene = _scene(with_opacity=False, with_bg=False)
    report = _check(scene)
    assert report.passed, str(report)
    assert "opacity" not in report.groups and "bg_col" in report.groups
    assert report["bg_col"].numeric_scale > 0


@pytest.mark.parametrize("group", ALL_GROUPS)
def test_fails_when_one_gradient_is_scaled(group):
    """A gradient scaled by 0.5 fails its group (and only its group)."""
    scene = _scene()
    renderer = WrongGradient(scene.renderer(), group, lambda g: 0.5 * g)
    report = _check(scene, renderer)
    assert not report.passed
    assert report.failed_groups == [group], str(report)
    bad = report[group]
    assert len(bad.failing) >= max(1, bad.n_checked // 2)
    entry = bad.failing[0]
    assert entry.analytic == pytest.approx(0.5 * entry.numeric, rel=1e-3)
    assert "FAIL" in str(report) and f"{group}[" in str(report)


def test_fails_for_a_slightly_wrong_gradient():
    """1e-3 relative error in the radius gradient is caught in float64."""
    scene = _scene()
    renderer = WrongGradient(scene.renderer(), "vert_rad", lambda g: 1.001 * g)
    report = _check(scene, renderer)
    assert report.failed_groups == ["vert_rad"], str(report)


def test_fails_for_pulsar_style_normalised_gradients():
    """Pulsar divides each sphere's gradient by its number of contributing pixels: wrong."""
    scene = _scene(n_track=16)
    renderer = scene.renderer()
    _, info = renderer(**scene.call_kwargs(), return_forward_info=True)
    ids = Renderer.sphere_ids_from_result_info_nograd(info)
    n = scene.vert_pos.shape[0]
    pixels = torch.stack([(ids == i).any(-1).sum() for i in range(n)]).double().clamp(min=1)
    assert int(pixels.max()) > 1
    wrong = WrongGradient(renderer, "vert_col", lambda g: g / pixels[:, None])
    report = _check(scene, wrong)
    assert report.failed_groups == ["vert_col"]
    assert report["vert_col"].cosine_similarity < 0.999


def test_a_silhouette_through_a_pixel_centre_is_a_kink_not_a_failure():
    """Sphere 0's radius equals delta at one pixel: its position, radius and the camera
    entries sit exactly on a kink. The correct gradient passes, with kinks reported."""
    base = _scene(cam_length=8, right_handed=False, gamma=0.3)
    delta = pixel_deltas(base)
    rad = base.vert_rad.clone()
    rad[0] = delta[0, base.height // 2, base.width // 2]
    scene = Scene(**{**base.__dict__, "vert_rad": rad})
    report = _check(scene)
    assert report.passed, str(report)
    kinks = {name: g.n_kinks for name, g in report.groups.items()}
    assert kinks["vert_rad"] >= 1 and kinks["vert_pos"] >= 1, kinks
    # ... and a wrong gradient on the same scene still fails.
    wrong = WrongGradient(scene.renderer(), "vert_pos", lambda g: -g)
    assert _check(scene, wrong).failed_groups == ["vert_pos"]


def test_max_entries_subsamples():
    scene = _scene(n_spheres=20)
    report = _check(scene, max_entries=10)
    assert report.passed, str(report)
    assert report["vert_pos"].n_entries == 60 and report["vert_pos"].n_checked == 10
    assert report["bg_col"].n_checked == 3  # small groups: all entries
    # Subsampled checks still catch a wrong gradient.
    wrong = WrongGradient(scene.renderer(), "vert_pos", lambda g: 0.5 * g)
    assert _check(scene, wrong, max_entries=10).failed_groups == ["vert_pos"]


@pytest.mark.parametrize("device", DEVICES)
def test_float32_analytic_gradient_against_float64_differences(device):
    scene = _scene()
    report = _check(scene, device=device, analytic_dtype=torch.float32)
    assert report.passed, str(report)
    assert report.analytic_dtype == torch.float32 and "float32" in str(report)
    wrong = WrongGradient(scene.renderer(device), "cam_params", lambda g: 0.9 * g)
    assert _check(scene, wrong, device=device, analytic_dtype=torch.float32).failed_groups == ["cam_params"]


def test_grad_output_argument():
    scene = _scene(batch=2)
    ones = torch.ones(2, scene.height, scene.width, scene.n_channels, dtype=torch.float64)
    report = _check(scene, grad_output=ones)
    assert report.passed, str(report)
    with pytest.raises(ValueError, match="grad_output"):
        _check(scene, grad_output=ones[0])


def test_inputs_are_converted_to_float64():
    scene = _scene()
    kwargs = scene.call_kwargs(torch.float32)
    report = gc.gradcheck(scene.renderer(), **kwargs)
    assert report.passed, str(report)


# ---------------------------------------------------------------------------------------
def test_cli_passes_and_prints_tables(capsys):
    assert gc_tool.main(["--device", "cpu"]) == 0
    out = capsys.readouterr().out
    n = len(gc_tool.builtin_scenes())
    assert n >= 6
    assert out.count("result: PASSED") == n
    assert f"[1/{n}]" in out and f"[{n}/{n}]" in out
    assert "max abs err" in out and "cam_params" in out
    assert f"all {n} scenes passed" in out


def test_cli_float32_and_seed(capsys):
    assert gc_tool.main(["--dtype", "float32", "--seed", "3", "--max-entries", "12"]) == 0
    out = capsys.readouterr().out
    assert "analytic float32" in out and "FAIL" not in out


def test_cli_returns_1_when_a_gradient_is_wrong(capsys, monkeypatch):
    original = ops.input_gradients

    def halved_colour_gradient(grads, args):
        grads = list(original(grads, args))  # positions, features, ...
        if grads[1] is not None:
            grads[1] = 0.5 * grads[1]
        return tuple(grads)

    monkeypatch.setattr(ops, "input_gradients", halved_colour_gradient)
    assert gc_tool.main(["--max-entries", "6"]) == 1
    out = capsys.readouterr().out
    assert "FAILED (vert_col)" in out and "gradcheck: FAILED" in out


def test_cli_cuda_unavailable(capsys):
    if HAS_CUDA:
        pytest.skip("CUDA is available here")
    assert gc_tool.main(["--device", "cuda"]) == 1
    assert "cuda" in capsys.readouterr().err.lower()


def test_cli_rejects_bad_arguments():
    with pytest.raises(SystemExit) as exit_info:
        gc_tool.main(["--dtype", "float16"])
    assert exit_info.value.code == 2


def test_too_many_kinks_fail_a_group():
    group = gc.GroupReport(
        name="vert_pos",
        n_entries=30,
        n_checked=30,
        numeric_scale=1.0,
        max_abs_error=0.0,
        max_rel_error=0.0,
        cosine_similarity=1.0,
        n_refined=0,
        n_kinks=7,
        max_kinks=6,
    )
    assert not group.passed and group.status == "FAIL (kinks)"
    assert gc.GroupReport(**{**group.__dict__, "n_kinks": 6}).passed


@pytest.mark.parametrize("orthographic", [False, True])
def test_gradcheck_accepts_a_camera_with_unequal_focal_lengths(orthographic):
    """A pulsar_py.Camera (fx != fy, a principal point off the centre) is checked through
    its own tensors: rotation, translation, fx, fy, cx, cy; all pass, and a wrong camera
    gradient fails."""
    from pulsar_py import Camera, Renderer

    H, W = 14, 20
    eye = torch.tensor([0.3, -0.2, -0.5], dtype=torch.float64)
    camera = Camera.look_at(
        eye,
        torch.tensor([0.1, 0.1, 8.0], dtype=torch.float64),
        image_size=(H, W),
        fx=(3.0 if orthographic else 18.0),
        fy=(3.6 if orthographic else 22.0),
        cx=9.3,
        cy=6.1,
        orthographic=orthographic,
        rotation_repr="axis_angle",
    )
    g = torch.Generator().manual_seed(5)
    n = 10
    pos = torch.cat(
        [
            torch.rand(n, 2, generator=g, dtype=torch.float64) * 3 - 1.5,
            7.0 + torch.rand(n, 1, generator=g, dtype=torch.float64),
        ],
        -1,
    )
    renderer = Renderer(W, H, orthogonal_projection=orthographic)
    report = gc.gradcheck(
        renderer,
        vert_pos=pos,
        vert_col=torch.rand(n, 3, generator=g, dtype=torch.float64),
        vert_rad=0.35 + 0.2 * torch.rand(n, generator=g, dtype=torch.float64),
        cam_params=camera,
        gamma=0.3,
        max_depth=20.0,
        min_depth=0.0 if orthographic else 0.5,
        opacity=0.5 + 0.5 * torch.rand(n, generator=g, dtype=torch.float64),
    )
    assert report.passed, report.table()
    assert set(gc.CAMERA_GROUPS) <= set(report.groups)
    for name in gc.CAMERA_GROUPS:
        assert report.groups[name].numeric_scale > 0, name


def test_camera_look_at_from_numbers_has_torch_default_dtype():
    from pulsar_py import Camera

    camera = Camera.look_at((0.0, 0.0, 0.0), (0.0, 0.0, 5.0), image_size=(8, 8))
    assert camera.dtype == torch.get_default_dtype() == torch.float32
    assert (
        Camera.look_at((0.0, 0.0, 0.0), (0.0, 0.0, 5.0), image_size=(8, 8), dtype=torch.float64).dtype == torch.float64
    )
    with pytest.raises(TypeError, match="dtype"):
        Camera.look_at(torch.zeros(3), (0.0, 0.0, 5.0), image_size=(8, 8), dtype=torch.float64)
