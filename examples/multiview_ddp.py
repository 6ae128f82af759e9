"""Fit spheres to many views over several processes, each rendering its share of the views.

The situation: more views per optimisation step than one process renders quickly, and
spheres that fit on one device. Every rank (process) holds the same spheres as
parameters, renders views i with i % world_size == rank with an ordinary
``pulsar_py.Renderer``, and ``torch.nn.parallel.DistributedDataParallel`` (DDP) sums the
sphere gradients over the ranks during backward, so every rank takes the same Adam step
and the spheres stay identical everywhere. Here the views are renders of the built-in
rainbow trefoil knot from a ring of look-at cameras, and the spheres start as a grey
blob (as in fit_spheres_multiview.py, which renders every view in one process).

    torchrun --nproc_per_node=2 examples/multiview_ddp.py [options]
    python examples/multiview_ddp.py --ranks 2 [options]

(with pulsar_py installed, or ``PYTHONPATH=.`` from the repository root). torchrun
starts the ranks and sets RANK, WORLD_SIZE, LOCAL_RANK and the rendezvous; without it
the script starts --ranks processes itself (a file rendezvous in a temporary folder).
The CPU uses the gloo backend; --device cuda uses NCCL, local rank r on GPU r. Rank 0
shows the progress and prints, last, the loss over all views before and after.
docs/distributed.md explains the method.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import tempfile
import time
from typing import Dict, Optional, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from pulsar_py import Camera, Renderer
from pulsar_py.tools.sample_scene import KNOT_DEPTH, make_sample_scene

# Cameras 12 units from the knot's centre: gamma 0.05 is soft enough for gradients at the
# edges and firm enough for occlusion; the depth range holds the knot (extent about 4.4).
RENDER = dict(gamma=0.05, max_depth=20.0, min_depth=4.0)
BACKGROUND = (0.07, 0.08, 0.11)
CAMERA_DISTANCE = 12.0


def ring_cameras(
    views: int, size: int, dtype: torch.dtype = torch.float32, device: torch.device = torch.device("cpu")
) -> Camera:
    """A batch of ``views`` look-at cameras (size x size pixels, 45 degrees field of view)
    on a ring around the origin, 20 degrees above it, all looking at it."""
    azimuth = torch.arange(views, dtype=torch.float64) * (2 * math.pi / views)
    elevation = math.radians(20.0)
    eye = CAMERA_DISTANCE * torch.stack(
        [
            math.cos(elevation) * torch.sin(azimuth),
            torch.full_like(azimuth, math.sin(elevation)),
            -math.cos(elevation) * torch.cos(azimuth),
        ],
        dim=-1,
    )
    return Camera.look_at(
        eye.to(dtype=dtype, device=device),
        torch.zeros(3, dtype=dtype, device=device),
        image_size=(size, size),
        fov_y=45.0,
    )


def rank_cameras(cameras: Camera, rank: int, world_size: int) -> Camera:
    """This rank's share of the views: views i with i % world_size == rank."""
    return cameras[rank::world_size]


