"""Scenes and the per-rank work of the sharded-rendering tests (test_sharded.py): a sharded
render of a scene split across the ranks, and the single-process render of the whole scene
to compare it with. A module of its own: spawned ranks import their function by name."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch
from scenes import grad_output_like, random_scene

import pulsar_py
from pulsar_py.distributed import ShardedRenderer

GRAD_NAMES = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")
SPHERE_NAMES = ("vert_pos", "vert_col", "vert_rad", "opacity")


def case_scene(case: dict):
    return random_scene(
        case["seed"],
        width=40,
        height=30,
        n_spheres=sum(case["shares"]),
        radius_px=(3.0, 12.0),
        batch=case.get("batch"),
        shared_spheres=case.get("batch") is not None,
        n_track=4,
        percent_allowed_difference=case["p"],
        gamma=case.get("gamma", 0.1),
    )


def share_bounds(shares: List[int]) -> List[int]:
    out = [0]
    for n in shares:
        out.append(out[-1] + n)
    return out


def _render(renderer, tensors: dict, scene, mode: int = 0, info: bool = True):
    return renderer(**tensors, **scene.settings(), mode=mode, return_forward_info=info)


def _leaf_inputs(scene, case: dict, dtype: torch.dtype, device: str, rank: Optional[int]) -> Dict:
    """``scene``'s inputs as leaves requiring grad: every sphere (rank None) or rank's
    share of ``case["shares"]``."""
    tensors = scene.tensors(dtype, device)
    if rank is not None:
        lo, hi = share_bounds(case["shares"])[rank : rank + 2]
        for name in SPHERE_NAMES:
            tensors[name] = (
                tensors[name][..., lo:hi].contiguous()
                if name in ("vert_rad", "opacity")
                else tensors[name][..., lo:hi, :].contiguous()
            )
    for t in tensors.values():
        t.requires_grad_(True)
    return tensors


def run_case(renderer, scene, case: dict, dtype: torch.dtype, device: str, rank: Optional[int] = None) -> Dict:
    """Renders ``scene`` (rank None: all of it; else rank's share of ``case["shares"]``) in
    ``dtype`` with every input requiring grad, back-propagates a fixed image gradient and
    returns the image, forward info, hit counts and gradients (CPU tensors)."""
    tensors = _leaf_inputs(scene, case, dtype, device, rank)
    image, info = _render(renderer, tensors, scene)
    (image * grad_output_like(image)).sum().backward()
    with torch.no_grad():
        hits = _render(renderer, tensors, scene, mode=1, info=False)
    out = {"image": image.detach(), "info": info, "hits": hits}
    out.update({"grad_" + name: tensors[name].grad for name in GRAD_NAMES})
    return {k: v.cpu() for k, v in out.items()}


# render()'s outputs that the loss of run_render_case reads, all differentiable.
RENDER_OUTPUTS = ("image", "depth", "z_depth", "coverage", "distortion")


def run_render_case(renderer, scene, case: dict, dtype: torch.dtype, device: str, rank: Optional[int] = None) -> Dict:
    """As run_case for ``render()``: its outputs (RENDER_OUTPUTS) and the gradients of a
    loss of every one of them."""
    tensors = _leaf_inputs(scene, case, dtype, device, rank)
    kwargs = dict(scene.settings(), camera=tensors.pop("cam_params"))
    cam = kwargs["camera"]
    result = renderer.render(**tensors, **kwargs, z_depth=True)
    loss = sum((getattr(result, name) * grad_output_like(getattr(result, name))).sum() for name in RENDER_OUTPUTS)
    loss.backward()
    out = {name: getattr(result, name).detach() for name in RENDER_OUTPUTS}
    tensors["cam_params"] = cam
    out.update({"grad_" + name: tensors[name].grad for name in GRAD_NAMES})
    return {k: v.cpu() for k, v in out.items()}


def _sharded_results(run: Callable, rank: int, cases: List[dict], device: str) -> List[Dict]:
    """``run(renderer, scene, case, ...)`` for every case with this rank's ShardedRenderer
    ("cuda" means this rank's GPU)."""
    if device == "cuda":
        device = f"cuda:{rank}"
    results = []
    for case in cases:
        scene = case_scene(case)
        renderer = ShardedRenderer(
            scene.width,
            scene.height,
            n_track=scene.n_track,
            n_channels=scene.n_channels,
            background_normalized_depth=scene.beta,
        ).to(device)
        results.append(run(renderer, scene, case, case["dtype"], device, rank))
    return results


def sharded_render_rank(rank: int, world_size: int, cases: List[dict], device: str = "cpu") -> List[Dict]:
    """Every case's sharded ``render()`` result on this rank (run_ranks' function)."""
    return _sharded_results(run_render_case, rank, cases, device)


def single_render_result(case: dict, device: str = "cpu") -> Dict:
    """The case's single-process ``render()`` result."""
    scene = case_scene(case)
    renderer = pulsar_py.Renderer(
        scene.width,
        scene.height,
        n_track=scene.n_track,
        n_channels=scene.n_channels,
        background_normalized_depth=scene.beta,
    ).to(device)
    return run_render_case(renderer, scene, case, case["dtype"], device)


def sharded_rank(rank: int, world_size: int, cases: List[dict], device: str = "cpu") -> List[Dict]:
    """Every case's sharded forward result on this rank (run_ranks' function)."""
    return _sharded_results(run_case, rank, cases, device)


def sharded_forward_and_render_rank(
    rank: int, world_size: int, cases: List[dict], render_cases: List[dict], device: str = "cpu"
) -> Dict[str, List[Dict]]:
    """``{"forward": sharded_rank(...), "render": sharded_render_rank(...)}`` from one set
    of ranks (run_ranks' function)."""
    return {
        "forward": sharded_rank(rank, world_size, cases, device),
        "render": sharded_render_rank(rank, world_size, render_cases, device),
    }


def single_result(case: dict, device: str = "cpu", p: Optional[float] = None) -> Dict:
    """The case's single-process result (``p``: another percent_allowed_difference)."""
    scene = case_scene(case if p is None else dict(case, p=p))
    renderer = pulsar_py.Renderer(
        scene.width,
        scene.height,
        n_track=scene.n_track,
        n_channels=scene.n_channels,
        background_normalized_depth=scene.beta,
    ).to(device)
    return run_case(renderer, scene, case, case["dtype"], device)


def disagreeing_rank(rank: int, world_size: int) -> List[str]:
    """The errors of calls whose ranks disagree: rank 1's camera moved, then its camera alone
    requiring grad (run_ranks' function)."""
    scene = case_scene(dict(seed=31, shares=[10, 10], p=0.0))
    renderer = ShardedRenderer(scene.width, scene.height, n_channels=scene.n_channels)
    tensors = scene.tensors(torch.float64)
    errors = []
    moved = tensors["cam_params"] + (0.01 if rank == 1 else 0.0)
    for cam_params in (moved, tensors["cam_params"].clone().requires_grad_(rank == 1)):
        try:
            renderer(**dict(tensors, cam_params=cam_params), **scene.settings())
            errors.append("")
        except ValueError as error:
            errors.append(str(error))
    return errors
