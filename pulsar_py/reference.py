"""The executable specification: a dense, readable, pure-PyTorch renderer.

This computes exactly the function of model.md (sections 3-7), one camera at a time,
with plain tensor code that autograd differentiates. It is slow (a Python loop over
the spheres in traversal order, vectorised over pixels) and meant for small scenes:
the native backends are tested against it, forward and backward, in float64.

Shapes: N spheres, C feature channels, P = H*W pixels, K tracked hits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ._checks import near_for_focal
from .cameras.params import NativeCamera
from .outputs import DEPTH_STATS, depth_from_moments

# Perspective culling: the centre must be in front, c.z / |c| >= this (model.md sec. 3).
MIN_FORWARD_COSINE = 1e-6
# The tiny-sphere rule: a sphere under one pixel hits its centre pixel (model.md sec. 4).
TINY_CENTRE_RADIUS_PX = 0.75
# Largest exponent of exp() in the depth statistics of a hit without weight (float64's
# exp overflows above 709.78).
_MAX_EXP = 700.0


@dataclass
class ReferenceResult:
    """Outputs of one reference render (one camera).

    image: [H, W, C]; hit_count: [H, W] (processed hits, int64);
    max_exponent (m) and normaliser (D): [H, W]; max_closest_depth: [H, W] (largest zc
    among the pixel's hits, -1 if none); closest_ids: [H, W, K] (int64, -1 if empty);
    closest_depths: [H, W, K] (intersection depth z, -1 if empty);
    depth_moments: [H, W, 4] the depth statistics of model.md section 7: the coverage
    M_0, and the mean and variance of the hits' normalised depths n_i under the weights
    b_i = w_i / sum w (0 and 0 where no hit has weight), and 0 (the native renderer's low
    part of the mean, outputs.DEPTH_STATS).
    depth: [H, W] expected depth sum(w z)/sum(w) over the hits (world units; min_depth
    where nothing is hit);
    coverage: [H, W] = sum w / (exp(s_bg) + sum w) = M_0;
    distortion: [H, W] = sum_ij a_i a_j (z_i - z_j)^2 (world units squared).
    """

    image: torch.Tensor
    hit_count: torch.Tensor
    max_exponent: torch.Tensor
    normaliser: torch.Tensor
    max_closest_depth: torch.Tensor
    closest_ids: torch.Tensor
    closest_depths: torch.Tensor
    depth_moments: torch.Tensor
    depth: torch.Tensor
    coverage: torch.Tensor
    distortion: torch.Tensor


def _norm(v: torch.Tensor) -> torch.Tensor:
    """Euclidean norm over the last dim with gradient 0 (not NaN) at the origin."""
    sq = (v * v).sum(-1)
    zero = sq == 0
    return torch.where(zero, torch.zeros_like(sq), torch.where(zero, torch.ones_like(sq), sq).sqrt())


def _sqrt_pos(x: torch.Tensor) -> torch.Tensor:
    """sqrt(max(x, 0)) with gradient 0 (not inf) where x <= 0."""
    pos = x > 0
    return torch.where(pos, torch.where(pos, x, torch.ones_like(x)).sqrt(), torch.zeros_like(x))


def resolve_min_depth(min_depth: torch.Tensor | float, focal: torch.Tensor) -> torch.Tensor:
    """``min_depth = 0`` means "focal length + 2e-6" in the focal length's dtype, or the
    next representable value above the focal length where that sum rounds back to it
    (model.md section 1); the derivative with respect to the focal length is 1."""
    min_depth = torch.as_tensor(min_depth, dtype=focal.dtype, device=focal.device)
    return torch.where(min_depth == 0, near_for_focal(focal), min_depth.expand_as(focal))


def render_reference(
    vert_pos: torch.Tensor,
    vert_col: torch.Tensor,
    vert_rad: torch.Tensor,
    camera: NativeCamera,
    width: int,
    height: int,
    gamma: float,
    max_depth: float | torch.Tensor,
    min_depth: float | torch.Tensor = 0.0,
    bg_col: torch.Tensor | None = None,
    opacity: torch.Tensor | None = None,
    background_normalized_depth: float = 1e-6,
    percent_allowed_difference: float = 0.0,
    max_n_hits: int | None = None,
    n_track: int = 5,
) -> ReferenceResult:
    """Render one camera (``camera.batch_size == 1``) densely.

    Args:
        vert_pos: [N, 3] sphere centres (world units).
        vert_col: [N, C] features.
        vert_rad: [N] radii (> 0, world units).
        camera: a NativeCamera of batch size 1.
        width, height: image size in pixels.
        gamma: blending softness in [1e-5, 1].
        max_depth, min_depth: depth range (world units); min_depth 0 means focal + 2e-6.
        bg_col: [C] background features (default ones).
        opacity: [N] in [0, 1] (default ones).
        background_normalized_depth: beta, the background's normalised depth.
        percent_allowed_difference: p of the early termination rule (0 disables it).
        max_n_hits: hard cap on processed hits per pixel (None: unlimited).
        n_track: K, the number of closest hits reported per pixel.
    """
    dtype, device = vert_pos.dtype, vert_pos.device
    n_spheres, n_channels = vert_col.shape
    if bg_col is None:
        bg_col = torch.ones(n_channels, dtype=dtype, device=device)
    if opacity is None:
        opacity = torch.ones(n_spheres, dtype=dtype, device=device)
    eye, p00, pdx, pdy = camera.eye[0], camera.p00[0], camera.pdx[0], camera.pdy[0]
    focal = camera.focal[0]
    z_axis = camera.optical_axis()[0]
    near = resolve_min_depth(min_depth, camera.focal)[0]
    far = torch.as_tensor(max_depth, dtype=dtype, device=device)
    depth_range = far - near

    # Film: sensor point of pixel (i, j) = p00 + i*pdx + j*pdy, flattened row-major, [P, 3].
    cols = torch.arange(width, dtype=dtype, device=device)
    rows = torch.arange(height, dtype=dtype, device=device)
    jj, ii = torch.meshgrid(rows, cols, indexing="ij")
    ii, jj = ii.reshape(-1), jj.reshape(-1)
    sensor = p00 + ii[:, None] * pdx + jj[:, None] * pdy
    # Tiny-sphere rule pixel size: geometric mean of the two pixel sides.
    pixel_size = (_norm(pdx) * _norm(pdy)).sqrt()

    c = vert_pos - eye  # [N, 3]
    if camera.orthographic:
        ex, ey = pdx / _norm(pdx), pdy / _norm(pdy)
        c_cam = torch.stack([c @ ex, c @ ey, c @ z_axis], -1)  # [N, 3]
        s_xy = torch.stack([(sensor - eye) @ ex, (sensor - eye) @ ey], -1)  # [P, 2]
        closest = c_cam[:, 2] - vert_rad
        visible = (closest >= near) & (closest <= far)
        # Centre's film coordinates (in pixels) for the tiny rule.
        centre_u = (vert_pos - p00) @ ex / _norm(pdx)
        centre_v = (vert_pos - p00) @ ey / _norm(pdy)
    else:
        ray = torch.nn.functional.normalize(sensor - eye, dim=-1)  # [P, 3]
        dist = _norm(c)  # t, [N]
        closest = dist - vert_rad
        in_front = (c @ z_axis) / dist >= MIN_FORWARD_COSINE
        visible = (closest >= near) & (closest <= far) & in_front

    # Traversal order: ascending closest depth, ties by index (stable sort).
    order = torch.sort(closest.detach(), stable=True).indices.tolist()

    n_pix = width * height
    s_bg = background_normalized_depth / gamma
    m = torch.full((n_pix,), s_bg, dtype=dtype, device=device)
    norm_d = torch.ones(n_pix, dtype=dtype, device=device)
    accum = bg_col.expand(n_pix, n_channels).clone()
    hits_weight = torch.zeros(n_pix, dtype=dtype, device=device)  # sum w, relative to exp(m)
    # Per processed sphere, for the depth statistics (model.md section 7): the log-weight
    # ln(kappa o) + s of its hits (-inf elsewhere), the factor kappa o and the exponent s of
    # its hits (0 elsewhere), and their normalised depth.
    log_weights, factors, exponents, depths_n = [], [], [], []
    count = torch.zeros(n_pix, dtype=torch.int64, device=device)
    tau = torch.full((n_pix,), float("inf"), dtype=dtype, device=device)
    max_zc = torch.full((n_pix,), -1.0, dtype=dtype, device=device)
    k_ids = torch.full((n_pix, n_track), -1, dtype=torch.int64, device=device)
    k_depths = torch.full((n_pix, n_track), float("inf"), dtype=dtype, device=device)
    cap = max_n_hits if max_n_hits is not None else n_spheres + 1
    p = percent_allowed_difference
    log_odds = torch.log(torch.tensor(p / (1 - p), dtype=dtype)) if p > 0 else None

    for k in order:
        if not bool(visible[k]):
            continue
        r = vert_rad[k]
        if camera.orthographic:
            delta = _norm(c_cam[k, :2] - s_xy)
            o1 = c_cam[k, 2].abs().expand(n_pix)
            perp = delta
            is_tiny = r / pixel_size < 1
            tiny = is_tiny & ((centre_u[k] - ii).abs() < 0.5) & ((centre_v[k] - jj).abs() < 0.5)
        else:
            t = dist[k]
            delta = _norm(c[k] - t * ray)
            o1 = torch.minimum(ray @ c[k], t)
            perp = _sqrt_pos((t + o1) * (t - o1))
            is_tiny = r * focal / (t * pixel_size) < 1
            tiny = is_tiny & (delta < TINY_CENTRE_RADIUS_PX * pixel_size * t / focal)
        inside = delta <= r
        hit = inside | tiny
        processed = hit & (closest[k] <= tau) & (count < cap)
        if not bool(processed.any()):
            continue
        kappa = torch.where(tiny, torch.ones_like(delta), (1 - delta / r).clamp(0, 1))
        half_chord = torch.where(inside, _sqrt_pos((r + perp) * (r - perp)), torch.zeros_like(perp))
        z = o1 - half_chord
        n = (z - near) / depth_range
        s = opacity[k] * (1 - n) / gamma
        # Online softmax (model.md section 5): weights relative to exp(m).
        m_new = torch.where(processed, torch.maximum(m, s), m)
        scale_old = torch.exp(m - m_new)
        # The exponent is masked before exp: an unprocessed pixel's s - m can overflow, and
        # a masked-out inf would still poison the gradient (0 * inf).
        w_rel = torch.where(
            processed, kappa * opacity[k] * torch.exp(torch.where(processed, s - m_new, 0.0)), torch.zeros_like(s)
        )
        norm_d = norm_d * scale_old + w_rel
        accum = accum * scale_old[:, None] + w_rel[:, None] * vert_col[k]
        hits_weight = hits_weight * scale_old + w_rel
        factor = kappa * opacity[k]
        weighs = processed & (factor > 0)
        log_weights.append(
            torch.where(weighs, torch.log(torch.where(weighs, factor, torch.ones_like(factor))) + s, -torch.inf)
        )
        factors.append(torch.where(processed, factor, torch.zeros_like(factor)))
        exponents.append(torch.where(processed, s, torch.zeros_like(s)))
        depths_n.append(torch.where(processed, n, torch.zeros_like(n)))
        m = m_new
        count = count + processed.long()
        if log_odds is not None:
            new_tau = near + depth_range * (1 - gamma * (torch.log(norm_d) + log_odds + m))
            tau = torch.where(processed, new_tau.detach(), tau)
        max_zc = torch.where(processed, closest[k].detach(), max_zc)
        # Keep the K processed hits with the smallest intersection depth, closest first.
        cand_d = torch.cat([k_depths, torch.where(processed, z.detach(), torch.inf)[:, None]], 1)
        cand_i = torch.cat([k_ids, torch.full((n_pix, 1), k, dtype=torch.int64, device=device)], 1)
        sel = torch.sort(cand_d, dim=1, stable=True).indices[:, :n_track]
        k_depths = torch.gather(cand_d, 1, sel)
        k_ids = torch.gather(cand_i, 1, sel)

    image = accum / norm_d[:, None]
    # M_0 = W_h / W, the value with relative precision however small; its derivative is
    # taken through the same function written 1 - a_bg (the background's share), whose
    # autograd does not subtract the two nearly equal terms that W_h / W's does where the
    # pixel is nearly covered.
    background_share = torch.exp(s_bg - m) / norm_d
    coverage = (1 - background_share) + (hits_weight / norm_d - (1 - background_share)).detach()
    # The mean and variance of the hits' n under b_i = w_i / sum w (0 and 0 where no hit has
    # weight), with w_i = kappa_i o_i exp(s_i) relative to exp(top), top the largest
    # log-weight of the pixel: a softmax of the log-weights, which divides by no small sum
    # however small the weights. A hit of weight 0 (o = 0, or kappa = 0 on a silhouette)
    # adds 0, but its weight's derivative kappa exp(s) (o exp(s)) is not 0: it enters as
    # its factor kappa o times exp(s - top), linear in the factor, so that the gradient
    # reaches o and kappa there (the log-weight, -inf, would carry none).
    if log_weights:
        t = torch.stack(log_weights)  # [S, P]
        top = t.max(0).values.detach()
        weighted = torch.isfinite(top)
        top = torch.where(weighted, top, 0.0)
        has_weight = torch.isfinite(t)
        # exp(s - top) of a hit without weight: its exponent is capped where the derivative
        # would exceed float64's range anyway (so that 0 * exp never reads inf).
        unweighted = torch.stack(factors) * torch.exp((torch.stack(exponents) - top).clamp(max=_MAX_EXP))
        u = torch.where(has_weight, torch.exp(torch.where(has_weight, t - top, 0.0)), unweighted)
        b = u / torch.where(weighted, u.sum(0), 1.0) * weighted
        n_hits = torch.stack(depths_n)
        mean_n = (b * n_hits).sum(0)
        variance = (b * (n_hits - mean_n) ** 2).sum(0)
    else:
        mean_n = variance = torch.zeros(n_pix, dtype=dtype, device=device)
    moments = torch.stack([coverage, mean_n, variance, torch.zeros_like(mean_n)], -1)
    depth, distortion = depth_from_moments(moments, near, far)
    empty = torch.isinf(k_depths)
    k_ids = torch.where(empty, -1, k_ids)
    k_depths = torch.where(empty, -1.0, k_depths)
    shape = (height, width)
    return ReferenceResult(
        image=image.reshape(shape + (n_channels,)),
        hit_count=count.reshape(shape),
        max_exponent=m.reshape(shape),
        normaliser=norm_d.reshape(shape),
        max_closest_depth=max_zc.reshape(shape),
        closest_ids=k_ids.reshape(shape + (n_track,)),
        closest_depths=k_depths.reshape(shape + (n_track,)),
        depth_moments=moments.reshape(shape + (DEPTH_STATS,)),
        depth=depth.reshape(shape),
        coverage=coverage.reshape(shape),
        distortion=distortion.reshape(shape),
    )
