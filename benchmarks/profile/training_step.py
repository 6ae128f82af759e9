"""Host-inclusive time of one training step (forward, loss, backward) of one or more
builds: eager, eager with a fixed instance capacity (no call waits for the device),
torch.compile, torch.compile(mode="reduce-overhead") and a replayed torch.cuda.graph of
forward and backward.

    python benchmarks/profile/training_step.py --builds /tmp/old /tmp/new --labels old,new \
        --workloads W3 --rounds 3 --steps 50 --json $OUT/step.json

A step is timed on the host with ``time.perf_counter`` around the step and a
``torch.cuda.synchronize()``: what a training loop waits for, host work included (CUDA
events would time the device alone). Every input requires a gradient; the loss is the sum
of the image times a fixed random weight. The value checks are off (the benchmarks'
setting). Each round runs every build in a fresh process, in the order given; a build's
figure is the median over rounds of its round medians. A mode that fails in a build (an
older build cannot be captured) is reported with its error instead of a time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

MODES = ("eager", "eager-fixed-capacity", "compile", "reduce-overhead", "cuda-graph")


def _step_functions(workload_name: str, mode: str, device_name: str):
    """A step of the mode on the workload, with the imported pulsar_py."""
    import harness
    import torch

    from pulsar_py import Renderer

    workload = harness.WORKLOADS[workload_name]
    device = torch.device(device_name)
    renderer = Renderer(workload.width, workload.height, n_channels=3, n_track=harness.N_TRACK).to(device)
    if hasattr(renderer, "check_values"):
        renderer.check_values = False
    inputs = harness.make_inputs(workload, device)
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    with torch.no_grad():
        shape = harness.RenderCall(renderer)(*[inputs[i] for i in (0, 1, 2, 4)], inputs[3]).shape
    weights = torch.rand(shape, generator=torch.Generator().manual_seed(harness.SEED + 1)).to(device)
    call = harness.RenderCall(renderer)

    def loss_of(pos, col, rad, opacity, cam):
        return (call(pos, col, rad, cam, opacity) * weights).sum()

    def clear():
        for t in leaves:
            if t is not None:
                t.grad = None

    if mode == "cuda-graph":
        # The gradients by torch.autograd.grad into the graph's own tensors: .backward()
        # would accumulate into leaves whose accumulation nodes the warm-up made on
        # another stream.
        wanted = [t for t in leaves if t is not None]

        def grads():
            return torch.autograd.grad(loss_of(*leaves), wanted)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                grads()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            grads()
        return graph.replay

    if mode == "eager-fixed-capacity":
        # The capacity a few eager steps taught the renderer, then fixed: the calls no
        # longer read their instance count back (the CPU keeps none: eager there).
        for _ in range(3):
            clear()
            loss_of(*leaves).backward()
        if not harness.fix_learnt_capacity(renderer) and device.type == "cuda":
            raise RuntimeError(f"{mode}: this build's renderer keeps no instance capacity")

    fn = loss_of
    if mode == "compile":
        fn = torch.compile(loss_of)
    elif mode == "reduce-overhead":
        fn = torch.compile(loss_of, mode="reduce-overhead")

    def step():
        clear()
        fn(*leaves).backward()

    return step


def run_child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """In a process that imported its build: every workload and mode, ``steps`` timed steps
    after ``warmup``."""
    import harness
    import torch

    results: Dict[str, Any] = {}
    for workload in spec["workloads"]:
        for mode in spec["modes"]:
            key = f"{workload} {mode}"
            device = torch.device(spec["device"])
            try:
                step = _step_functions(workload, mode, spec["device"])
                for _ in range(spec["warmup"]):
                    step()
                harness.sync(device)
                times = []
                for _ in range(spec["steps"]):
                    start = time.perf_counter()
                    step()
                    harness.sync(device)
                    times.append((time.perf_counter() - start) * 1000.0)
                results[key] = {"ms": statistics.median(times), "times_ms": times}
            except Exception as error:  # noqa: BLE001 - an old build may not support a mode
                results[key] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
            torch._dynamo.reset()
    return results


def _one_round(build: str, spec: Dict[str, Any]) -> Dict[str, Any]:
    import harness

    done = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps({**spec, "build": build})],
        capture_output=True,
        text=True,
        env=harness.child_env(build),
        cwd="/tmp",
    )
    if done.returncode != 0:
        raise SystemExit(f"{build}: the timing process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--builds", nargs="+", metavar="DIR", help="build folders (benchmarks/profile/README.md)")
    parser.add_argument("--labels", default=None)
    parser.add_argument("--workloads", default="W3")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (eager and compile only)")
    parser.add_argument(
        "--same-native", action="store_true", help="the folders may share one native module (an A/B of Python changes)"
    )
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        import harness

        spec = json.loads(args.child)
        harness.use_build(spec["build"])
        print(json.dumps(run_child(spec)))
        return 0
    import harness

    if not args.builds:
        parser.error("--builds: expected at least one build folder")
    if len(args.builds) > 1 and not args.same_native:
        harness.check_builds(args.builds)
    for build in args.builds:
        harness.native_module(build)  # a folder without a built package is refused
    labels = args.labels.split(",") if args.labels else [chr(ord("A") + i) for i in range(len(args.builds))]
    spec = {
        "workloads": [w.name for w in harness.parse_workloads(args.workloads)],
        "modes": [m for m in args.modes.split(",") if m],
        "steps": args.steps,
        "warmup": args.warmup,
        "device": args.device,
    }
    runs: Dict[str, List[Dict[str, Any]]] = {label: [] for label in labels}
    for _ in range(args.rounds):
        for label, build in zip(labels, args.builds):
            runs[label].append(_one_round(build, spec))
    rows = []
    for key in runs[labels[0]][0]:
        row: Dict[str, Any] = {"case": key}
        for label in labels:
            times = [r[key]["ms"] for r in runs[label] if "ms" in r[key]]
            row[label] = statistics.median(times) if times else runs[label][0][key].get("error")
        rows.append(row)
    width = max(len(r["case"]) for r in rows)
    print(f"{'case':{width}}  " + "  ".join(f"{label:>12}" for label in labels))
    for row in rows:
        cells = [f"{row[lb]:12.3f}" if isinstance(row[lb], float) else f"{str(row[lb])[:60]}" for lb in labels]
        print(f"{row['case']:{width}}  " + "  ".join(cells))
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump({"labels": labels, "builds": args.builds, "spec": spec, "rows": rows, "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
