"""ShardedRenderer over gloo (CPU), ranks in spawned processes: a scene split across 2 and 3
ranks, with uneven and empty shares, against a single-process render of all its spheres."""

from __future__ import annotations

from typing import Dict, List

import pytest
import torch
from rank_runner import run_ranks
from sharded_cases import (
    RENDER_OUTPUTS,
    SPHERE_NAMES,
    case_scene,
    disagreeing_rank,
    sharded_forward_and_render_rank,
    sharded_rank,
    sharded_render_rank,
    share_bounds,
    single_render_result,
    single_result,
)

import pulsar_py
from pulsar_py.distributed import ShardedRenderer

F32, F64 = torch.float32, torch.float64
TOLERANCE = {F64: 1e-12, F32: 1e-5}

# 2 ranks: uneven shares; 3 ranks: an empty share first and one in the middle (batched).
CASES = {
    2: [
        dict(seed=11, shares=[41, 17], p=0.0, dtype=F64),
        dict(seed=12, shares=[9, 50], p=0.0, dtype=F32),
        dict(seed=13, shares=[30, 30], p=0.01, dtype=F64),
    ],
    3: [
        dict(seed=21, shares=[0, 35, 24], p=0.0, dtype=F64),
        dict(seed=22, shares=[20, 0, 33], p=0.0, dtype=F32, batch=2),
        dict(seed=23, shares=[25, 10, 25], p=0.01, dtype=F32),
    ],
}


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = want.abs().max().item()
    return (got.to(F64) - want.to(F64)).abs().max().item() / (scale if scale > 0 else 1.0)


def _share(t: torch.Tensor, name: str, case: dict, rank: int) -> torch.Tensor:
    lo, hi = share_bounds(case["shares"])[rank : rank + 2]
    return t[..., lo:hi] if name in ("vert_rad", "opacity") else t[..., lo:hi, :]


def _ids(info: torch.Tensor) -> torch.Tensor:
    slots = info[..., 3::2]
    return slots.view(torch.int32).long() if slots.dtype == F32 else slots.long()


def _check_exact(case: dict, ranks: List[Dict], single: Dict) -> None:
    tol = TOLERANCE[case["dtype"]]
    for rank, got in enumerate(ranks):
        where = f"rank {rank}, case {case}"
        assert _relative(got["image"], single["image"]) <= tol, where
        assert torch.equal(got["hits"], single["hits"]), where
        # Forward info: m exactly, D to rounding, the largest closest depth and the K
        # closest hits (global ids) as one process finds them.
        assert torch.equal(got["info"][..., 0], single["info"][..., 0]), where
        assert _relative(got["info"][..., 1], single["info"][..., 1]) <= tol, where
        assert torch.equal(got["info"][..., 2], single["info"][..., 2]), where
        assert torch.equal(_ids(got["info"]), _ids(single["info"])), where
        assert _relative(got["info"][..., 4::2], single["info"][..., 4::2]) <= tol, where
        for name in SPHERE_NAMES:
            want = _share(single["grad_" + name], name, case, rank)
            if want.numel():
                assert want.abs().max() > 0, f"{name}: the scene must give a non-zero gradient"
                assert _relative(got["grad_" + name], want) <= tol, f"grad {name}, {where}"
            else:
                assert got["grad_" + name].shape == want.shape, where
        for name in ("bg_col", "cam_params"):
            assert single["grad_" + name].abs().max() > 0
            assert _relative(got["grad_" + name], single["grad_" + name]) <= tol, f"grad {name}, {where}"


def _check_bound(case: dict, ranks: List[Dict], single: Dict, exhaustive: Dict) -> None:
    """Each share processes every hit of its spheres that one process processes, so the
    image is within (the weight share one process skips) x (feature range) of the
    exhaustive (p = 0) image (docs/distributed.md), and the hits lie between both."""
    tol = TOLERANCE[case["dtype"]]
    total = lambda info: info[..., 1].to(F64) * torch.exp(info[..., 0].to(F64))  # noqa: E731  D e^m
    skipped = (1 - total(single["info"]) / total(exhaustive["info"])).clamp(min=0)
    scene = case_scene(case)
    features = torch.cat((scene.vert_col.reshape(-1, scene.n_channels), scene.bg_col[None]))
    feature_range = features.max(0).values - features.min(0).values
    assert (skipped > 1e-3).any(), "the scene must terminate early somewhere"
    for rank, got in enumerate(ranks):
        error = (got["image"].to(F64) - exhaustive["image"].to(F64)).abs()
        assert (error <= skipped[..., None] * feature_range + 10 * tol).all(), f"rank {rank}"
        assert (got["hits"] >= single["hits"]).all() and (got["hits"] <= exhaustive["hits"]).all()
        assert torch.equal(got["image"], ranks[0]["image"])  # the same image on every rank


