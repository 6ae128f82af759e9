"""CUDA vs CPU: the same function and the same gradients.

Forward to 1e-5. Gradients: float64 to 1e-9 of the largest magnitude of each gradient
group, element-wise; float32 to 1e-4 in norm, |g_cuda - g_cpu| / |g_cpu| per group. The
float32 norm metric is deliberate: a pair within float32 rounding of a silhouette has
dh/dl ~ 1/h, so its own term differs by up to ~1e-3 between any two roundings (the GPU
backward contracts multiply-adds, the CPU does not), while the gradient as a whole agrees.
Skipped without a GPU.
"""

from __future__ import annotations

import pytest
import torch
from helpers import HAS_CUDA, native_of

from pulsar_py import Renderer
from pulsar_py.tools.bench import binned_instances

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU and a CUDA build")]

GRAD_RTOL = {torch.float32: 1e-4, torch.float64: 1e-9}


def _scene(seed, n, channels, batch, ortho, dtype, shared=False):
    """Spheres [batch, n] (one set per camera), or [n] (shared: one set for the batch's
    cameras; batch 0: one camera [10])."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, n) if batch and not shared else (n,)
    pos = torch.rand(shape + (3,), generator=g, dtype=torch.float64)
    pos = pos * torch.tensor([6.0, 4.5, 6.0], dtype=torch.float64) + torch.tensor(
        [-3.0, -2.25, 12.0], dtype=torch.float64
    )
    col = torch.rand(shape + (channels,), generator=g, dtype=torch.float64)
    rad = 0.05 + 0.5 * torch.rand(shape, generator=g, dtype=torch.float64)
    opa = 0.1 + 0.9 * torch.rand(shape, generator=g, dtype=torch.float64)
    bg = torch.rand(channels, generator=g, dtype=torch.float64)
    cams = []
    for k in range(batch or 1):
        focal, sensor = (0.0, 7.0) if ortho else (4.0 + 0.2 * k, 2.0)
        cams.append([0.1 * k, -0.05 * k, 0.0, 0.02 * k, -0.03, 0.01, focal, sensor, 0.3, -0.7])
    cam = torch.tensor(cams, dtype=torch.float64)
    if not batch:
        cam = cam[0]
    return [t.to(dtype) for t in (pos, col, rad, opa, bg, cam)]


def _render_and_grad(device, tensors, renderer_kw, call_kw, row_budget=0):
    """(image, hit counts, forward info, gradients of every input) on CPU tensors;
    row_budget: the CUDA backward's bytes of gradient rows per window (0: default)."""
    leaves = [t.to(device).clone().requires_grad_() for t in tensors]
    pos, col, rad, opa, bg, cam = leaves
    renderer = Renderer(**renderer_kw).to(device)
    renderer._backward_row_budget = row_budget
    image, info = renderer(pos, col, rad, cam, bg_col=bg, opacity=opa, return_forward_info=True, **call_kw)
    hits = renderer(pos, col, rad, cam, bg_col=bg, opacity=opa, mode=1, **call_kw)
    weights = torch.linspace(-1, 1, image.numel(), dtype=image.dtype, device=device).reshape(image.shape)
    grads = torch.autograd.grad((image * weights).sum(), leaves)
    return image.detach().cpu(), hits.cpu(), info.cpu(), [g.cpu() for g in grads]


def _assert_gpu_matches_cpu(gpu, cpu, dtype):
    """Image to 1e-5; hit counts and tracked ids on 99.9 % of pixels; gradients (all
    non-zero) to GRAD_RTOL (see the module docstring for the metrics)."""
    torch.testing.assert_close(gpu[0], cpu[0], atol=1e-5, rtol=0)
    assert (gpu[1] == cpu[1]).float().mean() >= 0.999
    ids_cpu = Renderer.sphere_ids_from_result_info_nograd(cpu[2])
    ids_gpu = Renderer.sphere_ids_from_result_info_nograd(gpu[2])
    assert (ids_cpu == ids_gpu).float().mean() >= 0.999
    _assert_grads_match(["pos", "col", "rad", "opa", "bg", "cam"], gpu[3], cpu[3], dtype)


def _assert_grads_match(names, gpu_grads, cpu_grads, dtype):
    """Every CPU gradient non-zero, and the CUDA one within GRAD_RTOL of it (the module
    docstring's metrics)."""
    for name, g_gpu, g_cpu in zip(names, gpu_grads, cpu_grads):
        assert g_cpu.abs().max() > 0, f"{name}: zero gradient"
        if dtype == torch.float64:
            err = (g_gpu - g_cpu).abs().max() / g_cpu.abs().max()
        else:
            err = (g_gpu - g_cpu).norm() / g_cpu.norm()
        assert err <= GRAD_RTOL[dtype], f"{name}: relative error {err:.3g}"


