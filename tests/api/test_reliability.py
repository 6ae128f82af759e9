"""Reliability: no crash, no NaN on valid input, a usable renderer after any failure.

* Worker threads that cannot be created (a child process's address space nearly
  exhausted): RuntimeError naming the thread creation, and the renderer renders the next
  call correctly.
* Ctrl-C (SIGINT) stops a long CPU forward or backward within a second with
  KeyboardInterrupt, and the same renderer renders correctly afterwards.
* Gradients stay finite where a pixel's coverage underflows (a sphere reaching past the
  far plane at a small gamma, tiny opacities) or a radius is denormal, and agree with the
  float64 reference where the coverage is a normal number.
* float32 depth outputs: the distortion is never negative, and the gradients of depth,
  coverage and distortion are within a small factor of a plain float32 evaluation's
  error (the reference renderer run in float32).
* min_depth = 0 for any focal length in both dtypes: natively, in the value checks and in
  the reference alike.
* visible() checks its arguments as rendering does; the constructor's limits, and tensor
  layouts every entry point refuses, name the argument.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import sweep
import torch
from scenes import grad_output_like, random_scene

import pulsar_py
from pulsar_py import Camera, Renderer, _checks
from pulsar_py.cameras.params import camera_from_params
from pulsar_py.reference import render_reference, resolve_min_depth

F32, F64 = torch.float32, torch.float64
BAD_INPUT = (ValueError, TypeError)
DEPTH_OUTPUTS = ("depth", "coverage", "distortion")


def _child_env() -> dict:
    return dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="",
        OMP_NUM_THREADS="1",
        MALLOC_ARENA_MAX="2",
        PYTHONPATH=os.pathsep.join([str(Path(pulsar_py.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
    )


# ---------------------------------------------------------------------------------------
# Worker threads that cannot be created.
_THREADS_CHILD = textwrap.dedent("""
    import resource
    import torch, pulsar_py
    torch.set_num_threads(1)

    def address_space():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize"):
                return int(line.split()[1]) * 1024

    # 256 tiles: the forward asks for 63 worker threads besides the caller.
    renderer = pulsar_py.Renderer(256, 256, num_threads=64)
    gen = torch.Generator().manual_seed(0)
    pos = torch.tensor([[0.0, 0.0, 5.0], [0.3, -0.2, 6.0]])
    col, rad = torch.rand(2, 3, generator=gen), torch.tensor([1.0, 1.5])
    camera = torch.tensor([0, 0, 0, 0, 0, 0, 1.0, 1.0])
    expected = pulsar_py.Renderer(256, 256, num_threads=1)(pos, col, rad, camera, 0.1, 100.0)
    renderer(pos, col, rad, camera, 0.1, 100.0)  # the scratch and the outputs' memory exist now
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    # 8 MB of address space beyond today's: the outputs fit, 63 thread stacks do not.
    resource.setrlimit(resource.RLIMIT_AS, (address_space() + 8_000_000, hard))
    try:
        renderer(pos, col, rad, camera, 0.1, 100.0)
        print("NO FAILURE")
    except RuntimeError as error:
        print("ERROR:", error)
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    print("USABLE:", torch.equal(renderer(pos, col, rad, camera, 0.1, 100.0), expected))
""")


@pytest.mark.skipif(sys.platform != "linux", reason="limits the address space with RLIMIT_AS (Linux)")
def test_failing_thread_creation_is_a_runtime_error_and_the_renderer_stays_usable(tmp_path):
    # A std::system_error unwinding past joinable threads would abort the child (std::terminate).
    child = subprocess.run(
        [sys.executable, "-c", _THREADS_CHILD],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert child.returncode == 0, f"the child died ({child.returncode}): {child.stderr[-3000:]}"
    out = child.stdout
    assert re.search(r"ERROR: pulsar: creating CPU worker thread \d+ of \d+ failed", out), out + child.stderr
    assert "USABLE: True" in out, out


# ---------------------------------------------------------------------------------------
# Ctrl-C.
_SIGINT_CHILD = textwrap.dedent("""
    import signal, sys, time
    import torch, pulsar_py
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    torch.set_num_threads(1)
    renderer = pulsar_py.Renderer(512, 512, num_threads=2)
    gen = torch.Generator().manual_seed(0)
    # Every sphere covers the whole image: about 2.5 s forward, 3 s backward on 2 cores, a
    # fifth of that on a fast 16-core host (the signal comes 0.2 s into the call).
    n = 1000
    pos = torch.zeros(n, 3)
    pos[:, :2] = torch.rand(n, 2, generator=gen) - 0.5
    pos[:, 2] = 10 + torch.rand(n, generator=gen)
    col, rad = torch.rand(n, 3, generator=gen), torch.full((n,), 3.0)
    camera = torch.tensor([0, 0, 0, 0, 0, 0, 1.0, 1.0])
    small = (pos[:3], col[:3], rad[:3], camera, 0.5, 100.0)
    expected = pulsar_py.Renderer(512, 512, num_threads=1)(*small)

    def report(stage, call):
        print(stage, flush=True)
        start = time.perf_counter()
        try:
            call()
            print("COMPLETED", stage, time.perf_counter() - start, flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", stage, time.perf_counter() - start, flush=True)

    report("forward", lambda: renderer(pos, col, rad, camera, 1.0, 100.0, percent_allowed_difference=0.0))
    print("USABLE:", torch.equal(renderer(*small), expected), flush=True)
    pos.requires_grad_(True)
    image = renderer(pos, col, rad, camera, 1.0, 100.0, percent_allowed_difference=0.0)
    report("backward", lambda: image.sum().backward())
    print("USABLE:", torch.equal(renderer(*small), expected), flush=True)
""")


@pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT")
def test_ctrl_c_stops_a_long_cpu_call_within_a_second(tmp_path):
    # Python runs the handler only once the native call returns: without the native
    # interrupt check, KeyboardInterrupt would come seconds late, at the call's end.
    child = subprocess.Popen(
        [sys.executable, "-c", _SIGINT_CHILD],
        env=_child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        lines = []
        for stage in ("forward", "backward"):
            for line in child.stdout:
                lines.append(line.strip())
                if line.strip() == stage:
                    break
            time.sleep(0.2)  # the child prints the stage as it starts the call
            sent = time.perf_counter()
            child.send_signal(signal.SIGINT)
            line = child.stdout.readline().strip()
            latency = time.perf_counter() - sent
            lines.append(line)
            assert line.startswith(f"INTERRUPTED {stage}"), (lines, child.stderr.read() if child.poll() else "")
            assert latency < 1.0, f"{stage}: KeyboardInterrupt {latency:.2f} s after the signal"
            usable = child.stdout.readline().strip()
            assert usable == "USABLE: True", (lines, usable)
        assert child.wait(timeout=120) == 0, child.stderr.read()[-3000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# ---------------------------------------------------------------------------------------
# Underflowing coverage and denormal radii: finite gradients, agreeing with float64.
def _one_sphere(dtype, z, radius, opacity=1.0, size=24):
    """A sphere straight ahead of a camera vector (focal length 0.1): the render() inputs."""
    return dict(
        vert_pos=torch.tensor([[0.0, 0.0, z]], dtype=dtype),
        vert_col=torch.tensor([[0.2, 0.5, 0.9]], dtype=dtype),
        vert_rad=torch.tensor([radius], dtype=dtype),
        opacity=torch.tensor([opacity], dtype=dtype),
        camera=torch.tensor([0, 0, 0, 0, 0, 0, 0.1, 0.1], dtype=dtype),
    ), size


# (dtype, z, radius, opacity, gamma): each gave NaN gradients before.
UNDERFLOW_CASES = {
    # Reaching past the far plane (5) at gamma 1e-3: exp(s) of the far pixels underflows.
    "f32_past_far_plane_a": (F32, 5.65, 0.8, 1.0, 1e-3),
    "f32_past_far_plane_b": (F32, 6.0, 1.6, 1.0, 1e-3),
    "f32_past_far_plane_c": (F32, 6.25, 1.6, 1.0, 1e-3),
    "f32_opacity_1e-37": (F32, 3.0, 0.5, 1e-37, 0.1),
    "f64_opacity_1e-310": (F64, 3.0, 0.5, 1e-310, 0.1),
    "f32_denormal_radius": (F32, 3.0, 1e-40, 1.0, 0.1),
    "f64_denormal_radius": (F64, 3.0, 1e-310, 1.0, 0.1),
}
LEAVES = ("vert_pos", "vert_rad", "opacity", "camera")


def _render_grads(inputs, size, gamma, weights_of):
    """Gradients of LEAVES of sum over outputs of weights_of(output, result) * output,
    and the result."""
    leaves = {k: v.detach().clone().requires_grad_(k in LEAVES) for k, v in inputs.items()}
    renderer = Renderer(size, size)
    result = renderer.render(
        leaves["vert_pos"],
        leaves["vert_col"],
        leaves["vert_rad"],
        leaves["camera"],
        gamma,
        5.0,
        0.0,
        opacity=leaves["opacity"],
        percent_allowed_difference=0.0,
    )
    loss = sum((weights_of(out, result) * getattr(result, out)).sum() for out in ("image",) + DEPTH_OUTPUTS)
    return dict(zip(LEAVES, torch.autograd.grad(loss, [leaves[k] for k in LEAVES]))), result


def _reference_grads(inputs, size, gamma, weights_of):
    """The same through the reference renderer, in float64."""
    leaves = {k: v.detach().to(F64).clone().requires_grad_(k in LEAVES) for k, v in inputs.items()}
    camera = camera_from_params(leaves["camera"][None], size, size, False, False, False)
    ref = render_reference(
        leaves["vert_pos"],
        leaves["vert_col"],
        leaves["vert_rad"],
        camera,
        size,
        size,
        gamma,
        5.0,
        0.0,
        opacity=leaves["opacity"],
    )
    loss = sum((weights_of(out, ref).to(F64) * getattr(ref, out)).sum() for out in ("image",) + DEPTH_OUTPUTS)
    return dict(zip(LEAVES, torch.autograd.grad(loss, [leaves[k] for k in LEAVES], allow_unused=True)))


@pytest.mark.parametrize("case", list(UNDERFLOW_CASES))
def test_gradients_stay_finite_where_coverage_underflows_or_radii_are_denormal(case):
    dtype, z, radius, opacity, gamma = UNDERFLOW_CASES[case]
    inputs, size = _one_sphere(dtype, z, radius, opacity)
    ones = lambda out, result: torch.ones_like(getattr(result, out))  # noqa: E731
    grads, result = _render_grads(inputs, size, gamma, ones)
    for out in ("image",) + DEPTH_OUTPUTS:
        assert bool(torch.isfinite(getattr(result, out)).all()), out
    assert bool((result.distortion >= 0).all())
    for name, g in grads.items():
        assert bool(torch.isfinite(g).all()), f"{name}: {g}"
    # Each output alone, too: no term of another output may mask a NaN.
    for out in ("image",) + DEPTH_OUTPUTS:
        only = lambda o, result, out=out: torch.ones_like(getattr(result, o)) * (o == out)  # noqa: E731
        for name, g in _render_grads(inputs, size, gamma, only)[0].items():
            assert bool(torch.isfinite(g).all()), f"{out}: {name}: {g}"


@pytest.mark.parametrize("case", list(UNDERFLOW_CASES))
def test_underflow_gradients_match_the_float64_reference(case):
    """Against the reference in float64, where its own gradients are finite. A pixel
    whose hits' weights all underflowed to 0 reads as not covered (it is left out), and
    a denormal coverage carries fewer significant bits (2^-149 absolute in float32,
    2^-1074 in float64), as do that pixel's depth and distortion gradients: the tolerance
    grows by that quantum over the smallest coverage."""
    dtype, z, radius, opacity, gamma = UNDERFLOW_CASES[case]
    inputs, size = _one_sphere(dtype, z, radius, opacity)
    _, probe = _render_grads(inputs, size, gamma, lambda out, r: torch.ones_like(getattr(r, out)))
    covered = probe.coverage > 0
    normal = (probe.hit_count == 0) | covered
    assert bool(covered.any())
    quantum = float(torch.finfo(dtype).smallest_normal) * float(torch.finfo(dtype).eps)  # the denormal step
    rtol = max(1e-9 if dtype == F64 else 2e-3, 8 * quantum / float(probe.coverage[covered].min()))
    gen = torch.Generator().manual_seed(5)
    fixed = {
        out: torch.rand(size, size, *((3,) if out == "image" else ()), generator=gen, dtype=F64)
        for out in ("image",) + DEPTH_OUTPUTS
    }
    mask = normal.detach().cpu()

    def weights_of(out, result):
        w = fixed[out] * (mask[..., None] if out == "image" else mask)
        return w.to(getattr(result, out).dtype)

    grads, _ = _render_grads(inputs, size, gamma, weights_of)
    ref = _reference_grads(inputs, size, gamma, weights_of)
    for name, g in grads.items():
        want = ref[name]
        if want is None or not bool(torch.isfinite(want).all()):
            continue
        scale = float(want.abs().max())
        torch.testing.assert_close(g.double(), want, rtol=rtol, atol=rtol * max(scale, 1e-30), msg=name)


def test_a_denormal_radius_still_hits_its_centre_pixel():
    """A sphere of denormal radius projects under one pixel: the tiny-sphere rule draws it
    at its centre's pixel, as the reference does."""
    for dtype, radius in ((F32, 1e-40), (F64, 1e-310)):
        inputs, size = _one_sphere(dtype, 3.0, radius)
        result = Renderer(size, size).render(
            inputs["vert_pos"],
            inputs["vert_col"],
            inputs["vert_rad"],
            inputs["camera"],
            0.1,
            5.0,
            opacity=inputs["opacity"],
        )
        assert int(result.hit_count.sum()) >= 1
        camera = camera_from_params(inputs["camera"][None].to(F64), size, size, False, False, False)
        ref = render_reference(
            inputs["vert_pos"].to(F64),
            inputs["vert_col"].to(F64),
            inputs["vert_rad"].to(F64),
            camera,
            size,
            size,
            0.1,
            5.0,
            opacity=inputs["opacity"].to(F64),
        )
        assert torch.equal(result.hit_count.long(), ref.hit_count)


# ---------------------------------------------------------------------------------------
# float32 depth outputs.
def test_float32_distortion_is_never_negative():
    """Single hits (distortion 0) and overlaps, in float32: M_0 M_2 - M_1^2 of raw
    moments rounds below zero at about a third of the single-hit pixels."""
    gen = torch.Generator().manual_seed(0)
    n = 40
    pos = torch.zeros(n, 3)
    pos[:, :2] = (torch.rand(n, 2, generator=gen) - 0.5) * 6
    pos[:, 2] = 10 + 3 * torch.rand(n, generator=gen)
    rad, col = 0.3 + torch.rand(n, generator=gen), torch.rand(n, 3, generator=gen)
    cam = torch.tensor([0, 0, 0, 0, 0, 0, 1.0, 1.0])
    result = Renderer(64, 48).render(pos, col, rad, cam, 0.05, 20.0, min_depth=1.5)
    assert bool((result.distortion >= 0).all()), float(result.distortion.min())
    single = result.hit_count == 1
    assert int(single.sum()) > 100 and bool((result.distortion[single] == 0).all())
    assert bool((result.distortion[result.hit_count > 1] > 0).any())


def _depth_output_grads(scene, dtype, native: bool) -> dict:
    """{output: {group: gradient of sum(w * output)}} for depth, coverage and distortion
    (w fixed, in [-1, 1]): native render() in ``dtype``, or the reference renderer
    evaluated in ``dtype`` (a plain evaluation: autograd through its dense float code)."""
    t = scene.tensors(dtype)
    leaves = {k: v.requires_grad_(True) for k, v in t.items() if v is not None and k not in ("vert_col", "bg_col")}
    if native:
        kwargs = scene.call_kwargs(tensors=t)
        kwargs["camera"] = kwargs.pop("cam_params")
        result = scene.renderer().render(**kwargs)
    else:
        camera = camera_from_params(
            t["cam_params"][None],
            scene.width,
            scene.height,
            scene.orthographic,
            scene.right_handed,
            scene.first_R_then_T,
        )
        result = render_reference(
            t["vert_pos"],
            t["vert_col"],
            t["vert_rad"],
            camera,
            scene.width,
            scene.height,
            scene.gamma,
            scene.max_depth,
            scene.min_depth,
            bg_col=t["bg_col"],
            opacity=t["opacity"],
            background_normalized_depth=scene.beta,
        )
    grads = {}
    for k, out in enumerate(DEPTH_OUTPUTS):
        value = getattr(result, out)
        weights = grad_output_like(value, seed=k)
        grads[out] = dict(
            zip(leaves, torch.autograd.grad((value * weights).sum(), list(leaves.values()), retain_graph=True))
        )
    return grads


# Opaque, overlapping spheres at small gamma: nearly covered pixels, where a 1 - M_0 formed
# from the rounded M_0 would put a spurious term into every coverage gradient (up to 1000x
# the plain evaluation's error), and close depths, where raw moments' M_0 M_2 - M_1^2
# would cancel (up to 100x).
# Every gamma, on 2 seeds (6 with PULSAR_PY_SWEEP=full).
PRECISION_SCENES = [(seed, gamma) for seed in range(sweep.size(2, 6)) for gamma in (0.1, 0.01, 0.003, 0.001)]


def test_float32_depth_output_gradients_are_as_accurate_as_a_plain_float32_evaluation():
    """Relative error (norm over each input group) of float32 gradients against float64,
    at most 8x the plain float32 evaluation's. The largest ratios left come from a few
    pixels at silhouettes (a closeness of 1e-4 and below), where the depth's derivative
    grows without bound and either evaluation rounds its own way; a plain evaluation may
    also be lucky on one gradient, so its error counts from 1e-5 up."""
    worst = {out: (0.0, None) for out in DEPTH_OUTPUTS}
    for seed, gamma in PRECISION_SCENES:
        scene = random_scene(
            seed, width=64, height=48, opacity_range=(0.9, 1.0), radius_px=(6, 20), n_spheres=16, gamma=gamma
        )
        exact = _depth_output_grads(scene, F64, native=True)
        native = _depth_output_grads(scene, F32, native=True)
        plain = _depth_output_grads(scene, F32, native=False)
        for out in DEPTH_OUTPUTS:
            for name, want in exact[out].items():
                norm = float(want.norm())
                if norm == 0:
                    continue
                err = float((native[out][name].double() - want).norm()) / norm
                err_plain = float((plain[out][name].double() - want).norm()) / norm
                ratio = err / max(err_plain, 1e-5)
                if ratio > worst[out][0]:
                    worst[out] = (ratio, f"seed {seed}, gamma {gamma}, {name}: {err:.1e} against {err_plain:.1e}")
    for out, (ratio, where) in worst.items():
        assert ratio <= 8.0, f"{out}: float32 gradient error {ratio:.1f}x a plain float32 evaluation's ({where})"


# ---------------------------------------------------------------------------------------
# min_depth = 0 for any focal length.
@pytest.mark.parametrize("dtype", [F32, F64])
@pytest.mark.parametrize("focal", [0.5, 64.0, 100.0, 4096.0, 3.0e9])
def test_min_depth_zero_works_for_any_focal_length(focal, dtype):
    """focal + 2e-6 rounds back to the focal length in float32 from 64 on: the near depth
    is then the next value above it, the same in the native conversion, the value checks
    and the reference, and the call renders (a near depth equal to the focal length would
    be refused)."""
    cam = torch.tensor([0, 0, 0, 0, 0, 0, focal, focal], dtype=dtype, requires_grad=True)
    focal_t = cam[6:7].detach()
    near = _checks.resolve_near(0.0, focal_t)
    assert bool(near > focal_t)
    step = torch.nextafter(focal_t, torch.tensor([float("inf")], dtype=dtype)) - focal_t
    assert float(near - focal_t) == max(float(step), float((focal_t + 2e-6) - focal_t))
    assert torch.equal(resolve_min_depth(0.0, focal_t), near)
    assert torch.equal(resolve_min_depth(torch.tensor(0.0, dtype=dtype), focal_t), near)
    packed = pulsar_py.ops.pack_cameras(
        cam.detach()[None], pulsar_py.ops.PackSettings(16, 12, False, False, False, 0.0, 10 * focal).encode()
    )
    assert torch.equal(packed[:, 13], near)
    renderer = Renderer(16, 12)
    pos = torch.tensor([[0.0, 0.0, 3 * focal]], dtype=dtype)
    col, rad = torch.tensor([[0.2, 0.4, 0.6]], dtype=dtype), torch.tensor([focal], dtype=dtype)
    image = renderer(pos, col, rad, cam, 0.1, 10 * focal, min_depth=0.0)
    assert bool((image != 1).any())
    result = renderer.render(pos, col, rad, cam, 0.1, 10 * focal, min_depth=0.0)
    result.depth.sum().backward()
    assert bool(torch.isfinite(cam.grad).all()) and float(cam.grad[6].abs()) > 0
    # A Camera's film distance follows the same rule.
    camera = Camera(
        torch.eye(3, dtype=dtype), torch.zeros(3, dtype=dtype), focal, focal, 7.5, 5.5, (12, 16), film_distance=focal
    )
    assert bool((renderer.render(pos, col, rad, camera, 0.1, 10 * focal, min_depth=0.0).coverage > 0).any())
    assert bool(renderer.visible(pos, rad, cam.detach(), 10 * focal)[0])


def test_min_depth_zero_gradient_reaches_the_focal_length_where_the_sum_rounds_back():
    """The near depth moves with the focal length (derivative 1) in both branches."""
    for focal, dtype in ((100.0, F32), (0.5, F32), (100.0, F64)):
        f = torch.tensor([focal], dtype=dtype, requires_grad=True)
        (grad,) = torch.autograd.grad(_checks.resolve_near(0.0, f).sum(), f)
        assert float(grad) == 1.0
        (grad,) = torch.autograd.grad(resolve_min_depth(0.0, f).sum(), f)
        assert float(grad) == 1.0


# ---------------------------------------------------------------------------------------
# visible() checks as rendering does.
def _visible_args():
    pos = torch.tensor([[0.0, 0.0, 3.0], [0.5, 0.2, 5.0]], dtype=F64)
    rad = torch.tensor([0.5, 0.7], dtype=F64)
    cam = torch.tensor([0, 0, 0, 0, 0, 0, 1.0, 1.0], dtype=F64)
    return dict(vert_pos=pos, vert_rad=rad, camera=cam, max_depth=10.0)


def _with(name, index, value):
    def apply(kw):
        kw = dict(kw)
        t = kw[name].clone()
        t.view(-1)[index] = value
        kw[name] = t
        return kw

    return apply


VISIBLE_CASES = {
    "rad_negative": (_with("vert_rad", 0, -1.0), "vert_rad"),
    "rad_zero": (_with("vert_rad", 1, 0.0), "vert_rad"),
    "rad_nan": (_with("vert_rad", 0, float("nan")), "vert_rad"),
    "rad_huge": (_with("vert_rad", 0, 1e200), "vert_rad"),
    "pos_nan": (_with("vert_pos", 2, float("nan")), "vert_pos"),
    "pos_inf": (_with("vert_pos", 1, float("inf")), "vert_pos"),
    "camera_nan": (_with("camera", 1, float("nan")), "camera"),
    "camera_inf": (_with("camera", 4, float("inf")), "camera"),
    "focal_negative": (_with("camera", 6, -1.0), "camera"),
    "sensor_zero": (_with("camera", 7, 0.0), "camera"),
    "min_depth_below_focal": (lambda kw: dict(kw, min_depth=0.5), "min_depth"),
    "max_depth_negative": (lambda kw: dict(kw, max_depth=-1.0), "max_depth"),
    "max_depth_nan": (lambda kw: dict(kw, max_depth=float("nan")), "max_depth"),
}


@pytest.mark.parametrize("case", list(VISIBLE_CASES))
def test_visible_rejects_bad_values_naming_the_argument(case):
    edit, name = VISIBLE_CASES[case]
    renderer = Renderer(16, 12)
    assert renderer.visible(**_visible_args()).tolist() == [True, True]
    with pytest.raises(ValueError, match=name):
        renderer.visible(**edit(_visible_args()))
    assert renderer.visible(**_visible_args()).tolist() == [True, True]


def test_visible_rejects_a_bad_camera_object_and_takes_check_values_off():
    renderer = Renderer(16, 12)
    camera = Camera(torch.eye(3, dtype=F64), torch.zeros(3, dtype=F64), 10.0, 10.0, 7.5, 5.5, (12, 16))
    args = dict(_visible_args(), camera=camera)
    assert renderer.visible(**args).tolist() == [True, True]
    bad = dict(
        args,
        camera=Camera(
            torch.eye(3, dtype=F64), torch.tensor([0.0, float("nan"), 0.0], dtype=F64), 10.0, 10.0, 7.5, 5.5, (12, 16)
        ),
    )
    with pytest.raises(ValueError, match="translation"):
        renderer.visible(**bad)
    with pytest.raises(ValueError, match="vert_rad"):
        renderer.visible(**_with("vert_rad", 0, -1.0)(args))
    # Off, bad values are not read, and nothing crashes.
    renderer.check_values = False
    out = renderer.visible(**_with("vert_rad", 0, -1.0)(_visible_args()))
    assert out.dtype == torch.bool and out.shape == (2,)


# ---------------------------------------------------------------------------------------
# The constructor's limits, and layouts every entry point refuses.
@pytest.mark.parametrize(
    "name,value",
    [
        ("n_channels", _checks.MAX_CHANNELS + 1),
        ("n_channels", 2**40),
        ("num_threads", _checks.MAX_THREADS + 1),
        ("num_threads", 2**31),
    ],
)
def test_constructor_limits_name_the_argument(name, value):
    with pytest.raises(ValueError, match=name):
        Renderer(16, 12, **{name: value})
    Renderer(
        16, 12, **{name: value - 1 if value == _checks.MAX_CHANNELS + 1 or value == _checks.MAX_THREADS + 1 else 2}
    )


def _entry_kwargs():
    scene = random_scene(3, n_spheres=6, width=16, height=12)
    return scene, scene.call_kwargs(F64)


def _sparse(t):
    return t.to_sparse()


def _nested(t):
    return torch.nested.nested_tensor([t, t])


def _meta(t):
    return t.to("meta")


LAYOUTS = {"sparse_coo": _sparse, "nested": _nested, "meta": _meta}
ENTRY_ARGUMENTS = {
    "forward": ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params"),
    "render": ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "camera"),
    "visible": ("vert_pos", "vert_rad", "camera"),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("entry", list(ENTRY_ARGUMENTS))
def test_sparse_nested_and_meta_tensors_are_refused_naming_the_argument(entry, layout):
    scene, kwargs = _entry_kwargs()
    renderer = scene.renderer()
    if entry != "forward":
        kwargs["camera"] = kwargs.pop("cam_params")
    if entry == "visible":
        kwargs = dict(
            vert_pos=kwargs["vert_pos"],
            vert_rad=kwargs["vert_rad"],
            camera=kwargs["camera"],
            max_depth=scene.max_depth,
            min_depth=scene.min_depth,
        )
    call = {"forward": renderer.forward, "render": renderer.render, "visible": renderer.visible}[entry]
    reference = call(**kwargs)
    for name in ENTRY_ARGUMENTS[entry]:
        bad = dict(kwargs)
        bad[name] = LAYOUTS[layout](kwargs[name])
        with pytest.raises(BAD_INPUT, match=name):
            call(**bad)
    again = call(**kwargs)
    assert torch.equal(again.image if entry == "render" else again, reference.image if entry == "render" else reference)


def test_a_renderer_on_the_meta_device_refuses_meta_tensors_naming_the_argument():
    # Meta tensors have shapes but no values: nothing to render, whichever device the
    # renderer was moved to.
    scene, kwargs = _entry_kwargs()
    renderer = scene.renderer().to("meta")
    meta = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    with pytest.raises(ValueError, match="vert_pos: expected a tensor with values .* meta device"):
        renderer(**meta)
    camera = meta.pop("cam_params")
    with pytest.raises(ValueError, match="vert_pos: expected a tensor with values .* meta device"):
        renderer.render(**meta, camera=camera)
    with pytest.raises(ValueError, match="vert_pos: expected a tensor with values .* meta device"):
        renderer.visible(meta["vert_pos"], meta["vert_rad"], camera, max_depth=scene.max_depth)


SCALAR_TENSORS = {
    "gamma": 0.1,
    "max_depth": None,
    "min_depth": None,
    "percent_allowed_difference": 0.01,
    "max_n_hits": 3,
}


@pytest.mark.parametrize("layout", ["nested", "meta"])
@pytest.mark.parametrize("entry", ["forward", "render"])
def test_nested_and_meta_tensors_as_settings_are_refused_naming_the_argument(entry, layout):
    scene, kwargs = _entry_kwargs()
    renderer = scene.renderer()
    if entry == "render":
        kwargs["camera"] = kwargs.pop("cam_params")
    call = renderer.forward if entry == "forward" else renderer.render
    call(**kwargs)
    for name, value in SCALAR_TENSORS.items():
        value = kwargs[name] if value is None else value
        t = torch.tensor(value, dtype=torch.int64 if name == "max_n_hits" else F64)
        bad = t.to("meta") if layout == "meta" else torch.nested.nested_tensor([t.reshape(1)])
        with pytest.raises(
            BAD_INPUT,
            match=f"{name}: expected a dense .*nested"
            if layout == "nested"
            else f"{name}: expected a tensor with values .* meta device",
        ):
            call(**dict(kwargs, **{name: bad}))
