"""Random differential test: the native renderer against the reference renderer
(pulsar_py.reference, the executable specification of docs/model.md).

Each scene draws every option at random (tests/scenes.py places the spheres through the
camera, so that most scenes draw something): image size down to 1 x 1, 0 to 12 spheres
with tiny, culled and off-screen ones, channels, projection, handedness, camera vector
length (8, 10, 11, 13), first_R_then_T, opacities (none, 0, 1, any), background, gamma
(log-uniform in [1e-3, 1]), beta, min_depth 0 or given, early termination (p = 0, which
disables it, or p > 0), hit cap, n_track, and batches (spheres and cameras batched, or
either shared). In float64 and float32 it compares, with the reference evaluated in
float64 on the same (rounded) inputs:

* forward(): the image, the hit counts and the forward info (m, D, largest zc, the K
  closest ids and depths);
* the gradient of every input of a random linear loss of the image;
* render(): the image, depth, coverage and distortion, and the gradient of every input
  of a random linear loss of depth, coverage and distortion.

Tolerances. float64: the function itself, to 1e-8 (values) and 1e-7 relative
(gradients, with a floor of 1e-9 of the largest component). float32: rounding, which a
small gamma amplifies (an exponent s up to 1 / gamma carries an error of about
eps / gamma): values to TOL_VALUE (1 + 1 / gamma) eps32 (depths scaled by the far
depth), gradients as below.

The rules for the kinks (docs/model.md section 8) and for underflow, the only places
where pixels are left out:

* a pair test, the tiny-sphere rule or early termination decides discretely, and
  rounding can flip a decision taken within a rounding of its threshold. In float64 no
  such flip is tolerated. In float32 a pixel whose hit count differs from the
  reference's (or the plain float32 evaluation's) is left out: its values are not
  compared and it carries no weight in the losses; forward info ids are compared where
  the reference's K closest depths are separated by more than rounding;
* at a silhouette the closeness kappa = 1 - delta / r cancels (float32 rounds the chord
  delta to a few 1e-7 of the centre's distance from the pixel's ray origin, a large
  share of a small kappa) and the intersection depth's derivative grows as
  1 / sqrt(kappa): in float32 a pixel within KAPPA_MIN of a sphere's silhouette
  (|1 - delta / r| below it) is left out like a flipped decision;
* a pixel whose hits' weights underflow against the background (coverage below the
  dtype's smallest normal number) reads as not covered, in either dtype: its depth
  outputs are left out.

float32 gradients are compared by _grads_close: within TOL_GRAD
(1 + 1 / gamma) eps32 relative, or PLAIN_FACTOR times the error of a plain float32
evaluation (the reference run in float32), or a floor for a group whose gradient nearly
vanishes; float32 values likewise within their tolerance or PLAIN_FACTOR times the plain
evaluation's error.

The scene count follows PULSAR_PY_SWEEP (tests/sweep.py): 80 scenes by default (about 20 s
on 2 cores), 800 with PULSAR_PY_SWEEP=full (about four minutes);
PULSAR_PY_DIFFERENTIAL_SCENES=N runs N scenes and PULSAR_PY_DIFFERENTIAL_SEED=S starts at
seed S. A failure lists every failing seed with its options;
PULSAR_PY_DIFFERENTIAL_SEED=<seed> PULSAR_PY_DIFFERENTIAL_SCENES=1 repeats one.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from typing import Dict, Optional

import sweep
import torch
from scenes import Scene, pixel_deltas, random_scene

from pulsar_py import Renderer

F32, F64 = torch.float32, torch.float64
SCENES = int(os.environ.get("PULSAR_PY_DIFFERENTIAL_SCENES", sweep.size(80, 800)))
FIRST_SEED = int(os.environ.get("PULSAR_PY_DIFFERENTIAL_SEED", "0"))
GROUPS = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")
UNBATCHED_DIMS = dict(vert_pos=2, vert_col=2, vert_rad=1, opacity=1, bg_col=1, cam_params=1)
DEPTH_OUTPUTS = ("depth", "coverage", "distortion")
EPS32 = float(torch.finfo(F32).eps)
TOL_VALUE = 64.0
TOL_GRAD = 256.0
PLAIN_FACTOR = 10.0
GROUP_FLOOR = 1e-3
KAPPA_MIN = 1e-3


def draw_options(seed: int) -> dict:
    """Keyword arguments of scenes.random_scene for one scene (all valid)."""
    rng = random.Random(seed)
    batch = rng.choice([None, None, None, None, 2, 3])
    opts = dict(
        seed=rng.randrange(2**31),
        width=rng.randint(1, 24),
        height=rng.randint(1, 20),
        n_spheres=rng.randint(0, 12),
        n_channels=rng.choice([1, 2, 3, 4, 5, 8]),
        orthographic=rng.random() < 0.5,
        right_handed=rng.random() < 0.5,
        cam_length=rng.choice([8, 10, 11, 13]),
        first_R_then_T=rng.random() < 0.3,
        with_opacity=rng.random() < 0.7,
        opacity_range=rng.choice([(0.2, 1.0), (0.0, 1.0), (0.6, 0.95), (1.0, 1.0), (0.0, 0.0)]),
        with_bg=rng.random() < 0.7,
        min_depth=rng.choice([None, None, 0.0]),
        percent_allowed_difference=rng.choice([0.0, 0.0, 0.0, 0.01, 0.1]),
        max_n_hits=rng.choice([None, None, None, 1, 3]),
        n_track=rng.randint(1, 8),
        n_tiny=rng.choice([0, 0, 1, 3]),
        n_culled=rng.choice([0, 0, 1, 2]),
        film_margin=rng.choice([0.0, 0.15, 0.5]),
        gamma=10 ** rng.uniform(-3, 0),
        beta=rng.choice([1e-6, 1e-6, 1e-3, 0.3]),
        radius_px=(rng.uniform(0.5, 4.0), rng.uniform(4.0, 10.0)),
        batch=batch,
    )
    if batch is not None:
        opts["shared_spheres"], opts["shared_camera"] = rng.choice([(False, False), (True, False), (False, True)])
    return opts


# ---------------------------------------------------------------------------------------
def _weights(shape, seed: int) -> torch.Tensor:
    """Fixed loss weights in [-1, 1], float64 on the CPU."""
    return torch.rand(tuple(shape), generator=torch.Generator().manual_seed(seed), dtype=F64) * 2 - 1


class NativeRun:
    """forward() and render() of one scene in one dtype, with the gradients of the losses."""

    def __init__(self, scene: Scene, dtype: torch.dtype, image_mask: torch.Tensor, depth_mask: torch.Tensor):
        renderer = scene.renderer()
        leaves = {k: v.requires_grad_(True) for k, v in scene.tensors(dtype).items() if v is not None}
        kwargs = scene.call_kwargs(tensors={n: leaves.get(n) for n in GROUPS})
        image, self.info = renderer(**kwargs, return_forward_info=True)
        self.image = image.detach()
        self.hits = renderer(
            **{k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}, mode=1
        )[..., 0].long()
        loss = (image * (_weights(image.shape, 1) * image_mask[..., None]).to(dtype)).sum()
        self.image_grads = _grads(loss, leaves)
        kwargs["camera"] = kwargs.pop("cam_params")
        result = renderer.render(**kwargs)
        self.render_image = result.image.detach()
        self.outputs = {out: getattr(result, out).detach() for out in DEPTH_OUTPUTS}
        loss = sum(
            (getattr(result, out) * (_weights(result.depth.shape, 2 + k) * depth_mask).to(dtype)).sum()
            for k, out in enumerate(DEPTH_OUTPUTS)
        )
        self.depth_grads = _grads(loss, leaves)


def _grads(loss: torch.Tensor, leaves: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    if not loss.requires_grad:  # nothing depends on the inputs (no spheres, default background)
        return {n: torch.zeros_like(t) for n, t in leaves.items()}
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True, retain_graph=True)
    return {n: torch.zeros_like(leaves[n]) if g is None else g for n, g in zip(leaves, grads)}


class ReferenceRun:
    """The reference on the scene's inputs rounded to ``dtype``, evaluated in
    ``evaluation`` (float64, or float32 for a plain float32 evaluation), item by item."""

    def __init__(self, scene: Scene, dtype: torch.dtype, evaluation: torch.dtype = F64):
        self.scene, self.batch = scene, scene.batch_size
        rounded = {k: (None if v is None else v.to(dtype).to(evaluation)) for k, v in scene.tensors(F64).items()}
        self.leaves = {k: v.requires_grad_(True) for k, v in rounded.items() if v is not None}
        self.results = []
        for b in range(self.batch or 1):
            item = {
                n: (None if t is None else (t[b] if (self.batch is not None and t.dim() > UNBATCHED_DIMS[n]) else t))
                for n, t in ((n, self.leaves.get(n)) for n in GROUPS)
            }
            self.results.append((scene.item(b) if self.batch is not None else scene).reference(item))

    def stacked(self, name: str) -> torch.Tensor:
        values = [getattr(r, name) for r in self.results]
        return torch.stack(values) if self.batch is not None else values[0]

    def image_grads(self, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        image = self.stacked("image")
        weights = (_weights(image.shape, 1) * mask[..., None]).to(image.dtype)
        return _grads((image * weights).sum(), self.leaves)

    def depth_grads(self, mask: torch.Tensor) -> Dict[str, torch.Tensor]:
        outs = {out: self.stacked(out) for out in DEPTH_OUTPUTS}
        loss = sum(
            (outs[out] * (_weights(outs["depth"].shape, 2 + k) * mask).to(outs[out].dtype)).sum()
            for k, out in enumerate(DEPTH_OUTPUTS)
        )
        return _grads(loss, self.leaves)


# ---------------------------------------------------------------------------------------
def _close(
    what: str,
    got: torch.Tensor,
    want: torch.Tensor,
    atol: float,
    rtol: float = 0.0,
    plain: Optional[torch.Tensor] = None,
) -> None:
    """Element-wise |got - want| <= atol + rtol |want|, or (float32) at most PLAIN_FACTOR
    times the plain float32 evaluation's error there."""
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if got.numel() == 0:
        return
    allowed = atol + rtol * want.abs()
    if plain is not None:
        allowed = torch.maximum(allowed, PLAIN_FACTOR * (plain.detach().double() - want).abs())
    bad = ((got - want).abs() > allowed) | ~torch.isfinite(got)
    if bool(bad.any()):
        i = bad.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {got.numel()} values differ, e.g. at {i}: "
            f"{got[tuple(i)].item()!r} against the reference's {want[tuple(i)].item()!r} "
            f"(allowed {allowed[tuple(i)].item():.2g})"
        )