CASES = [
    # seed, n, channels, batch, ortho, right_handed, percent, gamma
    (0, 60, 3, 0, False, False, 0.0, 0.1),
    (1, 60, 1, 0, False, True, 0.01, 0.3),
    (2, 60, 4, 2, False, False, 0.0, 0.05),
    (3, 40, 5, 0, True, False, 0.0, 0.2),  # generic channel path
    (4, 40, 8, 3, False, False, 0.02, 1.0),
    (5, 300, 3, 0, False, False, 0.0, 0.1),  # many spheres per tile
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", CASES, ids=[f"case{c[0]}" for c in CASES])
def test_cuda_matches_cpu(case, dtype):
    seed, n, channels, batch, ortho, rh, percent, gamma = case
    tensors = _scene(seed, n, channels, batch, ortho, dtype)
    if rh:
        tensors[0] = tensors[0] * torch.tensor([1.0, 1.0, -1.0], dtype=dtype)
    renderer_kw = dict(
        width=37, height=29, n_channels=channels, orthogonal_projection=ortho, right_handed_system=rh, n_track=4
    )
    call_kw = dict(gamma=gamma, max_depth=30.0, min_depth=1.0 if ortho else 0.0, percent_allowed_difference=percent)
    cpu = _render_and_grad("cpu", tensors, renderer_kw, call_kw)
    gpu = _render_and_grad("cuda", tensors, renderer_kw, call_kw)
    assert (cpu[1] > 0).float().mean() > 0.2, "scene draws too little to compare"
    _assert_gpu_matches_cpu(gpu, cpu, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("channels", [3, 5])
def test_cuda_matches_cpu_without_opacity(channels, dtype):
    """No opacity input (performance.md's W1): the CUDA backward's kernel without dL/dopacity
    (3 channels) and the generic one (5) give the CPU's gradients."""
    pos, col, rad, _, bg, cam = _scene(6, 60, channels, 0, False, dtype)
    renderer_kw = dict(width=37, height=29, n_channels=channels)
    results = {}
    for device in ("cpu", "cuda"):
        leaves = [t.to(device).clone().requires_grad_() for t in (pos, col, rad, bg, cam)]
        image = Renderer(**renderer_kw).to(device)(
            leaves[0], leaves[1], leaves[2], leaves[4], bg_col=leaves[3], gamma=0.1, max_depth=30.0
        )
        weights = torch.linspace(-1, 1, image.numel(), dtype=image.dtype, device=device).reshape(image.shape)
        grads = torch.autograd.grad((image * weights).sum(), leaves)
        results[device] = (image.detach().cpu(), [g.cpu() for g in grads])
    torch.testing.assert_close(results["cuda"][0], results["cpu"][0], atol=1e-5, rtol=0)
    _assert_grads_match(["pos", "col", "rad", "bg", "cam"], results["cuda"][1], results["cpu"][1], dtype)


@pytest.mark.parametrize("channels", [3, 5])
def test_cuda_nan_image_gradient_reaches_only_the_pixels_hits(channels):
    """A NaN in dL/dimage at one pixel (value checks off) reaches the gradients of the
    spheres that pixel hit, as on the CPU, and no others: a sphere whose box covers the
    pixel but misses it adds nothing there (3 channels: features summed in registers; 5:
    the generic path, summed per warp). In float64: in float32 the two backends may
    round a silhouette pair of the chosen pixel to a hit and a miss."""
    dtype = torch.float64
    pos, col, rad, opa, bg, cam = _scene(8, 60, channels, 0, False, dtype)
    renderer_kw = dict(width=37, height=29, n_channels=channels)
    call_kw = dict(gamma=0.1, max_depth=30.0)
    hits = Renderer(**renderer_kw)(pos, col, rad, cam, bg_col=bg, opacity=opa, mode=1, **call_kw)[..., 0]
    y, x = divmod(int(torch.argmax(hits.flatten())), hits.shape[1])  # a pixel with hits
    grad_image = torch.linspace(-1, 1, 29 * 37 * channels, dtype=dtype).reshape(29, 37, channels)
    grad_image[y, x, 0] = float("nan")
    results = {}
    for device in ("cpu", "cuda"):
        leaves = [t.to(device).clone().requires_grad_() for t in (pos, col, rad, opa)]
        renderer = Renderer(**renderer_kw).to(device)
        renderer.check_values = False
        image = renderer(
            leaves[0], leaves[1], leaves[2], cam.to(device), bg_col=bg.to(device), opacity=leaves[3], **call_kw
        )
        results[device] = [g.cpu() for g in torch.autograd.grad(image, leaves, grad_image.to(device))]
    for name, g_gpu, g_cpu in zip(["pos", "col", "rad", "opa"], results["cuda"], results["cpu"]):
        nan_cpu = torch.isnan(g_cpu).reshape(g_cpu.shape[0], -1).any(1)
        assert 0 < int(nan_cpu.sum()) < g_cpu.shape[0], f"{name}: the NaN should reach some spheres, not all"
        assert torch.equal(torch.isnan(g_gpu).reshape(g_gpu.shape[0], -1).any(1), nan_cpu), name
        _assert_grads_match([name], [g_gpu[~nan_cpu]], [g_cpu[~nan_cpu]], dtype)


def _box_spheres(seed, n, low, extent, radius):
    """n spheres (float64) with centres uniform in the box low + [0, extent) (3 values
    each), colours uniform in [0, 1]^3 and radii radius[0] + radius[1] * U(0, 1), drawn in
    that order, and the generator for further draws."""
    g = torch.Generator().manual_seed(seed)
    pos = torch.rand(n, 3, generator=g, dtype=torch.float64) * torch.tensor(extent, dtype=torch.float64) + torch.tensor(
        low, dtype=torch.float64
    )
    col = torch.rand(n, 3, generator=g, dtype=torch.float64)
    rad = radius[0] + radius[1] * torch.rand(n, generator=g, dtype=torch.float64)
    return pos, col, rad, g


def _large_opaque_scene(dtype):
    """About 1300 spheres of 14 to 48 px radius over each pixel, nearly opaque: early
    termination stops pixels after about a quarter of their hits (performance.md's W1,
    scaled down)."""
    pos, col, rad, g = _box_spheres(11, 6000, [-4.0, -3.0, 15.0], [8.0, 6.0, 20.0], (2.0, 1.0))
    n = pos.shape[0]
    opa = 0.8 + 0.2 * torch.rand(n, generator=g, dtype=torch.float64)
    bg = torch.rand(3, generator=g, dtype=torch.float64)
    cam = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 2.0], dtype=torch.float64)
    return [t.to(dtype) for t in (pos, col, rad, opa, bg, cam)]


