#!/usr/bin/env python3
"""Host timeline of one forward+backward: where the host spends its time before the first
kernel, and where the device then waits for it.

    python benchmarks/profile/host_timeline.py W3 [W4 tiny ...] [--build DIR] [--python]

Every run starts from an idle, synchronised device and ends synchronised, as the
benchmark's runs do; the run of median span is printed. Modes:

  (default)      torch.profiler, host and device: the host operations of the run up to
                 the first device activity as a tree (offset from the run's start,
                 duration), then the device's busy and idle time and its largest gaps
                 with the host operations running when each ended. --python adds the
                 Python functions to the tree (with_stack; slows the host it measures).
  --device-only  CUPTI activities alone (no host tracing): a marker kernel where the
                 run starts, then the wait before the first activity and the idle time
                 before each later one, summed by activity name.
  --stamp F      microseconds from the run's start to the entry and exit of F
                 ('module:Qualified.name', repeatable), median over runs; no profiler.
  --per-call     host microseconds per call of the forward (no gradients), the forward
                 with gradients and the forward+backward, over --calls calls.
  --cprofile N   cProfile of N forwards with gradients, by own time.

The workload 'tiny' (one sphere, 16x16 pixels) isolates the host's cost of a call. On the
CPU only --stamp, --per-call and --cprofile mean much; the default then lists the
host operations of the whole run.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import json
import pstats
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import harness
import torch

MARKER = "host-timeline-run"


# ----------------------------------------------------------------------------------------
# Analysis of one run (plain tuples, so that it reads any trace)


def device_gaps(t0: float, acts: Sequence[Tuple[float, float, str]]) -> Dict[str, object]:
    """Busy time, the idle time before the first activity (from t0) and the gaps before
    each later activity, of activities (start, end, name) sorted by start."""
    if not acts:
        return dict(busy=0.0, before_first=None, gaps=[], end=t0)
    cursor, busy, gaps = acts[0][0], 0.0, []
    for start, end, name in acts:
        if start > cursor:
            gaps.append((start - cursor, cursor, start, name))
        busy += max(0.0, end - max(start, cursor))
        cursor = max(cursor, end)
    return dict(busy=busy, before_first=acts[0][0] - t0, gaps=gaps, end=cursor)


DEVICE_CATEGORIES = {"kernel", "gpu_memset", "gpu_memcpy"}
HOST_CATEGORIES = {"cpu_op", "python_function", "cuda_runtime", "cuda_driver", "user_annotation"}


def load_trace(prof) -> List[dict]:
    """The complete events ('ph' X) of a torch.profiler run, from its Chrome trace: every
    torch version writes it, and reading it does not decode names that some versions
    fail to decode in ``prof.events()`` when Python functions are traced."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "trace.json")
        prof.export_chrome_trace(str(path))
        text = path.read_bytes().decode("utf-8", errors="replace")
    try:
        trace = json.loads(text)
        events = trace["traceEvents"] if isinstance(trace, dict) else trace
    except json.JSONDecodeError:
        events = _events_line_by_line(text)
    return [e for e in events if e.get("ph") == "X" and "ts" in e and "dur" in e]


def _events_line_by_line(text: str) -> List[dict]:
    """The events of a Chrome trace that is not valid JSON (a traced Python function's
    name can carry stray bytes, quotes included), read field by field: the trace writes
    one field per line."""
    events = []
    for block in re.split(r"\n\s*\{\s*\n", text):
        event: Dict[str, object] = {}
        for key in ("ph", "cat", "name"):
            found = re.search(rf'^\s*"{key}": "(.*)",?\s*$', block, re.MULTILINE)
            if found:
                event[key] = found.group(1)
        for key in ("pid", "tid", "ts", "dur"):
            found = re.search(rf'^\s*"{key}": "?([-0-9.]+)"?,?\s*$', block, re.MULTILINE)
            if found:
                event[key] = float(found.group(1))
        if event:
            events.append(event)
    return events


def host_depths(events: Sequence[dict]) -> List[Tuple[dict, int]]:
    """(event, nesting depth) of host events, depth 1 for the outermost of each thread."""
    out = []
    by_thread: Dict[object, List[dict]] = defaultdict(list)
    for e in events:
        by_thread[(e.get("pid"), e.get("tid"))].append(e)
    for thread in by_thread.values():
        stack: List[float] = []
        for e in sorted(thread, key=lambda e: (float(e["ts"]), -float(e["dur"]))):
            start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            while stack and stack[-1] <= start:
                stack.pop()
            out.append((e, len(stack) + 1))
            stack.append(end)
    return out


