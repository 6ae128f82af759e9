"""Finite-difference validation of every gradient of a render call.

``gradcheck(renderer, vert_pos=..., ...)`` compares the renderer's analytic gradient of

    L = sum(image * grad_output)        (grad_output: a fixed random [B?, H, W, C] tensor)

with central finite differences of L in float64, for every parameter group (vert_pos,
vert_col, vert_rad, opacity, bg_col, and the camera: cam_params for camera vectors, or
camera.rotation, camera.translation, camera.fx, camera.fy, camera.cx, camera.cy for a
``pulsar_py.Camera``), and returns a ``GradcheckReport``.

Pass criterion, per entry with analytic value a and tolerance tol(n) = atol + rtol |n|:
  * the central difference c = (L(x+h) - L(x-h)) / (2h) agrees, |a - c| <= tol(c), for
    h = eps, or else for h = eps/10 or eps/100 ("refined": near a silhouette the function
    is smooth but stiff, and central differences converge as the step shrinks); or
  * it is a *kink*: the function is not differentiable within the step (a silhouette
    crossing a pixel centre, the tiny-sphere rule or early termination switching; model.md
    section 8), and a agrees within tol with a one-sided difference (L(x+h) - L(x)) / h
    or (L(x) - L(x-h)) / h at one of those steps.
A group passes when no entry fails and, for the per-sphere groups, at most
``max_kink_fraction`` of its entries (at least 6) are kinks; every camera and background
entry sums over all pixels, so one kink touches all of them and is not limited. A few kink
flips therefore pass, while a wrong gradient - scaled, normalised per sphere like
Pulsar's, or missing a term - fails every entry it touches.

``pulsar-py gradcheck`` runs this on built-in random scenes (pulsar_py/tools/gradcheck_command.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from .cameras.camera import Camera

PARAMETER_GROUPS = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")
# The groups of a Camera's tensors (its film distance changes no image and is not checked).
CAMERA_GROUPS = tuple(f"camera.{n}" for n in ("rotation", "translation", "fx", "fy", "cx", "cy"))

# Defaults by the dtype of the analytic gradient: (rtol, atol, floor). The per-entry
# tolerance is atol + rtol * (|numeric| + floor * the group's largest |numeric|).
# float32: the analytic gradient is float32, the finite differences stay float64; its
# rounding error is relative to the summands, so entries that are sums with cancellation
# (camera, positions) are judged relative to the group's scale (floor).
_DEFAULT_TOLERANCES = {torch.float64: (1e-5, 1e-8, 0.0), torch.float32: (2e-2, 1e-5, 1e-2)}
# Groups whose every entry sums over all pixels: one silhouette through one pixel centre
# makes each of their entries a kink, so their kinks are not limited by max_kink_fraction.
_GLOBAL_GROUPS = ("bg_col", "cam_params") + CAMERA_GROUPS
# Kinks always allowed in a per-sphere group: a silhouette on a pixel centre makes up to
# 3 position entries kinks; two such events pass.
_MIN_KINKS = 6
_MAX_LISTED_FAILURES = 10


@dataclass
class FailingEntry:
    """One entry whose analytic gradient disagrees with finite differences."""

    index: Tuple[int, ...]
    analytic: float
    numeric: float  # the central difference


@dataclass
class GroupReport:
    """Comparison for one parameter group (over the checked entries).

    Attributes:
        name: the parameter group ("vert_pos", ...).
        n_entries: entries in the group; n_checked: entries compared (``max_entries``
            subsamples; entries with no valid finite difference, e.g. an orthographic
            camera's focal length, which must stay 0, are skipped).
        numeric_scale: max |numeric gradient| (0: the check says little).
        max_abs_error, max_rel_error: max |a - n| and max |a - n| / (|n| + t), with n the
            central difference (or the matching one-sided one for kinks) and t the absolute
            part of the tolerance divided by rtol: an entry passes when its relative error
            is at most rtol (10 rtol for one-sided differences).
        cosine_similarity: of the analytic and numeric gradient vectors (1 when both are 0).
        n_refined: entries that agreed only at a smaller step (eps / 10, eps / 100).
        n_kinks: entries accepted through a one-sided difference.
        max_kinks: the number of kinks allowed.
        failing: the entries that failed.
        passed (property): no failure and at most max_kinks kinks.
    """

    name: str
    n_entries: int
    n_checked: int
    numeric_scale: float
    max_abs_error: float
    max_rel_error: float
    cosine_similarity: float
    n_refined: int
    n_kinks: int
    max_kinks: int
    failing: List[FailingEntry] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failing and self.n_kinks <= self.max_kinks

    @property
    def status(self) -> str:
        if self.passed:
            return "ok"
        return "FAIL" if self.failing else "FAIL (kinks)"


@dataclass
class GradcheckReport:
    """Result of ``gradcheck``: one ``GroupReport`` per parameter group checked."""

    groups: Dict[str, GroupReport]
    device: str
    analytic_dtype: torch.dtype
    eps: float
    rtol: float
    atol: float

    @property
    def passed(self) -> bool:
        return all(g.passed for g in self.groups.values())

    @property
    def failed_groups(self) -> List[str]:
        return [name for name, g in self.groups.items() if not g.passed]

    def __getitem__(self, name: str) -> GroupReport:
        return self.groups[name]

    def table(self) -> str:
        """The report as a fixed-width text table (plus failing entries, if any)."""
        dtype = str(self.analytic_dtype).replace("torch.", "")
        lines = [
            f"gradcheck on {self.device}: analytic {dtype} vs central differences in float64 "
            f"(eps {self.eps:g}, rtol {self.rtol:g}, atol {self.atol:g})"
        ]
        header = (
            f"{'group':<11} {'entries':>7} {'checked':>7} {'max |num|':>10} {'max abs err':>11} "
            f"{'max rel err':>11} {'cosine':>12} {'refined':>7} {'kinks':>5} {'failed':>6}  status"
        )
        lines += [header, "-" * len(header)]
        for g in self.groups.values():
            lines.append(
                f"{g.name:<11} {g.n_entries:>7} {g.n_checked:>7} {g.numeric_scale:>10.3e} "
                f"{g.max_abs_error:>11.3e} {g.max_rel_error:>11.3e} {g.cosine_similarity:>12.9f} "
                f"{g.n_refined:>7} {g.n_kinks:>5} {len(g.failing):>6}  {g.status}"
            )
        for g in self.groups.values():
            for entry in g.failing[:_MAX_LISTED_FAILURES]:
                lines.append(
                    f"  {g.name}{list(entry.index)}: analytic {entry.analytic:.6e}, numeric {entry.numeric:.6e}"
                )
            if len(g.failing) > _MAX_LISTED_FAILURES:
                lines.append(f"  {g.name}: ... {len(g.failing) - _MAX_LISTED_FAILURES} more failing entries")
        lines.append("result: " + ("PASSED" if self.passed else f"FAILED ({', '.join(self.failed_groups)})"))
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


# ---------------------------------------------------------------------------------------
def gradcheck(
    renderer: Callable[..., torch.Tensor],
    *,
    vert_pos: torch.Tensor,
    vert_col: torch.Tensor,
    vert_rad: torch.Tensor,
    cam_params: Union[torch.Tensor, Camera],
    gamma: float,
    max_depth: float,
    min_depth: float = 0.0,
    bg_col: Optional[torch.Tensor] = None,
    opacity: Optional[torch.Tensor] = None,
    percent_allowed_difference: float = 0.0,
    max_n_hits: Optional[int] = None,
    first_R_then_T: bool = False,
    eps: float = 1e-6,
    rtol: Optional[float] = None,
    atol: Optional[float] = None,
    max_entries: Optional[int] = None,
    grad_output: Optional[torch.Tensor] = None,
    analytic_dtype: torch.dtype = torch.float64,
    max_kink_fraction: float = 0.05,
    refinements: int = 2,
    seed: int = 0,
) -> GradcheckReport:
    """Check every gradient of one render call against central finite differences.

    Args:
        renderer: a ``pulsar_py.Renderer`` (or anything called like one).
        vert_pos [B?, N, 3], vert_col [B?, N, C], vert_rad [B?, N], cam_params: camera
            vectors [B?, L] or a ``pulsar_py.Camera`` (any: fx != fy, principal point,
            orthographic; its tensors are checked, film distance aside), bg_col [C]
            (None: ones, checked too), opacity [B?, N] (None: not checked), and the
            other render arguments: as for ``Renderer.forward``. Tensors are converted to
            float64 (and detached) on the renderer's device.
        eps: finite-difference step (input units).
        rtol, atol: per-entry tolerance ``atol + rtol * |numeric|``; None picks defaults
            for ``analytic_dtype`` (float64: 1e-5, 1e-8; float32: 2e-2, 1e-5, and
            |numeric| is floored at 1e-2 of the group's largest numeric entry).
        max_entries: check at most this many entries per group: half of them the largest
            analytic entries, half drawn at random (seeded). None checks all.
        grad_output: [B?, H, W, C] upstream gradient; None: fixed uniform(-1, 1) noise.
        analytic_dtype: dtype of the analytic gradient (float32 checks the float32 native
            backward against float64 finite differences).
        max_kink_fraction: share of the entries of a per-sphere group (vert_pos, vert_col,
            vert_rad, opacity) that may be kinks (at least 6).
        refinements: how many times an entry that disagrees is retried with a 10x smaller
            step before it is judged by one-sided differences.
        seed: seed of grad_output and of the subsampling.

    Returns:
        A GradcheckReport (``.passed``, ``.groups[name]``, ``str(report)`` is a table).
    """
    if analytic_dtype not in _DEFAULT_TOLERANCES:
        raise ValueError(f"analytic_dtype: expected torch.float64 or torch.float32, got {analytic_dtype}")
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"eps: expected a finite value > 0, got {eps}")
    if max_entries is not None and max_entries < 1:
        raise ValueError(f"max_entries: expected None or >= 1, got {max_entries}")
    default_rtol, default_atol, relative_floor = _DEFAULT_TOLERANCES[analytic_dtype]
    rtol = default_rtol if rtol is None else float(rtol)
    atol = default_atol if atol is None else float(atol)

    device = getattr(renderer, "device", vert_pos.device)
    camera = cam_params if isinstance(cam_params, Camera) else None
    given = dict(vert_pos=vert_pos, vert_col=vert_col, vert_rad=vert_rad, opacity=opacity, bg_col=bg_col)
    if camera is None:
        given["cam_params"] = cam_params
    else:
        camera = camera.to(device=device, dtype=torch.float64)
        given.update({f"camera.{n}": t for n, t in camera.tensors().items() if f"camera.{n}" in CAMERA_GROUPS})
    for name, t in given.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(
                f"{name}: expected a torch.Tensor{' or a pulsar_py.Camera' if name == 'cam_params' else ''}"
                f", got {type(t).__name__}"
            )
    if bg_col is None:
        given["bg_col"] = torch.ones(vert_col.shape[-1])  # the renderer's default, checked too
    x64 = {
        name: None if t is None else t.detach().to(device=device, dtype=torch.float64).contiguous()
        for name, t in given.items()
    }
    settings = dict(
        gamma=gamma,
        max_depth=max_depth,
        min_depth=min_depth,
        percent_allowed_difference=percent_allowed_difference,
        max_n_hits=max_n_hits,
        first_R_then_T=first_R_then_T,
    )

    def render(tensors: Dict[str, Optional[torch.Tensor]]) -> torch.Tensor:
        if camera is None:
            return renderer(**tensors, **settings)
        fields = {n[len("camera.") :]: t for n, t in tensors.items() if n.startswith("camera.")}
        scene = {n: t for n, t in tensors.items() if not n.startswith("camera.")}
        fields["film_distance"] = camera.film_distance.to(scene["vert_pos"].dtype)
        return renderer(**scene, cam_params=camera._replace(**fields), **settings)

    with torch.no_grad():
        image0 = render(x64)
    gen = torch.Generator().manual_seed(seed)
    if grad_output is None:
        g_out = (torch.rand(tuple(image0.shape), generator=gen, dtype=torch.float64) * 2 - 1).to(device)
    else:
        if tuple(grad_output.shape) != tuple(image0.shape):
            raise ValueError(
                f"grad_output: expected shape {tuple(image0.shape)} like the image, got {tuple(grad_output.shape)}"
            )
        g_out = grad_output.detach().to(device=device, dtype=torch.float64)

    def loss(tensors: Dict[str, Optional[torch.Tensor]]) -> float:
        with torch.no_grad():
            return float((render(tensors) * g_out).sum())

    analytic = _analytic_gradients(render, x64, g_out, analytic_dtype)
    loss0 = loss(x64)
    groups = {}
    for name, grad in analytic.items():
        groups[name] = _check_group(
            name,
            grad,
            x64,
            loss,
            loss0,
            eps,
            rtol,
            atol,
            relative_floor,
            max_entries,
            max_kink_fraction,
            refinements,
            gen,
        )
    return GradcheckReport(
        groups=groups, device=str(device), analytic_dtype=analytic_dtype, eps=eps, rtol=rtol, atol=atol
    )


def _analytic_gradients(render, x64, g_out, dtype) -> Dict[str, torch.Tensor]:
    """{group: float64 CPU analytic gradient of L} from one forward and one backward."""
    leaves = {name: t.to(dtype).requires_grad_(True) for name, t in x64.items() if t is not None}
    tensors = {name: leaves.get(name) for name in x64}
    with torch.enable_grad():
        image = render(tensors)
        grads = torch.autograd.grad((image * g_out.to(dtype)).sum(), list(leaves.values()), allow_unused=True)
    return {
        name: (torch.zeros_like(leaves[name]) if g is None else g).detach().double().cpu()
        for name, g in zip(leaves, grads)
    }


def _select_entries(analytic: torch.Tensor, max_entries: Optional[int], gen: torch.Generator) -> List[int]:
    """Flat indices to check: all, or the largest |analytic| half plus a random half."""
    n = analytic.numel()
    if max_entries is None or n <= max_entries:
        return list(range(n))
    flat = analytic.reshape(-1).abs()
    n_top = max_entries // 2
    top = torch.argsort(flat, descending=True, stable=True)[:n_top].tolist()
    rest = sorted(set(range(n)) - set(top))
    pick = torch.randperm(len(rest), generator=gen)[: max_entries - n_top].tolist()
    return sorted(top + [rest[i] for i in pick])


def _check_group(
    name, analytic, x64, loss, loss0, eps, rtol, atol, relative_floor, max_entries, max_kink_fraction, refinements, gen
) -> GroupReport:
    base = x64[name]
    flat_analytic = analytic.reshape(-1)
    steps = [eps / 10**k for k in range(refinements + 1)]
    # Finite differences at the main step for every selected entry: they set the scale.
    samples = []
    for flat_index in _select_entries(analytic, max_entries, gen):
        plus = _shifted_loss(loss, x64, name, base, flat_index, eps)
        minus = _shifted_loss(loss, x64, name, base, flat_index, -eps)
        if plus is None and minus is None:
            continue  # no valid step (e.g. an orthographic camera's focal length, fixed at 0)
        samples.append((flat_index, float(flat_analytic[flat_index]), plus, minus))
    scale = max((abs(_central(loss0, p, m, eps)) for _, _, p, m in samples), default=0.0)
    entry_atol = atol + rtol * relative_floor * scale
    checked_a, checked_n, errors_rel, failing = [], [], [], []
    n_refined = n_kinks = 0
    for flat_index, a, plus, minus in samples:
        status, numeric = _check_entry(
            a, flat_index, plus, minus, steps, loss, loss0, x64, name, base, entry_atol, rtol
        )
        n_refined += status == "refined"
        n_kinks += status == "kink"
        if status == "fail":
            failing.append(FailingEntry(tuple(_unravel(flat_index, base.shape)), a, numeric))
        checked_a.append(a)
        checked_n.append(numeric)
        # The quantity the criterion bounds by rtol: |a - n| <= rtol * (|n| + entry_atol / rtol).
        errors_rel.append(abs(a - numeric) / (abs(numeric) + entry_atol / rtol) if rtol > 0 else abs(a - numeric))
    a_vec = torch.tensor(checked_a, dtype=torch.float64)
    n_vec = torch.tensor(checked_n, dtype=torch.float64)
    return GroupReport(
        name=name,
        n_entries=base.numel(),
        n_checked=len(checked_a),
        numeric_scale=scale,
        max_abs_error=float((a_vec - n_vec).abs().max()) if checked_a else 0.0,
        max_rel_error=max(errors_rel, default=0.0),
        cosine_similarity=_cosine(a_vec, n_vec),
        n_refined=n_refined,
        n_kinks=n_kinks,
        max_kinks=len(checked_a)
        if name in _GLOBAL_GROUPS
        else max(_MIN_KINKS, int(max_kink_fraction * len(checked_a))),
        failing=failing,
    )


def _check_entry(a, flat_index, plus, minus, steps, loss, loss0, x64, name, base, atol, rtol):
    """("ok" | "refined" | "kink" | "fail", numeric) for one entry with analytic value a.

    Central differences at steps eps, eps/10, ...: the first that agrees decides ("ok" at
    eps, "refined" at a smaller step: near a silhouette the function is smooth but stiff,
    and the central difference converges as the step shrinks). Else a one-sided difference
    that agrees (same tolerance) makes it a "kink": the function is not differentiable
    within the step and the analytic gradient is one of its one-sided derivatives. Entries
    with only one valid side (at a domain bound) use one-sided differences throughout.
    """
    one_sided = []
    numeric = _central(loss0, plus, minus, steps[0])
    for k, step in enumerate(steps):
        if k > 0:
            plus = _shifted_loss(loss, x64, name, base, flat_index, step) if plus is not None else None
            minus = _shifted_loss(loss, x64, name, base, flat_index, -step) if minus is not None else None
            if plus is None and minus is None:
                break
        numeric = _central(loss0, plus, minus, step)
        if _close(a, numeric, atol, rtol):
            return ("ok" if k == 0 else "refined"), numeric
        if plus is not None and minus is not None:
            one_sided += [(plus - loss0) / step, (loss0 - minus) / step]
    for d in one_sided:
        if _close(a, d, atol, rtol):
            return "kink", d
    return "fail", numeric


def _close(analytic: float, numeric: float, atol: float, rtol: float) -> bool:
    return abs(analytic - numeric) <= atol + rtol * abs(numeric)


def _central(loss0: float, plus: Optional[float], minus: Optional[float], eps: float) -> float:
    if plus is not None and minus is not None:
        return (plus - minus) / (2 * eps)
    return (plus - loss0) / eps if plus is not None else (loss0 - minus) / eps


def _shifted_loss(loss, x64, name, base, flat_index, step) -> Optional[float]:
    """L with one entry moved by ``step``; None when the renderer rejects the moved input."""
    moved = base.clone()
    moved.view(-1)[flat_index] += step
    try:
        return loss({**x64, name: moved})
    except ValueError:
        return None


def _unravel(flat_index: int, shape: Sequence[int]) -> List[int]:
    index = []
    for size in reversed(list(shape)):
        index.append(flat_index % size)
        flat_index //= size
    return list(reversed(index))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    na, nb = float(a.norm()), float(b.norm())
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(a @ b) / (na * nb)
