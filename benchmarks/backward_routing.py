"""Backward cost when only colours need gradients vs when everything does (issue 3).

Times forward+backward on workload W3 (performance.md) two ways and prints the medians and
their ratio. Usage: python benchmarks/backward_routing.py [--device cpu|cuda] [--repeats N]
"""
import argparse
import statistics
import time

import torch

from pulsar_py import Renderer
from pulsar_py.tools.bench import WORKLOADS, make_inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    dev = torch.device(args.device)
    workload = WORKLOADS["W3"]
    inputs = make_inputs(workload, dev)
    renderer = Renderer(workload.width, workload.height, n_channels=3).to(dev)
    renderer.check_values = False
    tensors = dict(vert_pos=inputs.positions, vert_col=inputs.colours, vert_rad=inputs.radii,
                   opacity=inputs.opacity, cam_params=inputs.cam_params)
    settings = dict(gamma=0.1, max_depth=45.0, percent_allowed_difference=0.01)

    def run(requires: dict) -> float:
        leaves = {k: v.clone().requires_grad_(requires[k]) for k, v in tensors.items()}
        times = []
        for i in range(args.repeats + 1):
            if dev.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            image = renderer(leaves["vert_pos"], leaves["vert_col"], leaves["vert_rad"], leaves["cam_params"],
                             opacity=leaves["opacity"], **settings)
            if image.requires_grad:
                image.sum().backward()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if i > 0:
                times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    names = ("vert_pos", "vert_col", "vert_rad", "opacity", "cam_params")
    forward = run({k: False for k in names})  # no gradient: forward alone (no backward runs)
    everything = run({k: True for k in names})
    colours = run({k: k == "vert_col" for k in names})
    print(f"W3 on {dev}: forward {forward:.1f} ms; forward+backward with all gradients {everything:.1f} ms, "
          f"colours only {colours:.1f} ms; backward alone {everything - forward:.1f} vs {colours - forward:.1f} ms: "
          f"ratio {(everything - forward) / (colours - forward):.2f}x")


if __name__ == "__main__":
    main()
