"""Where the GPU waits for the host in one forward + backward (the benchmark's measure:
the GPU idle at the start, every run synchronised). Profiles a few synchronised runs of a
workload with torch.profiler (CPU and CUDA) and prints, for the last one, the GPU's busy
time, its idle time before the first kernel, between kernels and after the last, and the
largest gaps with the host operation that was running when each ended.

Usage: python3 benchmarks/host_gaps.py W3 [W4 ...]
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from profile_kernels import workload_step


def one_workload(name: str) -> None:
    _, step = workload_step(name)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            torch.cuda.synchronize()
            with torch.profiler.record_function("STEP"):
                step()
                torch.cuda.synchronize()
    events = prof.events()
    steps = [e for e in events if e.name == "STEP" and e.device_type.name == "CPU"]
    last = steps[-1]
    t0, t1 = last.time_range.start, last.time_range.end  # us, host clock
    # GPU activities (kernels, memsets, copies), not the profiler's own GPU-side ranges.
    kernels = sorted((e for e in events if e.device_type.name == "CUDA" and e.name != "STEP"
                      and e.time_range.start >= t0 and e.time_range.end <= t1 + 1), key=lambda e: e.time_range.start)
    cpu_ops = [e for e in events if e.device_type.name == "CPU" and e.time_range.start >= t0
               and e.time_range.end <= t1 and e.name != "STEP"]
    busy = 0.0
    gaps = []
    cursor = t0
    for k in kernels:
        if k.time_range.start > cursor:
            gaps.append((k.time_range.start - cursor, cursor, k))
        busy += k.time_range.end - max(k.time_range.start, cursor) if k.time_range.end > cursor else 0.0
        cursor = max(cursor, k.time_range.end)
    tail = t1 - cursor
    print(f"{name}: step {t1 - t0:.0f} us (host clock), GPU busy {busy:.0f} us, idle {sum(g[0] for g in gaps):.0f} "
          f"us between/before kernels + {tail:.0f} us after the last; {len(kernels)} GPU activities")
    for op in ("RenderFunction", "RenderFunctionBackward", "CameraParamsFunction", "CameraParamsFunctionBackward",
               "cudaStreamSynchronize", "cudaLaunchKernel", "cudaMemsetAsync"):
        mine = [e for e in cpu_ops if e.name == op]
        if mine:
            print(f"  host {op}: {len(mine)} x, {sum(e.time_range.end - e.time_range.start for e in mine):.0f} us")
    for gap, start, k in sorted(gaps, key=lambda g: -g[0])[:12]:
        # The innermost host ops running at the gap's end (what the GPU was waiting for).
        running = [e for e in cpu_ops if e.time_range.start <= k.time_range.start <= e.time_range.end]
        running.sort(key=lambda e: e.time_range.end - e.time_range.start)
        names = ", ".join(e.name[:40] for e in running[:3])
        print(f"  {gap:7.1f} us before {k.name[:50]:50s} at +{start - t0:7.1f}  [{names}]")


if __name__ == "__main__":
    for w in sys.argv[1:] or ["W3"]:
        one_workload(w)