def _grads_close(
    what: str,
    got: Dict[str, torch.Tensor],
    want: Dict[str, torch.Tensor],
    gamma: float,
    plain: Optional[Dict[str, torch.Tensor]] = None,
) -> None:
    """float64 (plain None): to 1e-7. float32: the error of each group's
    gradient (its norm) at most the largest of TOL_GRAD (1 + 1 / gamma) eps32 of the
    group's norm, PLAIN_FACTOR times the error of the plain float32 evaluation ``plain``,
    and GROUP_FLOOR of that tolerance times the largest group's norm: a gradient that
    nearly vanishes (a position's or radius's under a hard blend, 1e-15 of the colours')
    keeps the rounding of its terms in any evaluation."""
    top = max((float(ref.norm()) for ref in want.values()), default=0.0)
    for name, ref in want.items():
        g = got[name].detach().double()
        assert g.shape == ref.shape, f"{what} {name}: shape {tuple(g.shape)}, expected {tuple(ref.shape)}"
        assert bool(torch.isfinite(g).all()), f"{what} {name}: non-finite gradient"
        if plain is None:
            scale = float(ref.abs().max()) if ref.numel() else 0.0
            _close(f"{what} {name}", g, ref, atol=1e-9 * max(scale, 1.0), rtol=1e-7)
        else:
            norm = float(ref.norm())
            err = float((g - ref).norm())
            err_plain = float((plain[name].detach().double() - ref).norm())
            tol = TOL_GRAD * (1 + 1 / gamma) * EPS32
            assert err <= max(tol * norm, PLAIN_FACTOR * err_plain, tol * GROUP_FLOOR * top), (
                f"{what} {name}: error {err:.3g} against a norm of {norm:.3g} (relative tolerance {tol:.3g}; "
                f"largest group norm {top:.3g}) and the plain float32 evaluation's error {err_plain:.3g}"
            )