def background(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(BACKGROUND, dtype=dtype, device=device)


def render_targets(renderer: Renderer, cameras: Camera) -> torch.Tensor:
    """[V, H, W, 3] images of the ground truth (the knot, centred at the origin)."""
    like = cameras.translation
    knot = make_sample_scene(n_spheres=3600, dtype=torch.float64)
    positions = knot.positions - torch.tensor([0.0, 0.5, KNOT_DEPTH], dtype=torch.float64)
    with torch.no_grad():
        return renderer(
            positions.to(like),
            knot.colours.to(like),
            knot.radii.to(like),
            cameras,
            bg_col=background(like.dtype, like.device),
            **RENDER,
        )


class SphereCloud(torch.nn.Module):
    """N spheres as parameters: positions [N, 3], colours [N, 3], log-radii [N] and opacity
    logits [N]; ``forward(renderer, cameras)`` renders them from a batch of cameras,
    [V, H, W, 3].

    They start as a random blob of grey, half-transparent spheres (the same on every rank
    for the same seed; DDP also copies rank 0's parameters to every rank when it wraps
    the module). The renderer, one per process, is an argument rather than a submodule:
    the module has no buffers for DDP to synchronise.
    """

    def __init__(
        self,
        n_spheres: int,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
        device: torch.device = torch.device("cpu"),
    ) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        like = dict(dtype=dtype, device=device)
        self.positions = torch.nn.Parameter(
            ((torch.rand(n_spheres, 3, generator=gen, dtype=torch.float64) - 0.5) * 7.0).to(**like)
        )
        self.colours = torch.nn.Parameter(torch.full((n_spheres, 3), 0.5, **like))
        self.log_radii = torch.nn.Parameter(torch.full((n_spheres,), math.log(0.3), **like))
        self.opacity_logits = torch.nn.Parameter(torch.zeros(n_spheres, **like))  # sigmoid(0) = 0.5

    def forward(self, renderer: Renderer, cameras: Camera) -> torch.Tensor:
        return renderer(
            self.positions,
            self.colours,
            self.log_radii.exp(),
            cameras,
            bg_col=background(self.positions.dtype, self.positions.device),
            opacity=torch.sigmoid(self.opacity_logits),
            **RENDER,
        )


def make_optimiser(model: SphereCloud) -> torch.optim.Adam:
    """Adam with a learning rate per parameter group, about the step per iteration in
    each group's units."""
    return torch.optim.Adam(
        [
            {"params": [model.positions], "lr": 2e-2},  # world units
            {"params": [model.colours], "lr": 2e-2},  # RGB
            {"params": [model.log_radii], "lr": 2e-2},  # log radius
            {"params": [model.opacity_logits], "lr": 5e-2},  # logit of the opacity
        ]
    )


def view_errors(images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """[V] mean squared error of each view over its pixels and channels."""
    return ((images - targets) ** 2).flatten(1).mean(1)


def local_loss(images: torch.Tensor, targets: torch.Tensor, total_views: int, world_size: int) -> torch.Tensor:
    """This rank's loss, scaled so that the step minimises the mean over all views.

    The objective is L = (1 / V) * sum over all V views of the view's mean squared error.
    DDP averages the ranks' gradients (their sum divided by world_size W), so each rank
    returns (W / V) * (sum of its own views' errors): the average over the ranks of these
    gradients is exactly dL/dparameters, whatever the split (with V % W == 0, every rank's
    loss is just the mean over its views).
    """
    return view_errors(images, targets).sum() * (world_size / total_views)


def train_step(
    model: torch.nn.Module,
    optimiser: torch.optim.Optimizer,
    renderer: Renderer,
    cameras: Camera,
    targets: torch.Tensor,
    total_views: int,
    world_size: int,
) -> torch.Tensor:
    """One optimisation step of the DDP-wrapped ``model`` on this rank's views; returns its
    local loss (detached). Backward all-reduces the gradients; then every rank holds the
    same gradients, takes the same step and keeps the colours in [0, 1]."""
    optimiser.zero_grad()
    loss = local_loss(model(renderer, cameras), targets, total_views, world_size)
    loss.backward()
    optimiser.step()
    spheres = model.module if isinstance(model, DistributedDataParallel) else model
    with torch.no_grad():
        spheres.colours.clamp_(0.0, 1.0)
    return loss.detach()


def global_loss(local: torch.Tensor, world_size: int) -> float:
    """L over all views from every rank's local loss (a collective: every rank calls it)."""
    total = local.detach().clone()
    dist.all_reduce(total)
    return float(total) / world_size


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="Under torchrun the ranks come from its environment (RANK, WORLD_SIZE); --ranks, if given, must match.",
    )
    parser.add_argument(
        "--ranks", type=int, default=None, help="processes to start when not run by torchrun (default 2)"
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cpu: gloo backend; cuda: NCCL backend, local rank r on GPU r (default cpu)",
    )
    parser.add_argument("--steps", type=int, default=200, help="optimisation steps (default 200)")
    parser.add_argument(
        "--views",
        type=int,
        default=8,
        help="views on the ring of cameras, split over the ranks (default 8; at least one per rank)",
    )
    parser.add_argument("--spheres", type=int, default=3000, help="spheres to fit (default 3000)")
    parser.add_argument("--size", type=int, default=64, help="image width and height in pixels (default 64)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the starting blob (default 0)")
    args = parser.parse_args(argv)
    for name in ("steps", "views", "spheres", "size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.ranks is not None and args.ranks < 1:
        parser.error(f"--ranks must be at least 1, got {args.ranks}")
    return args


def _cpu_threads(local_ranks: int) -> int:
    """CPU threads per rank: the cores this process may use, shared by the ranks on the host."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // local_ranks)


def run_rank(
    args: argparse.Namespace, rank: int, world_size: int, local_rank: int, local_ranks: int
) -> Optional[Dict[str, float]]:
    """The optimisation on one rank of an initialised process group; rank 0 returns the
    result (initial and final loss over all views, seconds), the others None."""
    start = time.perf_counter()
    if args.views < world_size:
        raise ValueError(f"--views {args.views}: expected at least one view per rank ({world_size} ranks)")
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        threads = 0
    else:
        device = torch.device("cpu")
        threads = _cpu_threads(local_ranks)
        torch.set_num_threads(threads)
    cameras = rank_cameras(ring_cameras(args.views, args.size, device=device), rank, world_size)
    renderer = Renderer(args.size, args.size, num_threads=threads).to(device)
    targets = render_targets(renderer, cameras)
    spheres = SphereCloud(args.spheres, seed=args.seed, device=device)
    model = DistributedDataParallel(spheres, device_ids=[local_rank] if device.type == "cuda" else None)
    optimiser = make_optimiser(spheres)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step / args.steps, 1.0)))
    )

    ranks = f"{world_size} rank" + ("s" if world_size != 1 else "")
    steps = range(args.steps)
    progress = None
    if rank == 0:
        try:
            from tqdm import tqdm

            progress = tqdm(steps, desc=ranks, file=sys.stderr, dynamic_ncols=True)
            steps = progress
        except ImportError:
            pass
    report_every = max(1, args.steps // 10)
    initial = None
    for step in steps:
        local = train_step(model, optimiser, renderer, cameras, targets, args.views, world_size)
        schedule.step()
        # Collectives run on every rank alike: the step numbers decide, not the rank.
        if step == 0:
            initial = global_loss(local, world_size)
        if step % report_every == 0 or step == args.steps - 1:
            loss = initial if step == 0 else global_loss(local, world_size)
            if progress is not None:
                progress.set_postfix(loss=f"{loss:.3e}")
            elif rank == 0:
                print(f"step {step:4d}: loss {loss:.4e}", file=sys.stderr, flush=True)
    if progress is not None:
        progress.close()

    with torch.no_grad():
        final = global_loss(local_loss(spheres(renderer, cameras), targets, args.views, world_size), world_size)
    if rank != 0:
        return None
    result = {"initial_loss": initial, "final_loss": final, "seconds": time.perf_counter() - start}
    print(
        f"loss over {args.views} views: {initial:.6e} -> {final:.6e} ({ranks}, {args.spheres} spheres, "
        f"{args.steps} steps, {result['seconds']:.1f} s)",
        flush=True,
    )
    return result


def _shut_down() -> None:
    """Destroys the process group while the interpreter is fully alive. The DDP model
    holds the group, and a reference cycle can keep the model until the interpreter's
    final collection, where gloo's worker threads then end the process with "terminate
    called without an active exception": collect first, so the group goes now."""
    gc.collect()
    dist.destroy_process_group()


def _spawned_rank(rank: int, world_size: int, args: argparse.Namespace, init_method: str, results) -> None:
    """Entry of a process started by ``main`` (torch.multiprocessing.spawn passes ``rank``)."""
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    try:
        result = run_rank(args, rank, world_size, local_rank=rank, local_ranks=world_size)
        if result is not None:
            results.put(result)
    finally:
        _shut_down()


def main(argv: Optional[Sequence[str]] = None) -> Optional[Dict[str, float]]:
    """Run the example; returns rank 0's result (None on the other ranks under torchrun)."""
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if args.ranks is not None and args.ranks != world_size:
            raise SystemExit(f"--ranks {args.ranks} differs from torchrun's WORLD_SIZE {world_size}")
        if args.device == "cuda":
            torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
        try:
            return run_rank(args, rank, world_size, local_rank, local_ranks)
        finally:
            _shut_down()

    world_size = 2 if args.ranks is None else args.ranks
    if args.device == "cuda" and world_size > torch.cuda.device_count():
        raise SystemExit(f"--ranks {world_size}: only {torch.cuda.device_count()} CUDA devices")
    if args.views < world_size:
        raise SystemExit(f"--views {args.views}: expected at least one view per rank ({world_size} ranks)")
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        init_method = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(_spawned_rank, args=(world_size, args, init_method, results), nprocs=world_size, join=True)
    return results.get()


if __name__ == "__main__":
    main(sys.argv[1:])
