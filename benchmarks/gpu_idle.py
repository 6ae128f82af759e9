"""Where the GPU idles in one forward + backward, measured the benchmark's way (each run
from an idle GPU, synchronised at its end), from the device's own timeline: CUPTI
activities only (no host-side tracing, which slows the host that is being measured).

Each run starts with a marker kernel (torch.cuda._sleep's spin kernel, about a
microsecond) enqueued where the benchmark records its start event. A run's idle time is
the time between the marker's end and the last activity's end with nothing running on
the device: the wait before the first activity (the Python of the call up to its first
launch), and the gap before each later activity, summed by that activity's name. The
run of median span is printed in full, with the medians over runs of its totals.

Usage: python3 benchmarks/gpu_idle.py W1 [W2B ...] (profile_kernels.py's workloads)
"""
import statistics
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from profile_kernels import workload_step

RUNS = 7


def device_activities(prof) -> list:
    """(start us, end us, name) of every kernel, memset and copy, by start."""
    out = []
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        out.append((e.time_range.start, e.time_range.end, e.name))
    return sorted(out)


def one_workload(name: str) -> None:
    _, step = workload_step(name)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(RUNS):
            torch.cuda.synchronize()
            torch.cuda._sleep(1000)  # the marker: about a microsecond of clock cycles
            step()
            torch.cuda.synchronize()
    acts = device_activities(prof)
    starts = [i for i, a in enumerate(acts) if "spin_kernel" in a[2]]
    runs = []
    for k, i in enumerate(starts):
        j = starts[k + 1] if k + 1 < len(starts) else len(acts)
        body = acts[i + 1:j]
        if not body:
            continue
        # The wait before the first activity is reported apart, not among the gaps.
        cursor, busy, before_first = body[0][0], 0.0, body[0][0] - acts[i][1]
        gaps = defaultdict(float)
        for s, e, n in body:
            if s > cursor:
                gaps[n] += s - cursor
            busy += max(0.0, e - max(s, cursor))
            cursor = max(cursor, e)
        runs.append(dict(span=cursor - acts[i][1], busy=busy, first=before_first, gaps=gaps, n=len(body)))
    if not runs:
        print(f"{name}: no runs found in the trace")
        return
    runs.sort(key=lambda r: r["span"])
    mid = runs[len(runs) // 2]
    idle = mid["span"] - mid["busy"]
    print(f"{name}: {len(runs)} runs; median span {mid['span']:.0f} us = busy {mid['busy']:.0f} + idle {idle:.0f} "
          f"({mid['n']} activities); before the first activity {mid['first']:.0f} us")
    print(f"  median over runs: span {statistics.median(r['span'] for r in runs):.0f}, "
          f"busy {statistics.median(r['busy'] for r in runs):.0f}, "
          f"before first {statistics.median(r['first'] for r in runs):.0f}")
    later = sorted(((g, n) for n, g in mid["gaps"].items()), reverse=True)
    small = sum(g for g, _ in later if g < 3.0)
    for g, n in later:
        if g >= 3.0:
            print(f"  {g:7.1f} us before {n[:90]}")
    print(f"  {small:7.1f} us in gaps under 3 us each")


if __name__ == "__main__":
    for w in sys.argv[1:] or ["W1"]:
        one_workload(w)