def _forward_info_close(
    info: torch.Tensor, ref: ReferenceRun, agree: torch.Tensor, dtype, gamma: float, plain: Optional[ReferenceRun]
) -> None:
    info = info.detach().double()
    eps = EPS32 if dtype == F32 else float(torch.finfo(F64).eps)
    scale = 1e-10 if dtype == F64 else TOL_VALUE * EPS32
    m, d, zc = info[..., 0], info[..., 1], info[..., 2]
    pick = lambda name: None if plain is None else plain.stacked(name)[agree]  # noqa: E731
    _close(
        "forward info m",
        m[agree],
        ref.stacked("max_exponent")[agree],
        atol=100 * eps / gamma,
        rtol=scale,
        plain=pick("max_exponent"),
    )
    _close(
        "forward info D",
        d[agree],
        ref.stacked("normaliser")[agree],
        atol=100 * eps,
        rtol=scale + 100 * eps / gamma,
        plain=pick("normaliser"),
    )
    _close(
        "forward info zc",
        zc[agree],
        ref.stacked("max_closest_depth")[agree],
        atol=scale,
        rtol=scale,
        plain=pick("max_closest_depth"),
    )
    # Pulsar's shapes: unbatched forward info gives ids [1, H, W, K].
    ids = Renderer.sphere_ids_from_result_info_nograd(info.to(dtype)).long().reshape(info.shape[:-1] + (-1,))
    want_ids, want_depths = ref.stacked("closest_ids"), ref.stacked("closest_depths")
    depths = info[..., 4::2]
    if dtype == F32:
        # Ids of hits at depths within rounding of each other may come in either order.
        gaps = (want_depths[..., 1:] - want_depths[..., :-1]).abs()
        separated = (gaps > 1e-4 * (1 + want_depths[..., 1:].abs())).all(-1) if gaps.shape[-1] else agree
        agree = agree & separated
    same = (ids == want_ids).all(-1)
    assert bool(same[agree].all()), f"forward info ids differ at {int((~same & agree).sum())} pixels"
    _close(
        "forward info depths",
        depths[agree],
        want_depths[agree],
        atol=scale,
        rtol=scale,
        plain=None if plain is None else plain.stacked("closest_depths")[agree],
    )


