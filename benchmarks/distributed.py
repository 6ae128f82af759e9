#!/usr/bin/env python3
"""Sharded rendering on 1 and more GPUs: ``python benchmarks/distributed.py --gpus 1 2``.

Scenes (docs/benchmarks.md, "Sharded rendering"):

* ``S16``: W5 scaled up: 16M spheres in the same 10 x 10 x 10 box in front of the W5
  camera, radii halved (radius 0.0095 (0.5 + u)), opacity in [0.1, 0.9], 1024 x 1024.
* ``--large N``: N spheres of the same kind, trained for two steps with Adam (an L2 loss
  against a grey image) on the given GPU counts; a card holds its share of the spheres,
  their gradients, Adam's two moments and the renderer's scratch. N is chosen so that one
  card cannot hold them all.

The scene is drawn in chunks of 2^20 spheres, chunk c from a generator seeded (seed, c);
rank r of R draws its share, spheres [N r / R, N (r + 1) / R), so every GPU count renders
the same scene. Per GPU count the
script spawns one process per GPU (NCCL), times forward + backward (positions, colours,
radii, opacities and the camera requiring gradients; CUDA events on each rank, the slowest
rank's median), and times the merge's collectives alone on tensors of the call's shapes:
the communication a call spends. Writes a table and, with --json, every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

try:
    import pulsar_py
except ImportError:  # a checkout with an in-place build
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import pulsar_py
from pulsar_py.distributed import ShardedRenderer
from pulsar_py.distributed.merge import merge_partial_states
from pulsar_py.tools.bench import scratch_bytes, time_runs

CHUNK = 1 << 20
S16_SPHERES = 16_000_000
CAMERA = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 2.0]  # the W1-W5 camera (bench.py)
GAMMA, MAX_DEPTH = 0.1, 45.0
MIB = 2.0**20


def draw_share(n: int, world_size: int, rank: int, seed: int, device: torch.device):
    """This rank's spheres (positions, colours, radii, opacities), float32 on ``device``:
    spheres [n r / R, n (r + 1) / R) of the scene, drawn chunk by chunk."""
    radius_scale = 0.0095
    lo, hi = n * rank // world_size, n * (rank + 1) // world_size
    parts = []
    for c in range(lo // CHUNK, (hi + CHUNK - 1) // CHUNK):
        count = min(CHUNK, n - c * CHUNK)
        gen = torch.Generator(device=device).manual_seed(seed * 1_000_003 + c)
        pos = torch.rand(count, 3, generator=gen, device=device) * 10
        pos[:, 2] += 25
        pos[:, :2] -= 5
        col = torch.rand(count, 3, generator=gen, device=device)
        rad = radius_scale * (0.5 + torch.rand(count, generator=gen, device=device))
        opa = 0.1 + 0.8 * torch.rand(count, generator=gen, device=device)
        keep = slice(max(lo - c * CHUNK, 0), min(hi - c * CHUNK, count))
        parts.append(tuple(t[keep] for t in (pos, col, rad, opa)))
    if not parts:
        empty = torch.empty(0, device=device)
        return empty.reshape(0, 3), empty.reshape(0, 3), empty, empty
    return tuple(torch.cat(p).contiguous() for p in zip(*parts))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _times_ms(run, warmup: int, repeats: int, device: torch.device) -> List[float]:
    """The benchmark driver's timing (CUDA events on the current stream; the CPU, a check of
    the script: perf_counter), every call started together on every rank."""

    def together() -> None:
        dist.barrier()
        _sync(device)

    return time_runs(device, run, together, warmup, repeats, lambda text: None)


def _slowest(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def rank_main(rank: int, world_size: int, init: str, args: argparse.Namespace, out) -> None:
    if args.device == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world_size, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    try:
        out.put((rank, run_rank(rank, world_size, device, args)))
    except BaseException as error:  # reported by the parent
        out.put((rank, {"error": repr(error)}))
        raise
    finally:
        dist.destroy_process_group()


def run_rank(rank: int, world_size: int, device: torch.device, args: argparse.Namespace) -> Dict:
    size = args.size
    renderer = ShardedRenderer(size, size).to(device)
    renderer.check_values = False
    cam = torch.tensor(CAMERA, device=device)
    result: Dict = {}
    log = (lambda text: print(text, file=sys.stderr, flush=True)) if rank == 0 else (lambda text: None)

    if not args.skip_s16:
        pos, col, rad, opa = draw_share(args.s16_spheres, world_size, rank, args.seed, device)
        leaves = [t.requires_grad_(True) for t in (pos, col, rad, opa, cam.clone())]
        grad = torch.rand(size, size, 3, device=device, generator=torch.Generator(device=device).manual_seed(7))

        def fwd_bwd(call=renderer):
            for t in leaves:
                t.grad = None
            image = call(*leaves[:3], leaves[4], GAMMA, MAX_DEPTH, opacity=leaves[3])
            image.backward(grad)

        def fwd():
            with torch.no_grad():
                renderer(pos, col, rad, cam, GAMMA, MAX_DEPTH, opacity=opa)

        log(f"S16 on {world_size} GPU(s): {pos.shape[0]} spheres on rank 0")
        fwd_ms = _times_ms(fwd, 3, args.repeats, device)
        fwd_bwd_ms = _times_ms(fwd_bwd, 3, args.repeats, device)
        # The merge's collectives alone, on the shapes of the call (C + 1 values and m per pixel).
        partial = torch.rand(size, size, 3, device=device)
        state = torch.stack(
            (torch.full((size, size), 1e-5 / GAMMA, device=device), torch.rand(size, size, device=device)), -1
        )
        ones = torch.ones(3, device=device)
        comm_ms = _times_ms(
            lambda: merge_partial_states(partial, state, ones, 1e-5 / GAMMA, None), 3, args.repeats, device
        )
        result["S16"] = {
            "n_spheres": args.s16_spheres,
            "spheres_on_rank": int(pos.shape[0]),
            "image": f"{size}x{size}",
            "fwd_ms": _slowest(statistics.median(fwd_ms), device),
            "fwd_bwd_ms": _slowest(statistics.median(fwd_bwd_ms), device),
            "merge_ms": _slowest(statistics.median(comm_ms), device),
            "fwd_bwd_runs_rank0": fwd_bwd_ms,
        }
        if world_size == 1:  # one GPU without the merge: pulsar_py.Renderer itself
            plain = pulsar_py.Renderer(size, size).to(device)
            plain.check_values = False
            result["S16"]["renderer_fwd_bwd_ms"] = statistics.median(
                _times_ms(lambda: fwd_bwd(plain), 3, args.repeats, device)
            )
        log(
            f"  fwd {result['S16']['fwd_ms']:.2f} ms, fwd+bwd {result['S16']['fwd_bwd_ms']:.2f} ms, "
            f"merge collectives {result['S16']['merge_ms']:.3f} ms"
        )
        del pos, col, rad, opa, leaves, grad
        if device.type == "cuda":
            torch.cuda.empty_cache()

    if args.large and world_size in args.large_gpus:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        pos, col, rad, opa = draw_share(args.large, world_size, rank, args.seed + 1, device)
        params = [torch.nn.Parameter(t) for t in (pos, col, rad, opa)]
        del pos, col, rad, opa
        optimiser = torch.optim.Adam(params, lr=1e-3)
        target = torch.full((size, size, 3), 0.5, device=device)
        log(f"large scene on {world_size} GPU(s): {params[0].shape[0]} spheres on rank 0")
        losses, step_ms = [], []
        for step in range(2):
            _sync(device)
            start = time.perf_counter()
            optimiser.zero_grad(set_to_none=True)
            image = renderer(
                params[0], params[1], params[2].clamp(min=1e-4), cam, GAMMA, MAX_DEPTH, opacity=params[3].clamp(0, 1)
            )
            loss = (image - target).square().mean()
            loss.backward()
            optimiser.step()
            _sync(device)
            step_ms.append((time.perf_counter() - start) * 1000)
            losses.append(float(loss.item()))
            log(f"  step {step + 1}: loss {losses[-1]:.6f}, {step_ms[-1]:.0f} ms")
        scratch = (scratch_bytes(renderer, device) or 0) / MIB
        cuda = device.type == "cuda"
        peak = torch.cuda.max_memory_allocated(device) / MIB if cuda else 0.0
        total = torch.cuda.mem_get_info(device)[1] if cuda else 0
        result["large"] = {
            "n_spheres": args.large,
            "spheres_on_rank": int(params[0].shape[0]),
            "image": f"{size}x{size}",
            "losses": losses,
            "step_ms": step_ms,
            "allocator_peak_mib": peak,
            "scratch_mib": scratch,
            "card_mib": total / MIB,
        }
    return result


def run_config(world_size: int, args: argparse.Namespace) -> List[Dict]:
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        out = context.Queue()
        procs = [context.Process(target=rank_main, args=(r, world_size, init, args, out)) for r in range(world_size)]
        for p in procs:
            p.start()
        results = dict(out.get(timeout=args.timeout) for _ in range(world_size))
        for p in procs:
            p.join()
    errors = [r for r in results.values() if "error" in r]
    if errors:
        raise SystemExit(f"{world_size} GPU(s): {errors[0]['error']}")
    return [results[r] for r in range(world_size)]


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/distributed.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="GPU counts to run (default 1 2)")
    parser.add_argument("--size", type=int, default=1024, help="image side in pixels (default 1024)")
    parser.add_argument("--repeats", type=int, default=10, help="timed calls per figure (default 10)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-s16", action="store_true", help="only the large scene")
    parser.add_argument("--large", type=int, default=0, help="spheres of the large scene (0: none)")
    parser.add_argument("--large-gpus", type=int, nargs="+", default=[2], help="GPU counts for it (default 2)")
    parser.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cuda (NCCL, one GPU per rank) or cpu (gloo: a check of the script itself)",
    )
    parser.add_argument("--s16-spheres", type=int, default=S16_SPHERES, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=540.0, help="seconds to wait for the ranks")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    available = torch.cuda.device_count() if args.device == "cuda" else os.cpu_count()
    if max(args.gpus) > available:
        parser.error(f"--gpus: {max(args.gpus)} requested, {available} present")
    runs = {}
    for n in args.gpus:
        runs[n] = run_config(n, args)
    report = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "build": pulsar_py.build_info(),
        "gamma": GAMMA,
        "max_depth": MAX_DEPTH,
        "percent_allowed_difference": 0.01,
        "runs": {str(n): r for n, r in runs.items()},
    }
    base = runs[args.gpus[0]][0].get("S16")
    if base and "renderer_fwd_bwd_ms" in base:
        print(f"one GPU, pulsar_py.Renderer: fwd+bwd {base['renderer_fwd_bwd_ms']:.2f} ms")
    print(f"{'GPUs':>4}  {'fwd ms':>8}  {'fwd+bwd ms':>10}  {'merge ms':>8}  {'x first':>8}  {'x Renderer':>10}")
    for n, ranks in runs.items():
        s16 = ranks[0].get("S16")
        if s16:
            s16["throughput_vs_first"] = base["fwd_bwd_ms"] / s16["fwd_bwd_ms"]
            s16["throughput_vs_renderer"] = base.get("renderer_fwd_bwd_ms", float("nan")) / s16["fwd_bwd_ms"]
            print(
                f"{n:>4}  {s16['fwd_ms']:>8.2f}  {s16['fwd_bwd_ms']:>10.2f}  {s16['merge_ms']:>8.3f}  "
                f"{s16['throughput_vs_first']:>8.2f}  {s16['throughput_vs_renderer']:>10.2f}"
            )
        large = ranks[0].get("large")
        if large:
            need = sum(r["large"]["allocator_peak_mib"] + r["large"]["scratch_mib"] for r in ranks)
            print(
                f"large scene, {n} GPUs: {large['n_spheres']} spheres, losses {large['losses']}, step ms "
                f"{[round(t) for t in large['step_ms']]}, memory per rank (allocator peak + scratch) "
                f"{[round(r['large']['allocator_peak_mib'] + r['large']['scratch_mib']) for r in ranks]} MiB, "
                f"{need:.0f} MiB in all against {large['card_mib']:.0f} MiB per card"
            )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