def trace_mode(case: harness.Case, runs: int, python: bool, max_depth: int, min_us: float) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if case.device.type == "cuda" else [])
    with profile(activities=activities, with_stack=python) as prof:
        for _ in range(runs):
            case.reset()
            harness.sync(case.device)
            with torch.profiler.record_function(MARKER):
                case.forward_backward()
                harness.sync(case.device)
    events = load_trace(prof)
    steps = [e for e in events if e.get("name") == MARKER and e.get("cat") == "user_annotation"]
    acts = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"])
        for e in events
        if e.get("cat") in DEVICE_CATEGORIES
    )
    host = [e for e in events if e.get("cat") in HOST_CATEGORIES]
    results = []
    for step in steps:
        t0, t1 = float(step["ts"]), float(step["ts"]) + float(step["dur"])
        mine = [a for a in acts if t0 <= a[0] <= t1]
        results.append((t1 - t0, step, mine, device_gaps(t0, mine)))
    if not results:
        print("  no runs found in the trace")
        return
    results.sort(key=lambda r: r[0])
    span, step, mine, gaps = results[len(results) // 2]
    t0, t1 = float(step["ts"]), float(step["ts"]) + float(step["dur"])
    first = mine[0][0] if mine else t1
    print(
        f"  run of median span: {span:.0f} us on the host clock; {len(mine)} device activities, busy "
        f"{gaps['busy']:.0f} us" + (f"; first device activity at +{gaps['before_first']:.0f} us" if mine else "")
    )
    with_acts = [r for r in results if r[2]]
    print(
        f"  median over {len(results)} runs: span {statistics.median(r[0] for r in results):.0f} us"
        + (
            f", before the first activity {statistics.median(r[3]['before_first'] for r in with_acts):.0f} us"
            if with_acts
            else ""
        )
    )
    in_run = [e for e in host if t0 <= float(e["ts"]) <= t1]
    title = "before the first device activity" if mine else "of the run"
    print(f"  host operations {title} (offset us, duration us; depth <= {max_depth}, >= {min_us} us):")
    for e, depth in sorted(host_depths(in_run), key=lambda ed: (float(ed[0]["ts"]), -float(ed[0]["dur"]))):
        if e is step or float(e["ts"]) >= first:
            continue
        depth -= 1  # the run's marker is the outermost event of its thread
        if depth < 1 or depth > max_depth or float(e["dur"]) < min_us:
            continue
        print(f"    +{float(e['ts']) - t0:8.1f} {float(e['dur']):8.1f}  {'  ' * (depth - 1)}{e['name'][:90]}")
    if not mine:
        return
    idle = sum(g[0] for g in gaps["gaps"])
    print(
        f"  device idle between activities {idle:.0f} us, after the last {t1 - gaps['end']:.0f} us; "
        f"largest gaps, with the innermost host operations running when each ended:"
    )
    for gap, _, end, name in sorted(gaps["gaps"], key=lambda g: -g[0])[:12]:
        running = sorted(
            (e for e in in_run if e is not step and float(e["ts"]) <= end <= float(e["ts"]) + float(e["dur"])),
            key=lambda e: float(e["dur"]),
        )
        print(
            f"    {gap:7.1f} us before {name[:50]:50s} at +{end - t0:8.1f}  "
            f"[{', '.join(e['name'][:40] for e in running[:3])}]"
        )


def device_only_mode(case: harness.Case, runs: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    if case.device.type != "cuda":
        print("  --device-only needs CUDA")
        return
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            case.reset()
            torch.cuda.synchronize()
            torch.cuda._sleep(1000)  # the marker: a spin kernel of about a microsecond
            case.forward_backward()
            torch.cuda.synchronize()
    acts = harness.device_activities(prof)
    marks = [i for i, a in enumerate(acts) if "spin" in a[2].lower()]
    results = []
    for k, i in enumerate(marks):
        body = acts[i + 1 : marks[k + 1] if k + 1 < len(marks) else len(acts)]
        if body:
            gaps = device_gaps(acts[i][1], body)
            results.append((gaps["end"] - acts[i][1], gaps))
    if not results:
        print("  no runs found in the trace")
        return
    results.sort(key=lambda r: r[0])
    span, gaps = results[len(results) // 2]
    by_name: Dict[str, float] = defaultdict(float)
    for gap, _, _, name in gaps["gaps"]:
        by_name[name] += gap
    idle = sum(by_name.values())
    print(
        f"  run of median span: {span:.0f} us = busy {gaps['busy']:.0f} + before the first activity "
        f"{gaps['before_first']:.0f} + idle between activities {idle:.0f}"
    )
    print(
        f"  median over {len(results)} runs: span {statistics.median(r[0] for r in results):.0f} us, "
        f"busy {statistics.median(r[1]['busy'] for r in results):.0f}, "
        f"before the first {statistics.median(r[1]['before_first'] for r in results):.0f}"
    )
    small = sum(g for g in by_name.values() if g < 3.0)
    for name, gap in sorted(by_name.items(), key=lambda kv: -kv[1]):
        if gap >= 3.0:
            print(f"    {gap:7.1f} us before {name[:90]}")
    print(f"    {small:7.1f} us in gaps under 3 us each")


# ----------------------------------------------------------------------------------------
# Stamps, per-call times, cProfile


def install_stamps(targets: Sequence[str], stamps: List[Tuple[str, int]]) -> None:
    """Wrap each 'module:Qualified.name' so that its entry and exit append
    (label, perf_counter_ns) to ``stamps``."""
    for target in targets:
        module_name, _, qualname = target.partition(":")
        if not qualname:
            raise SystemExit(f"--stamp {target}: expected module:Qualified.name")
        owner = importlib.import_module(module_name)
        *path, attr = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
        if raw is None:
            raise SystemExit(f"--stamp {target}: not found")
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        inner = raw.__func__ if kind else raw

        def wrapped(*args, _inner=inner, _label=qualname, **kwargs):
            stamps.append((f"{_label} in", time.perf_counter_ns()))
            try:
                return _inner(*args, **kwargs)
            finally:
                stamps.append((f"{_label} out", time.perf_counter_ns()))

        setattr(owner, attr, kind(wrapped) if kind else wrapped)


def stamp_mode(case: harness.Case, runs: int, targets: Sequence[str]) -> None:
    stamps: List[Tuple[str, int]] = []
    install_stamps(targets, stamps)
    for _ in range(3):
        case.step()
    per_label: Dict[str, List[float]] = defaultdict(list)
    for _ in range(runs):
        case.reset()
        harness.sync(case.device)
        stamps.clear()
        t0 = time.perf_counter_ns()
        case.forward_backward()
        harness.sync(case.device)
        end = time.perf_counter_ns()
        seen = set()
        for label, t in stamps + [("run end (synchronised)", end)]:
            if label not in seen:  # the first occurrence in the run
                seen.add(label)
                per_label[label].append((t - t0) / 1e3)
    print(f"  microseconds from the run's start (median of {runs} runs):")
    for label, values in sorted(per_label.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"    {statistics.median(values):10.1f}  {label}")


def per_call_us(device: torch.device, fn: Callable[[], object], calls: int) -> float:
    for _ in range(max(1, calls // 10)):
        fn()
    harness.sync(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    harness.sync(device)
    return (time.perf_counter() - t0) / calls * 1e6


def per_call_mode(case: harness.Case, calls: int) -> None:
    print(f"  host microseconds per call ({calls} calls each, synchronised only at the end):")
    for name, fn in [
        ("forward, no gradients", case.forward),
        ("forward with gradients", case.forward_with_graph),
        ("forward+backward", case.step),
    ]:
        print(f"    {name:28s} {per_call_us(case.device, fn, calls):10.1f}")


def cprofile_mode(case: harness.Case, calls: int) -> None:
    for _ in range(5):
        case.forward_with_graph()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        case.forward_with_graph()
    profiler.disable()
    harness.sync(case.device)
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(25)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/profile/host_timeline.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*", default=["W3"], help="W1 ... W6 or tiny (default W3)")
    parser.add_argument("--build", default=None, help="folder holding the pulsar_py to profile (default: installed)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (default 7)")
    parser.add_argument("--grads", default="all", help="all, or some of pos,col,rad,opacity,cam")
    parser.add_argument("--python", action="store_true", help="trace Python functions too (slows the host)")
    parser.add_argument(
        "--depth", type=int, default=None, help="depth of the host tree printed (default 3; 12 with --python)"
    )
    parser.add_argument("--min-us", type=float, default=2.0, help="host operations shorter than this are left out")
    parser.add_argument("--device-only", action="store_true", help="CUPTI activities only (no host tracing)")
    parser.add_argument(
        "--stamp",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="time the entry and exit of this function from the run's start (repeatable)",
    )
    parser.add_argument("--per-call", action="store_true", help="host microseconds per call")
    parser.add_argument("--calls", type=int, default=2000, help="calls for --per-call and --cprofile")
    parser.add_argument("--cprofile", action="store_true", help="cProfile of --calls forwards with gradients")
    args = parser.parse_args(argv)
    try:
        workloads = harness.parse_workloads(" ".join(args.workloads))
        grads = harness.parse_grads(args.grads)
    except ValueError as exc:
        parser.error(str(exc))
    harness.use_build(args.build)
    device = torch.device(args.device)
    trace = not (args.device_only or args.stamp or args.per_call or args.cprofile)
    for workload in workloads:
        print(f"{workload.name} on {device}:")
        case = harness.Case(workload, device, grads)
        for _ in range(3):
            case.step()
        if trace:
            depth = args.depth if args.depth is not None else (12 if args.python else 3)
            trace_mode(case, args.runs, args.python, depth, args.min_us)
        if args.device_only:
            device_only_mode(case, args.runs)
        if args.stamp:
            stamp_mode(case, args.runs, args.stamp)
        if args.per_call:
            per_call_mode(case, args.calls)
        if args.cprofile:
            cprofile_mode(case, args.calls)
        del case
    return 0


if __name__ == "__main__":
    sys.exit(main())