def _stored_instances(tensors, renderer_kw, percent):
    """(tile, sphere) instances the CUDA binning stores for the scene at gamma 0.1, max
    depth 45 and the given percent_allowed_difference."""
    renderer = Renderer(**renderer_kw).cuda()
    pos, col, rad, opa, bg, cam = (t.cuda() for t in tensors)
    renderer(pos, col, rad, cam, gamma=0.1, max_depth=45.0, bg_col=bg, opacity=opa, percent_allowed_difference=percent)
    return binned_instances(renderer, torch.device("cuda"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_cuda_depth_cut_is_exact_and_stores_less(dtype):
    """The CUDA binning stores only what early termination can reach (tile_depth_bound.cu):
    the same image, hit counts, tracked ids and gradients as the CPU, which walks whole
    lists, from a fraction of the instances the same scene stores without termination."""
    tensors = _large_opaque_scene(dtype)
    renderer_kw = dict(width=96, height=80, n_channels=3, n_track=4)
    call_kw = dict(gamma=0.1, max_depth=45.0, percent_allowed_difference=0.01)
    cpu = _render_and_grad("cpu", tensors, renderer_kw, call_kw)
    gpu = _render_and_grad("cuda", tensors, renderer_kw, call_kw)
    pos, col, rad, opa, bg, cam = tensors
    all_hits = Renderer(**renderer_kw)(
        pos, col, rad, cam, gamma=0.1, max_depth=45.0, opacity=opa, percent_allowed_difference=0.0, mode=1
    )
    assert cpu[1].float().mean() < 0.4 * all_hits.mean(), "termination should stop pixels early in this scene"
    _assert_gpu_matches_cpu(gpu, cpu, dtype)
    stored = {percent: _stored_instances(tensors, renderer_kw, percent) for percent in (0.01, 0.0)}
    # About a quarter of the hits are processed; the bound is looser than that ideal
    # (spheres under 15.5 px radius never count as covering a tile).
    assert 0 < stored[0.01] < 0.75 * stored[0.0], stored


@pytest.mark.parametrize("max_n_hits", [None, 3], ids=["uncapped", "cap3"])
def test_cuda_common_call_matches_cpu(max_n_hits):
    """The common call (float, 3 channels, no forward info) over large spheres, which the
    CUDA forward renders two pixels per thread, or with a hit cap one (render_forward.cu):
    the CPU's image and hit counts, and with the cap no pixel past it."""
    pos, col, rad, opa, bg, cam = _large_opaque_scene(torch.float32)
    images, hits = {}, {}
    for device in ("cpu", "cuda"):
        renderer = Renderer(96, 80, n_channels=3).to(device)
        args = [t.to(device) for t in (pos, col, rad, cam)]
        call_kw = dict(
            gamma=0.1,
            max_depth=45.0,
            percent_allowed_difference=0.01,
            max_n_hits=max_n_hits,
            bg_col=bg.to(device),
            opacity=opa.to(device),
        )
        images[device] = renderer(*args, **call_kw).cpu()
        hits[device] = renderer(*args, mode=1, **call_kw).cpu()
    torch.testing.assert_close(images["cuda"], images["cpu"], atol=1e-5, rtol=0)
    assert (hits["cuda"] == hits["cpu"]).float().mean() >= 0.999
    if max_n_hits is None:
        assert hits["cpu"].max() > 3, "the scene should give pixels more hits than the cap"
    else:
        assert hits["cuda"].max() == max_n_hits


def _deep_cover_scene(dtype):
    """_large_opaque_scene with one small sphere near the camera: the first quarter of the
    depth buckets then holds nothing that covers a tile, so every tile's bound comes from
    the later cover passes (tile_depth_bound.cu)."""
    pos, col, rad, opa, bg, cam = _large_opaque_scene(torch.float64)
    pos[0] = torch.tensor([0.1, -0.2, 5.0], dtype=torch.float64)
    rad[0] = 0.02
    return [t.to(dtype) for t in (pos, col, rad, opa, bg, cam)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_cuda_depth_cut_from_deep_covering_spheres(dtype):
    """When the spheres that cover tiles all lie deep, the later cover passes still cut
    the lists (without them no tile would have a bound), and the result is the CPU's."""
    tensors = _deep_cover_scene(dtype)
    renderer_kw = dict(width=96, height=80, n_channels=3, n_track=4)
    call_kw = dict(gamma=0.1, max_depth=45.0, percent_allowed_difference=0.01)
    cpu = _render_and_grad("cpu", tensors, renderer_kw, call_kw)
    gpu = _render_and_grad("cuda", tensors, renderer_kw, call_kw)
    _assert_gpu_matches_cpu(gpu, cpu, dtype)
    stored = {percent: _stored_instances(tensors, renderer_kw, percent) for percent in (0.01, 0.0)}
    assert 0 < stored[0.01] < 0.75 * stored[0.0], stored


@pytest.mark.parametrize("scene", [_large_opaque_scene, _deep_cover_scene], ids=["near", "deep"])
def test_cuda_depth_cut_is_the_same_for_either_cover_schedule(scene):
    """Without opacity the depth bound runs its opaque schedule of cover passes, with one
    its translucent schedule (CoverSchedule, tile_depth_bound.cu); an opacity of ones is
    the same scene, so both must store the same instances, and a cut that both make
    (fewer instances than without termination)."""
    pos, col, rad, _, bg, cam = (t.float().cuda() for t in scene(torch.float32))
    renderer = Renderer(96, 80, n_channels=3).cuda()
    kw = dict(gamma=0.1, max_depth=45.0, bg_col=bg)
    stored = {}
    for name, opacity, percent in (("opaque", None, 0.01), ("ones", torch.ones_like(rad), 0.01), ("uncut", None, 0.0)):
        images = renderer(pos, col, rad, cam, opacity=opacity, percent_allowed_difference=percent, **kw)
        stored[name] = (binned_instances(renderer, torch.device("cuda")), images)
    assert stored["opaque"][0] == stored["ones"][0], {k: v[0] for k, v in stored.items()}
    assert stored["opaque"][0] < 0.75 * stored["uncut"][0], {k: v[0] for k, v in stored.items()}
    torch.testing.assert_close(stored["ones"][1], stored["opaque"][1], rtol=0, atol=1e-6)


def _wide_band_scene():
    """W1's spheres (x in [-5, 5], depth 25 to 35, no opacity) in a thin band seen by a
    wide image, 1104 x 48 px (69 x 3 tiles: two words per row of tile bits), with two
    cameras: the spheres thin out towards the image's left and right borders, where
    pixels process every hit (the middle's stop after about a quarter of theirs), so the
    tiles' depth bounds differ across the image."""
    pos, col, rad, _ = _box_spheres(31, 16000, [-5.0, -0.35, 25.0], [10.0, 0.7, 10.0], (0.1, 0.5))
    cams = torch.tensor(
        [[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 2.0], [0.4, 0.02, 0.0, 0.0, 0.01, 0.0, 5.0, 2.0]], dtype=torch.float64
    )
    return [t.float() for t in (pos, col, rad, cams)]


def test_cuda_depth_cut_per_camera_on_a_wide_image():
    """A later cover pass takes only spheres over tiles the passes before left unsettled,
    which it finds per camera and tile row (tile_depth_bound.cu): on a wide image with two
    cameras the image is the CPU's, and a batch of both cameras stores exactly what the
    two cameras store alone."""
    pos, col, rad, cams = _wide_band_scene()
    kw = dict(gamma=0.1, max_depth=45.0, percent_allowed_difference=0.01)
    renderer = Renderer(1104, 48, n_channels=3).cuda()
    image = renderer(pos.cuda(), col.cuda(), rad.cuda(), cams.cuda(), **kw).cpu()
    both = binned_instances(renderer, torch.device("cuda"))
    alone = 0
    for cam in cams:
        renderer(pos.cuda(), col.cuda(), rad.cuda(), cam.cuda(), **kw)
        alone += binned_instances(renderer, torch.device("cuda"))
    assert both == alone, (both, alone)
    renderer(pos.cuda(), col.cuda(), rad.cuda(), cams.cuda(), **dict(kw, percent_allowed_difference=0.0))
    uncut = binned_instances(renderer, torch.device("cuda"))
    assert both < 0.75 * uncut, f"the depth cut should store less: {both} of {uncut}"
    expected = Renderer(1104, 48, n_channels=3)(pos, col, rad, cams, **kw)
    # Pixels whose termination flips with rounding (a sphere at the stop depth) differ by
    # up to the share p of one hit: 0.1 % of them may.
    close = ((image - expected).abs() <= 1e-5).all(-1).float().mean().item()
    assert close >= 0.999, f"{close:.5f} of the pixels within 1e-5 of the CPU's"


def test_cuda_backward_is_deterministic():
    tensors = _scene(7, 200, 3, 2, False, torch.float32)
    kw = dict(width=64, height=48, n_channels=3)
    call = dict(gamma=0.1, max_depth=30.0)
    first = _render_and_grad("cuda", tensors, kw, call)[3]
    second = _render_and_grad("cuda", tensors, kw, call)[3]
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize(("batch", "shared"), [(0, False), (2, False), (2, True)], ids=["one", "per-camera", "shared"])
def test_cuda_gradients_of_spheres_over_many_tiles(batch, shared, dtype):
    """Spheres over 3 or more tiles each on average: the sphere gradients are reduced in two
    passes (per depth rank, then per sphere over its cameras; reduce_gradients.cu), with one
    set of spheres per camera or one set for both cameras, and match the CPU."""
    g = torch.Generator().manual_seed(21)
    n = 150
    shape = (batch, n) if batch and not shared else (n,)
    pos = torch.rand(shape + (3,), generator=g, dtype=torch.float64) * torch.tensor(
        [8.0, 6.0, 10.0], dtype=torch.float64
    ) + torch.tensor([-4.0, -3.0, 15.0], dtype=torch.float64)
    col = torch.rand(shape + (3,), generator=g, dtype=torch.float64)
    rad = 1.0 + torch.rand(shape, generator=g, dtype=torch.float64)
    opa = 0.1 + 0.9 * torch.rand(shape, generator=g, dtype=torch.float64)
    bg = torch.rand(3, generator=g, dtype=torch.float64)
    cam = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 2.0], dtype=torch.float64)
    if batch:
        cam = torch.stack([cam, cam + torch.tensor([0.3, -0.2, 0.0, 0.0, 0.02, 0.0, 0.0, 0.0], dtype=torch.float64)])
    tensors = [t.to(dtype) for t in (pos, col, rad, opa, bg, cam)]
    renderer_kw = dict(width=96, height=80, n_channels=3, n_track=4)
    call_kw = dict(gamma=0.2, max_depth=40.0, percent_allowed_difference=0.0)
    renderer = Renderer(**renderer_kw).cuda()
    p, c, r, o, b, k = (t.cuda() for t in tensors)
    renderer(p, c, r, k, bg_col=b, opacity=o, **call_kw)
    instances = binned_instances(renderer, torch.device("cuda"))
    assert instances >= 3 * n * max(batch, 1), f"{instances} instances: the one-pass reduction would run"
    cpu = _render_and_grad("cpu", tensors, renderer_kw, call_kw)
    gpu = _render_and_grad("cuda", tensors, renderer_kw, call_kw)
    _assert_gpu_matches_cpu(gpu, cpu, dtype)


def test_cuda_backward_zeroes_the_rows_of_tiles_a_sphere_misses():
    """Spheres of 30 to 75 pixels' radius: their boxes hold tiles that their images miss
    (the corners), which the float backward's cone rectangles leave without a pixel and
    hand to no warp; their loader zeroes their gradient rows. The renderer renders a larger
    scene first, so that the rows' memory holds other values (and is not reallocated): the
    gradients still match the CPU."""
    g = torch.Generator().manual_seed(31)
    n, width, height = 40, 160, 128
    pos = torch.rand(n, 3, generator=g, dtype=torch.float64) * torch.tensor(
        [8.0, 6.0, 10.0], dtype=torch.float64
    ) + torch.tensor([-4.0, -3.0, 15.0], dtype=torch.float64)
    col = torch.rand(n, 3, generator=g, dtype=torch.float64)
    rad = 1.5 + 1.5 * torch.rand(n, generator=g, dtype=torch.float64)
    opa = 0.1 + 0.9 * torch.rand(n, generator=g, dtype=torch.float64)
    bg = torch.rand(3, generator=g, dtype=torch.float64)
    cam = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 2.0], dtype=torch.float64)
    # Tiles of a sphere's box whose every pixel lies 2 pixels or more outside its disc (the
    # pinhole projection of its centre and radius): the scene must have many.
    pixel = 2.0 / width
    centre_x = pos[:, 0] * 5.0 / pos[:, 2] / pixel + width / 2
    centre_y = pos[:, 1] * 5.0 / pos[:, 2] / pixel + height / 2
    radius_px = rad * 5.0 / pos[:, 2] / pixel
    assert radius_px.min() > 25
    missed = 0
    for cx, cy, r in zip(centre_x.tolist(), centre_y.tolist(), radius_px.tolist()):
        for ty in range(max(int(cy - r), 0) // 16, min(int(cy + r), height - 1) // 16 + 1):
            for tx in range(max(int(cx - r), 0) // 16, min(int(cx + r), width - 1) // 16 + 1):
                near_x = min(max(cx, 16 * tx), 16 * tx + 15)
                near_y = min(max(cy, 16 * ty), 16 * ty + 15)
                missed += (near_x - cx) ** 2 + (near_y - cy) ** 2 > (r + 2) ** 2
    assert missed >= 20, f"{missed} tiles missed: too few to test"
    renderer_kw = dict(width=width, height=height, n_channels=3, n_track=4)
    call_kw = dict(gamma=0.2, max_depth=40.0, percent_allowed_difference=0.0)
    tensors = [t.to(torch.float32) for t in (pos, col, rad, opa, bg, cam)]
    renderer = Renderer(**renderer_kw).cuda()
    # The first scene: the same spheres at 1.3 times the radius, more instances.
    leaves = [t.cuda().clone().requires_grad_() for t in tensors]
    leaves[2] = (1.3 * tensors[2]).cuda().requires_grad_()
    p, c, r, o, b, k = leaves
    renderer(p, c, r, k, bg_col=b, opacity=o, **call_kw).sum().backward()
    leaves = [t.cuda().clone().requires_grad_() for t in tensors]
    p, c, r, o, b, k = leaves
    image = renderer(p, c, r, k, bg_col=b, opacity=o, **call_kw)
    weights = torch.linspace(-1, 1, image.numel(), dtype=image.dtype, device=image.device).reshape(image.shape)
    gpu = [t.cpu() for t in torch.autograd.grad((image * weights).sum(), leaves)]
    cpu = _render_and_grad("cpu", tensors, renderer_kw, call_kw)[3]
    _assert_grads_match(["pos", "col", "rad", "opa", "bg", "cam"], gpu, cpu, torch.float32)


WINDOW_CASES = [
    # seed, n, channels, batch, ortho, shared
    (8, 300, 3, 2, False, False),  # static channels, several cameras
    (9, 200, 5, 0, True, False),  # generic channel path (features summed in the output)
    (10, 300, 3, 3, False, True),  # one set of spheres for three cameras: summed per sphere
    (11, 200, 5, 2, False, True),  # the same with the generic channel path
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("case", WINDOW_CASES, ids=[f"case{c[0]}" for c in WINDOW_CASES])
def test_cuda_backward_windows_give_the_same_gradients(case, dtype):
    """A row budget of 7 rows cuts the backward into dozens of windows of slots, each a run
    from the middle of many tiles' lists: the gradients match the CPU as in one window,
    and the one-window gradients up to float rounding."""
    seed, n, channels, batch, ortho, shared = case
    tensors = _scene(seed, n, channels, batch, ortho, dtype, shared)
    renderer_kw = dict(width=37, height=29, n_channels=channels, orthogonal_projection=ortho, n_track=4)
    call_kw = dict(gamma=0.2, max_depth=30.0, min_depth=1.0 if ortho else 0.0)
    rows = 7
    row_bytes = (5 + channels) * tensors[0].element_size()
    cpu = _render_and_grad("cpu", tensors, renderer_kw, call_kw)
    one = _render_and_grad("cuda", tensors, renderer_kw, call_kw)
    many = _render_and_grad("cuda", tensors, renderer_kw, call_kw, row_budget=rows * row_bytes)
    again = _render_and_grad("cuda", tensors, renderer_kw, call_kw, row_budget=rows * row_bytes)
    renderer = Renderer(**renderer_kw).cuda()
    pos, col, rad, opa, bg, cam = (t.cuda() for t in tensors)
    renderer(pos, col, rad, cam, bg_col=bg, opacity=opa, **call_kw)
    instances = binned_instances(renderer, torch.device("cuda"))
    assert instances > 20 * rows, f"{instances} instances: too few for many windows"
    _assert_gpu_matches_cpu(many, cpu, dtype)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for name, g_many, g_one, g_again in zip(["pos", "col", "rad", "opa", "bg", "cam"], many[3], one[3], again[3]):
        torch.testing.assert_close(g_many, g_one, rtol=tol, atol=tol * g_one.abs().max().item(), msg=name)
        assert torch.equal(g_many, g_again), f"{name}: windowed backward not reproducible"


def test_cuda_memory_does_not_grow_over_frames():
    renderer = Renderer(96, 64, n_channels=3).cuda()
    g = torch.Generator().manual_seed(3)
    peak = []
    for frame in range(1000):
        n = 50 + int(torch.randint(0, 400, (1,), generator=g))
        pos = (torch.rand(n, 3, generator=g) * torch.tensor([6.0, 4.0, 6.0]) + torch.tensor([-3.0, -2.0, 12.0])).cuda()
        col = torch.rand(n, 3, generator=g).cuda().requires_grad_()
        rad = (0.1 + 0.4 * torch.rand(n, generator=g)).cuda()
        cam = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 4.0, 2.0]).cuda()
        image = renderer(pos, col, rad, cam, gamma=0.1, max_depth=30.0)
        image.sum().backward()
        if frame in (200, 999):
            torch.cuda.synchronize()
            peak.append((torch.cuda.memory_allocated(), native_of(renderer).scratch_bytes))
    assert peak[1][0] <= peak[0][0] + (1 << 20)
    # Scratch may still grow towards the largest frame, but not beyond twice that frame's need.
    assert peak[1][1] <= 2 * peak[0][1] + (1 << 20)


def test_cuda_depth_order_is_the_same_for_few_and_many_items():
    """A call of few (camera, sphere) items takes its depth order by counting, one of many
    by a radix sort (setup_bin.cu); both order by (depth, index). Pairs of identical
    spheres tie in depth, and which of a pair a pixel tracks first follows that order: two
    cameras in one call (18000 items: the sort) track the same ids as each camera alone
    (9000: the counting), and render the same image."""
    tensors = _scene(11, 9000, 3, 2, False, torch.float32)
    pos, col, rad, opa, bg, cam = (t.cuda() for t in tensors)
    pos[:, 1::2] = pos[:, 0::2]
    rad[:, 1::2] = rad[:, 0::2]
    renderer = Renderer(96, 80, n_channels=3, n_track=4).cuda()
    call_kw = dict(gamma=0.1, max_depth=30.0, bg_col=bg, return_forward_info=True)
    image, info = renderer(pos, col, rad, cam, opacity=opa, **call_kw)
    ids = Renderer.sphere_ids_from_result_info_nograd(info)
    assert ids[..., 1].ge(0).float().mean() > 0.5, "pixels should track two spheres or more"
    for b in range(2):
        image_b, info_b = renderer(pos[b], col[b], rad[b], cam[b], opacity=opa[b], **call_kw)
        torch.testing.assert_close(image_b, image[b], atol=1e-6, rtol=0)
        assert torch.equal(Renderer.sphere_ids_from_result_info_nograd(info_b)[0], ids[b])


def test_cuda_camera_gradient_of_a_second_backward():
    """The camera gradient's reduction counts its finished blocks on the device and resets
    the count: a second backward of the same forward (no binning in between) gives the
    same camera gradient, bit for bit."""
    pos, col, rad, opa, bg, cam = (t.cuda() for t in _scene(12, 200, 3, 2, False, torch.float32))
    cam.requires_grad_()
    image = Renderer(64, 48, n_channels=3).cuda()(pos, col, rad, cam, bg_col=bg, opacity=opa, gamma=0.1, max_depth=30.0)
    weights = torch.linspace(-1, 1, image.numel(), device="cuda").reshape(image.shape)
    (first,) = torch.autograd.grad((image * weights).sum(), cam, retain_graph=True)
    (second,) = torch.autograd.grad((image * weights).sum(), cam)
    assert first.abs().max() > 0
    assert torch.equal(first, second)


def test_cuda_instance_sort_is_the_same_by_counting_and_by_radix_sort():
    """A binning of at most 4096 tiles (all cameras) and few instances sorts its instances
    by counting, a larger one by a radix sort (tile_counting_sort.cu, setup_bin.cu); both
    keep each tile's instances in depth order. Two cameras of 720x720 (4050 tiles: the
    counting) and the same two with a third (6075: the radix sort) render those two
    cameras alike and track the same ids, on a scene of depth ties (identical sphere
    pairs), whose tracking follows the list order."""
    tensors = _scene(13, 400, 3, 3, False, torch.float32)
    pos, col, rad, opa, bg, cam = (t.cuda() for t in tensors)
    pos[:, 1::2] = pos[:, 0::2]
    rad[:, 1::2] = rad[:, 0::2]
    renderer = Renderer(720, 720, n_channels=3, n_track=4).cuda()
    call_kw = dict(gamma=0.1, max_depth=30.0, bg_col=bg, return_forward_info=True, percent_allowed_difference=0.01)
    image3, info3 = renderer(pos, col, rad, cam, opacity=opa, **call_kw)
    image2, info2 = renderer(pos[:2], col[:2], rad[:2], cam[:2], opacity=opa[:2], **call_kw)
    ids2 = Renderer.sphere_ids_from_result_info_nograd(info2)
    assert ids2[..., 1].ge(0).float().mean() > 0.2, "pixels should track two spheres or more"
    torch.testing.assert_close(image2, image3[:2], atol=1e-6, rtol=0)
    assert torch.equal(ids2, Renderer.sphere_ids_from_result_info_nograd(info3)[:2])
    cpu = Renderer(720, 720, n_channels=3, n_track=4)(
        *(t.cpu() for t in (pos[:2], col[:2], rad[:2], cam[:2])),
        opacity=opa[:2].cpu(),
        **{**call_kw, "bg_col": bg.cpu()},
    )[0]
    # Pixels whose termination flips with rounding may differ, as in the wide-image test above.
    close = ((image2.cpu() - cpu).abs() <= 1e-5).all(-1).float().mean().item()
    assert close >= 0.999, f"{close:.5f} of the pixels within 1e-5 of the CPU's"


@pytest.mark.parametrize(
    "width, n, padded", [(512, 400, 2**22 + 1), (1280, 3000, 2**19 + 1)], ids=["counting", "radix"]
)
def test_cuda_instance_keys_packed_or_not_give_the_same_results(width, n, padded):
    """An instance's sort key carries its sphere index above the tile bits when both fit in
    32 bits (InstanceKeys, cuda_scratch.h); otherwise the binning stores each slot's sphere
    beside the keys. The same visible spheres alone (packed) and followed by culled spheres
    behind the camera up to `padded` spheres (too many for the bits above the tile key:
    unpacked) give the same lists, so the same image and forward info bit for bit, and the
    same gradients (up to the order of the sphere reduction's sums, which depends on the
    instances per sphere), with either instance sort: 512x512 (1024 tiles, 10 bits; sorted
    by counting) and 1280x1280 (6400 tiles, 13 bits; by the radix sort)."""
    tensors = _scene(17, n, 3, 0, False, torch.float32)
    pos, col, rad, opa, bg, cam = (t.cuda() for t in tensors)
    extra = padded - n
    padding = [
        torch.tensor([0.0, 0.0, -5.0], device="cuda").expand(extra, 3),
        torch.full((extra, 3), 0.5, device="cuda"),
        torch.full((extra,), 0.1, device="cuda"),
        torch.full((extra,), 0.5, device="cuda"),
    ]
    call_kw = dict(gamma=0.1, max_depth=30.0, return_forward_info=True, percent_allowed_difference=0.01)
    results = []
    for spheres in ([pos, col, rad, opa], [torch.cat([t, p]) for t, p in zip([pos, col, rad, opa], padding)]):
        leaves = [t.clone().requires_grad_() for t in spheres + [bg, cam]]
        renderer = Renderer(width, width, n_channels=3, n_track=4).cuda()
        p, c, r, o, b, k = leaves
        image, info = renderer(p, c, r, k, bg_col=b, opacity=o, **call_kw)
        weights = torch.linspace(-1, 1, image.numel(), device="cuda").reshape(image.shape)
        grads = torch.autograd.grad((image * weights).sum(), leaves)
        results.append((image, info, grads, binned_instances(renderer, torch.device("cuda"))))
    (image, info, grads, instances), (image_p, info_p, grads_p, instances_p) = results
    assert instances == instances_p and instances > 1000, (instances, instances_p)
    assert torch.equal(image, image_p), (image - image_p).abs().max()
    # Bits, not values: an id is an int32's bits in its float slot, and -1 reads as NaN.
    assert torch.equal(info.view(torch.int32), info_p.view(torch.int32))
    for name, g, g_p in zip(["pos", "col", "rad", "opa", "bg", "cam"], grads, grads_p):
        assert g.abs().max() > 0, f"{name}: the scene should give a gradient"
        if name in ("pos", "col", "rad", "opa"):
            assert not g_p[n:].any(), f"{name}: culled spheres take no gradient"
            g_p = g_p[:n]
        torch.testing.assert_close(g_p, g, rtol=1e-5, atol=1e-5 * g.abs().max().item(), msg=name)
