"""Splitting the views over ranks with DistributedDataParallel (examples/multiview_ddp.py).

Two CPU ranks (gloo) each render their share of the views of one scene; after backward
every rank must hold the gradient of the loss over all views that one process computes
with one renderer, and after the optimiser step the same parameters. The example itself
runs end to end under both launchers.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rank_runner import run_ranks
from torch.nn.parallel import DistributedDataParallel

import pulsar_py
from pulsar_py import Renderer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "multiview_ddp.py"
SIZE = 24
SPHERES = 300
F64 = torch.float64
FINAL_LINE = re.compile(r"^loss over (\d+) views: (\S+) -> (\S+) \((\d+) ranks?, ")


def _example():
    """examples/multiview_ddp.py as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("example_multiview_ddp", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VIEW_COUNTS = (4, 3)  # an even and an uneven split over 2 ranks


def _ddp_steps(rank: int, world_size: int, view_counts):
    """For each view count, one training step of the example's DDP model on this rank's
    views, float64: the gradients after backward and the parameters after the step."""
    example = _example()
    renderer = Renderer(SIZE, SIZE, num_threads=1)
    results = {}
    for views in view_counts:
        cameras = example.rank_cameras(example.ring_cameras(views, SIZE, dtype=F64), rank, world_size)
        targets = example.render_targets(renderer, cameras)
        spheres = example.SphereCloud(SPHERES, dtype=F64)
        model = DistributedDataParallel(spheres)
        optimiser = example.make_optimiser(spheres)
        gradients = {}
        # Read the gradients between the all-reduce and the step: hook the optimiser.
        optimiser.register_step_pre_hook(
            lambda *_: gradients.update({name: p.grad.detach().clone() for name, p in spheres.named_parameters()})
        )
        example.train_step(model, optimiser, renderer, cameras, targets, views, world_size)
        results[views] = (gradients, {name: p.detach().clone() for name, p in spheres.named_parameters()})
    return results


@pytest.fixture(scope="module")
def ddp_ranks():
    """Each rank's gradients and stepped parameters for every view count (one spawn)."""
    return run_ranks(_ddp_steps, 2, VIEW_COUNTS)


def _single_process_gradients(views: int):
    """Gradients of L = mean over all views of each view's mean squared error, with all
    views rendered by one renderer in one process."""
    example = _example()
    renderer = Renderer(SIZE, SIZE)
    cameras = example.ring_cameras(views, SIZE, dtype=F64)
    targets = example.render_targets(renderer, cameras)
    spheres = example.SphereCloud(SPHERES, dtype=F64)
    images = spheres(renderer, cameras)
    loss = sum(((images[v] - targets[v]) ** 2).mean() for v in range(views)) / views
    loss.backward()
    return {name: p.grad.detach().clone() for name, p in spheres.named_parameters()}, spheres


@pytest.mark.parametrize("views", VIEW_COUNTS, ids=["even-split", "uneven-split"])
def test_ranks_get_the_gradient_of_the_loss_over_all_views(ddp_ranks, views):
    expected, spheres = _single_process_gradients(views)
    assert set(expected) == {"positions", "colours", "log_radii", "opacity_logits"}
    for rank, per_views in enumerate(ddp_ranks):
        gradients = per_views[views][0]
        for name, want in expected.items():
            scale = float(want.abs().max())
            assert scale > 0, f"{name}: the scene gives a zero gradient; the comparison would be empty"
            error = float((gradients[name] - want).abs().max()) / scale
            assert error <= 1e-12, f"rank {rank}, {name}: relative gradient error {error:.3e}"

    # One step later every rank holds the same parameters, and they have moved.
    params0, params1 = (per_views[views][1] for per_views in ddp_ranks)
    for name, start in spheres.named_parameters():
        assert torch.equal(params0[name], params1[name]), f"{name}: ranks differ after the step"
        assert not torch.equal(params0[name], start.detach()), f"{name}: the step left it unchanged"


TINY = ["--steps", "3", "--spheres", "200", "--size", "32"]


def _final_line(stdout: str):
    """(views, loss before, loss after, ranks) from the example's last line of output."""
    lines = stdout.strip().splitlines()
    match = FINAL_LINE.match(lines[-1]) if lines else None
    assert match, f"no final loss line in:\n{stdout}"
    return int(match[1]), float(match[2]), float(match[3]), int(match[4])


def test_example_spawns_its_ranks(monkeypatch, capfd):
    # Imported by name from a folder on sys.path: the spawned ranks (which inherit
    # sys.path) import it again to find their entry function.
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))
    monkeypatch.setitem(sys.modules, EXAMPLE.stem, None)  # restored (removed) afterwards
    del sys.modules[EXAMPLE.stem]
    result = importlib.import_module(EXAMPLE.stem).main(["--ranks", "2", *TINY])
    views, before, after, world_size = _final_line(capfd.readouterr().out)
    assert (views, world_size) == (8, 2)
    assert 0 < after < before, (before, after)
    assert result["initial_loss"] == pytest.approx(before, rel=1e-6)
    assert result["final_loss"] == pytest.approx(after, rel=1e-6)


def test_example_under_torchrun(tmp_path):
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(EXAMPLE),
        "--views",
        "5",
        *TINY,
    ]
    # The ranks import the pulsar_py that this test imported (installed, or a built checkout).
    package_root = str(Path(pulsar_py.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"exit {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}"
    views, before, after, world_size = _final_line(done.stdout)
    assert (views, world_size) == (5, 2)
    assert 0 < after < before, (before, after)
