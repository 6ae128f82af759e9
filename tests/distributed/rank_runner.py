"""Runs a function on every rank of a torch.distributed process group, each rank in a
spawned process (as torchrun starts them), and returns what each rank's call returned.

    results = run_ranks(fn, world_size, *args, backend="gloo")

``fn(rank, world_size, *args)`` runs after ``init_process_group``; it must be a module-level
function (spawned processes import it by name) and return what torch.save stores and
``torch.load(weights_only=True)`` reads (numbers, strings, lists, dicts, CPU tensors). A
rank that raises fails the whole run with that rank's traceback. NCCL ranks use GPU
``rank``.
"""

from __future__ import annotations

import io
import os
import queue as queue_module
import tempfile
import traceback
from typing import Any, Callable, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank_main(fn: Callable, rank: int, world_size: int, init_method: str, backend: str, args: tuple, results) -> None:
    torch.set_num_threads(1)  # ranks share the machine's cores
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size)
    try:
        # As bytes: tensors put on the queue as they are would be passed as shared memory,
        # gone once this process exits.
        buffer = io.BytesIO()
        torch.save(fn(rank, world_size, *args), buffer)
        results.put((rank, None, buffer.getvalue()))
    except BaseException:  # reported to the parent, which raises
        results.put((rank, traceback.format_exc(), None))
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable, world_size: int, *args: Any, backend: str = "gloo", timeout: float = 300.0) -> List[Any]:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, world_size, *args)]``, each run
    on its own rank of a fresh process group (``backend``: "gloo" or "nccl")."""
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        init_method = "file://" + os.path.join(tmp, "rendezvous")
        results = context.Queue()
        processes = [
            context.Process(target=_rank_main, args=(fn, rank, world_size, init_method, backend, args, results))
            for rank in range(world_size)
        ]
        for p in processes:
            p.start()
        collected = {}
        try:
            while len(collected) < world_size:
                try:
                    rank, error, value = results.get(timeout=timeout)
                except queue_module.Empty:
                    raise AssertionError(
                        f"ranks {sorted(set(range(world_size)) - set(collected))} gave no result within {timeout} s"
                    ) from None
                if error is not None:
                    raise AssertionError(f"rank {rank} of {world_size} failed:\n{error}")
                collected[rank] = torch.load(io.BytesIO(value), weights_only=True)
        finally:
            for p in processes:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    return [collected[rank] for rank in range(world_size)]
