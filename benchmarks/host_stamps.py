"""Host time of the steps of one forward call up to its native binning, on a workload's
real inputs (profile_kernels.py's workloads; ``tiny``: 1 sphere, 16x16 pixels): the
median over runs of the microseconds from the call's entry to each step, taken with
time.perf_counter_ns around wrapped functions (the wrappers add well under 1 us each).
Each run starts from an idle, synchronised device, as the benchmark's do.

Usage: python3 benchmarks/host_stamps.py W1 [tiny ...]
"""
import statistics
import sys
import time
from collections import defaultdict

import torch

import pulsar_py._autograd as autograd_mod
import pulsar_py._checks as checks_mod
import pulsar_py.renderer as renderer_mod
from host_path import tiny_scene
from profile_kernels import workload_step

RUNS = 50
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU only to try the script
stamps = []


def mark(label: str) -> None:
    stamps.append((label, time.perf_counter_ns()))


def wrap(owner, name: str) -> None:
    inner = getattr(owner, name)

    def wrapped(*args, **kwargs):
        mark(f"{name} in")
        out = inner(*args, **kwargs)
        mark(f"{name} out")
        return out

    setattr(owner, name, wrapped)


class NativeProxy:
    """Stamps the native renderer's calls."""

    def __init__(self, native):
        self._native = native

    def __getattr__(self, key):
        target = getattr(self._native, key)
        if not callable(target):
            return target

        def call(*args):
            mark(f"native.{key} in")
            out = target(*args)
            mark(f"native.{key} out")
            return out

        return call


def tiny_step():
    r, scene = tiny_scene(DEVICE)
    leaves = [t.clone().requires_grad_() for t in scene]

    def step():
        img = r(leaves[0], leaves[1], leaves[2], leaves[4], opacity=leaves[3], gamma=0.1, max_depth=45.0,
                percent_allowed_difference=0.01)
        torch.autograd.grad(img.sum(), leaves)

    return r, step


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def one_workload(name: str) -> None:
    r, step = tiny_step() if name == "tiny" else workload_step(name, DEVICE)
    original = r._native_for
    proxies = {}

    def native_for(device, orthographic=None):
        native = original(device, orthographic)
        return proxies.setdefault(id(native), NativeProxy(native))

    r._native_for = native_for
    for _ in range(5):
        step()
    per_label = defaultdict(list)
    for _ in range(RUNS):
        sync()
        stamps.clear()
        mark("call")
        step()
        t0 = stamps[0][1]
        seen = set()
        for label, t in stamps[1:]:
            if label not in seen:  # the first occurrence in the run
                seen.add(label)
                per_label[label].append((t - t0) / 1e3)
    sync()
    print(f"{name}: microseconds from the call's entry (median of {RUNS} runs)")
    for label, values in sorted(per_label.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"  {statistics.median(values):9.1f}  {label}")


if __name__ == "__main__":
    wrap(checks_mod, "check_scene")
    wrap(checks_mod, "check_cam_params")
    wrap(checks_mod, "check_call_settings")
    wrap(renderer_mod, "convert_camera_vectors")
    wrap(autograd_mod, "_scene_args")
    wrap(autograd_mod.CallSettings, "options")
    wrap(torch, "empty")
    wrap(autograd_mod.RenderFunction, "forward")
    for w in sys.argv[1:] or ["tiny"]:
        one_workload(w)
