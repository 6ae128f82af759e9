#!/usr/bin/env python3
"""Kernel times of one build: what each CUDA kernel, memset and copy of a forward+backward
costs, from CUPTI (torch.profiler, device activities only, so the host runs untraced).

    python benchmarks/profile/kernels.py W4 [W1 ...] [--build DIR] [--steps 10] [--json PATH]

Per workload: the wall time per synchronised forward+backward with the renderer's value
checks on and off, then a table of device activities by base name (template instances
and launches summed; --full-names keeps them apart): ms and launches per step, share of
the device time. --table adds torch.profiler's own table (host and device, by device
time). Without --build the installed pulsar_py is timed. To compare the kernels of two
builds, use ab.py --kernels, which alternates between them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any, Dict, Optional, Sequence

import harness
import torch


def wall_ms(case: harness.Case, steps: int) -> float:
    """Mean ms of ``steps`` back-to-back forward+backward steps, synchronised at the end."""
    harness.sync(case.device)
    t0 = time.perf_counter()
    for _ in range(steps):
        case.step()
    harness.sync(case.device)
    return (time.perf_counter() - t0) / steps * 1e3


def profile_workload(workload: harness.Workload, args: argparse.Namespace) -> Dict[str, Any]:
    device = torch.device("cuda")
    case = harness.Case(workload, device, harness.parse_grads(args.grads), harness.parse_attrs(args.set))
    result: Dict[str, Any] = {"workload": workload.name}
    checks = [True, False] if hasattr(case.renderer, "check_values") else [None]
    for check in checks:
        if check is not None:
            case.renderer.check_values = check
        for _ in range(args.warmup):
            case.step()
        key = "wall_ms" if check is None else f"wall_ms_check_values_{str(check).lower()}"
        result[key] = wall_ms(case, args.steps)
    for _ in range(args.warmup):
        case.step()
    kernels = harness.kernel_times(case.step, device, args.steps, args.full_names)
    result["kernels"] = {k: {"ms": v[0], "launches": v[1]} for k, v in kernels.items()}
    total = sum(v[0] for v in kernels.values())
    print(
        f"{workload.name}: "
        + ", ".join(
            f"{'wall' if k == 'wall_ms' else 'checks ' + k.rsplit('_', 1)[-1]} {v:.3f} ms"
            for k, v in result.items()
            if k.startswith("wall")
        )
        + " per synchronised forward+backward"
    )
    print(f"  {'device activity':60s} {'ms/step':>9s} {'launches':>9s} {'share':>7s}")
    for name, (ms, launches) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
        print(f"  {name[:60]:60s} {ms:9.3f} {launches:9.1f} {ms / total if total else 0.0:7.1%}")
    print(f"  {'sum':60s} {total:9.3f}")
    result["device_ms"] = total
    if args.table:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                case.step()
            harness.sync(device)
        averages = prof.key_averages()
        print(averages.table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=60))
        print(averages.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=60))
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/profile/kernels.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*", default=["W4"], help="W1 ... W6 or tiny (default W4)")
    parser.add_argument("--build", default=None, help="folder holding the pulsar_py to profile (default: installed)")
    parser.add_argument("--steps", type=int, default=10, help="forward+backward steps per measurement (default 10)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (default 5)")
    parser.add_argument("--grads", default="all", help="all, or some of pos,col,rad,opacity,cam")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a renderer attribute before timing (repeatable)",
    )
    parser.add_argument("--full-names", action="store_true", help="one row per kernel instance, full names")
    parser.add_argument("--table", action="store_true", help="also torch.profiler's host and device tables")
    parser.add_argument("--json", dest="json_path", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    try:
        workloads = harness.parse_workloads(" ".join(args.workloads))
        harness.parse_grads(args.grads)
        harness.parse_attrs(args.set)
    except ValueError as exc:
        parser.error(str(exc))
    if not torch.cuda.is_available():
        parser.error("needs a CUDA device")
    harness.use_build(args.build)
    report = dict(
        device=torch.cuda.get_device_name(),
        torch=torch.__version__,
        build=harness.build_description(),
        steps=args.steps,
        grads=args.grads,
        set=args.set,
        workloads=[profile_workload(w, args) for w in workloads],
    )
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