def near_silhouettes(scene: Scene) -> torch.Tensor:
    """bool [B?, H, W]: pixels within KAPPA_MIN of some sphere's silhouette."""
    items = [scene.item(b) for b in range(scene.batch_size)] if scene.batch_size else [scene]
    masks = []
    for item in items:
        if item.vert_pos.shape[0] == 0:
            masks.append(torch.zeros(item.height, item.width, dtype=torch.bool))
            continue
        ratio = pixel_deltas(item) / item.vert_rad[:, None, None]
        masks.append(((1 - ratio).abs() < KAPPA_MIN).any(0))
    return torch.stack(masks) if scene.batch_size else masks[0]


def check_scene(seed: int) -> None:
    opts = draw_options(seed)
    scene = random_scene(**opts)
    for dtype in (F64, F32):
        label = "float64" if dtype == F64 else "float32"
        ref = ReferenceRun(scene, dtype)
        ref_hits = ref.stacked("hit_count")
        # The masks follow the native hit counts and coverage, so the native run comes first
        # (unmasked losses), then again with the masks where they leave pixels out.
        ones = torch.ones_like(ref_hits, dtype=F64)
        probe = NativeRun(scene, dtype, ones, ones)
        agree = probe.hits == ref_hits
        plain = None
        if dtype == F64:
            assert bool(agree.all()), f"float64 hit counts differ at {int((~agree).sum())} pixels"
        else:
            plain = ReferenceRun(scene, dtype, evaluation=F32)
            agree &= plain.stacked("hit_count") == ref_hits
        # A pixel whose hits' weights underflow against the background (its coverage below
        # the smallest normal number of the dtype) has depth statistics of few digits or
        # none (it reads as not covered): its depth outputs are left out.
        if dtype == F32:
            agree &= ~near_silhouettes(scene)
        coverage = probe.outputs["coverage"]
        depth_agree = agree & ((ref_hits == 0) | (coverage >= torch.finfo(dtype).tiny))
        run = probe if bool(depth_agree.all()) else NativeRun(scene, dtype, agree.double(), depth_agree.double())
        gamma = scene.gamma
        atol = 1e-8 if dtype == F64 else TOL_VALUE * (1 + 1 / gamma) * EPS32
        pick = lambda name, mask: None if plain is None else plain.stacked(name)[mask]  # noqa: E731
        image = ref.stacked("image")
        _close(f"{label} image", run.image[agree], image[agree], atol=atol, plain=pick("image", agree))
        _close(f"{label} render() image", run.render_image[agree], image[agree], atol=atol, plain=pick("image", agree))
        for out in DEPTH_OUTPUTS:
            want = ref.stacked(out)
            # Depths in world units (scaled by the depth range), distortion in their square.
            unit = (scene.max_depth if out != "coverage" else 1.0) ** (2 if out == "distortion" else 1)
            _close(
                f"{label} {out}",
                run.outputs[out][depth_agree],
                want[depth_agree],
                atol=atol * unit,
                plain=pick(out, depth_agree),
            )
        assert bool((run.outputs["distortion"] >= 0).all()), f"{label} negative distortion"
        _forward_info_close(run.info, ref, agree, dtype, gamma, plain)
        _grads_close(
            f"{label} image gradient",
            run.image_grads,
            ref.image_grads(agree.double()),
            gamma,
            None if plain is None else plain.image_grads(agree.double()),
        )
        _grads_close(
            f"{label} depth outputs' gradient",
            run.depth_grads,
            ref.depth_grads(depth_agree.double()),
            gamma,
            None if plain is None else plain.depth_grads(depth_agree.double()),
        )


def _describe(opts: dict) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in opts.items())


def test_native_matches_the_reference_on_random_scenes():
    failures, start = [], time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the small-gamma warning
        for seed in range(FIRST_SEED, FIRST_SEED + SCENES):
            try:
                check_scene(seed)
            except AssertionError as error:
                failures.append(f"seed {seed} ({_describe(draw_options(seed))}): {error}")
    elapsed = time.perf_counter() - start
    assert not failures, (
        f"{len(failures)} of {SCENES} scenes differ from the reference ({elapsed:.0f} s); repeat one with "
        f"PULSAR_PY_DIFFERENTIAL_SEED=<seed> PULSAR_PY_DIFFERENTIAL_SCENES=1:\n" + "\n".join(failures)
    )