# render(): exact at p = 0 (float64 to 1e-12 relative); 2 ranks with uneven shares, 3 with
# an empty one (batched).
RENDER_CASES = {
    2: [dict(seed=41, shares=[41, 17], p=0.0, dtype=F64), dict(seed=42, shares=[9, 50], p=0.0, dtype=F32)],
    3: [dict(seed=43, shares=[20, 0, 33], p=0.0, dtype=F64, batch=2)],
}


def _check_render_exact(case: dict, ranks: List[Dict], single: Dict) -> None:
    tol = TOLERANCE[case["dtype"]]
    for rank, got in enumerate(ranks):
        where = f"rank {rank}, case {case}"
        for name in RENDER_OUTPUTS:
            assert single[name].abs().max() > 0, name
            assert _relative(got[name], single[name]) <= tol, f"{name}, {where}"
        for name in SPHERE_NAMES:
            want = _share(single["grad_" + name], name, case, rank)
            if want.numel():
                assert want.abs().max() > 0, f"{name}: the scene must give a non-zero gradient"
                assert _relative(got["grad_" + name], want) <= tol, f"grad {name}, {where}"
        for name in ("bg_col", "cam_params"):
            assert single["grad_" + name].abs().max() > 0
            assert _relative(got["grad_" + name], single["grad_" + name]) <= tol, f"grad {name}, {where}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_sharded_forward_and_render_equal_one_process(world_size):
    """forward(): image and gradients exact at p = 0, within the early-termination bound
    above it. render(): image, depth, z-depth, coverage and distortion, and the gradients of
    a loss of all of them: the shares' depth statistics merge exactly. One set of spawned
    ranks runs both (starting the ranks is most of the time)."""
    cases, render_cases = CASES[world_size], RENDER_CASES[world_size]
    per_rank = run_ranks(sharded_forward_and_render_rank, world_size, cases, render_cases)
    for i, case in enumerate(cases):
        ranks = [per_rank[r]["forward"][i] for r in range(world_size)]
        single = single_result(case)
        if case["p"] == 0:
            _check_exact(case, ranks, single)
        else:
            _check_bound(case, ranks, single, single_result(case, p=0.0))
    for i, case in enumerate(render_cases):
        ranks = [per_rank[r]["render"][i] for r in range(world_size)]
        _check_render_exact(case, ranks, single_render_result(case))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_sharded_render_outputs_over_nccl_equal_one_gpu():
    cases = RENDER_CASES[2]
    per_rank = run_ranks(sharded_render_rank, 2, cases, "cuda", backend="nccl")
    for i, case in enumerate(cases):
        _check_render_exact(case, [per_rank[r][i] for r in range(2)], single_render_result(case, "cuda:0"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_sharded_render_over_nccl_equals_one_gpu():
    """The same over NCCL, one GPU per rank, against one GPU rendering every sphere."""
    cases = CASES[2] + [dict(case, dtype=F32 if case["dtype"] == F64 else F64) for case in CASES[2]]
    per_rank = run_ranks(sharded_rank, 2, cases, "cuda", backend="nccl")
    for i, case in enumerate(cases):
        ranks = [per_rank[r][i] for r in range(2)]
        single = single_result(case, "cuda:0")
        if case["p"] == 0:
            _check_exact(case, ranks, single)
        else:
            _check_bound(case, ranks, single, single_result(case, "cuda:0", p=0.0))


def test_ranks_that_disagree_get_an_error_on_every_rank():
    """Different cameras (a wrong image otherwise) or a camera gradient asked on one rank
    only (a hang in the backward otherwise) raise ValueError on every rank."""
    for errors in run_ranks(disagreeing_rank, 2):
        assert "differ in camera values" in errors[0]
        assert "differ in cameras.requires_grad" in errors[1]


def test_sharded_renderer_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="gradient_scaling"):
        ShardedRenderer(8, 8, gradient_scaling="pulsar")
    renderer = ShardedRenderer(8, 8)
    if not torch.distributed.is_initialized():
        cam = torch.tensor([0.0, 0, 0, 0, 0, 0, 5.0, 2.0])
        with pytest.raises(RuntimeError, match="init_process_group"):
            renderer(torch.tensor([[0.0, 0, 10]]), torch.ones(1, 3), torch.ones(1), cam, 0.1, 20.0)
    assert isinstance(renderer, pulsar_py.Renderer)
