"""What the profiling tools of benchmarks/profile share: the standard workloads W1-W6,
one workload's calls on the public API of whichever pulsar_py is imported, timing, the
kernel times of a few steps, and the checks of build folders.

Only ``from pulsar_py import Renderer``, Pulsar's constructor and call signature and the
``check_values`` attribute (when present) are used, so that builds of any revision,
the previous release included, are timed by this same code.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

# ----------------------------------------------------------------------------------------
# Workloads. A copy of the driver's definitions (pulsar_py/tools/bench.py, which follows
# performance.md), not an import: the tools time build folders of any revision, and the
# package under test may not hold pulsar_py.tools.bench (or hold another version of it),
# while importing the checkout's copy would import a second pulsar_py beside the build's.
# tests/tools/test_ab_builds.py checks that this copy draws the driver's spheres.

GAMMA = 0.1
MAX_DEPTH = 45.0
PERCENT_ALLOWED_DIFFERENCE = 0.01
N_TRACK = 5
CAM_PARAMS = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 2.0)
SEED = 1


@dataclass(frozen=True)
class Workload:
    """Radius = radius_scale * (radius_offset + u), u ~ U(0, 1); opacity uniform in
    opacity_range (None: no opacity); views > 1: one call renders that many cameras."""

    name: str
    n_spheres: int
    width: int
    height: int
    radius_scale: float
    radius_offset: float
    opacity_range: Optional[Tuple[float, float]]
    views: int = 1


WORKLOADS: Dict[str, Workload] = {
    w.name: w
    for w in [
        Workload("W1", 1_000_000, 1000, 1000, 1.0, 0.0, None),
        Workload("W2", 1_000_000, 1000, 1000, 1.0, 0.0, (0.1, 1.0)),
        Workload("W3", 10_000, 512, 512, 1.0, 0.0, (0.1, 1.0)),
        Workload("W4", 1_000_000, 1024, 1024, 0.038, 0.5, (0.1, 0.9)),
        Workload("W5", 4_000_000, 1024, 1024, 0.019, 0.5, (0.1, 0.9)),
        Workload("W6", 400_000, 512, 512, 0.05, 0.5, (0.1, 0.9), views=8),
        # Not a standard workload: one sphere on 16x16 pixels, where the host's work is the
        # whole cost of a call (host_timeline.py).
        Workload("tiny", 1, 16, 16, 1.0, 1.0, (0.5, 0.5)),
    ]
}


def parse_workloads(text: str) -> List[Workload]:
    """'W1,W3' (or 'W1 W3') -> the workloads; ValueError naming the unknown ones."""
    names = [s for s in re.split(r"[,\s]+", text.strip()) if s]
    by_key = {k.lower(): w for k, w in WORKLOADS.items()}
    unknown = [s for s in names if s.lower() not in by_key]
    if unknown or not names:
        raise ValueError(f"unknown workload(s) {', '.join(unknown) or text!r}; expected some of {', '.join(WORKLOADS)}")
    return [by_key[s.lower()] for s in names]


def cameras(workload: Workload) -> torch.Tensor:
    """[8], or [V, 8] for V views on a circle of radius 30 around (0, 0, 30) in the x-z
    plane, camera k at angle a = 2 pi k / V looking at the centre."""
    if workload.views == 1:
        return torch.tensor(CAM_PARAMS, dtype=torch.float64)
    rows = []
    for k in range(workload.views):
        a = 2 * math.pi * k / workload.views
        rows.append([-30 * math.sin(a), 0.0, 30 - 30 * math.cos(a), 0.0, a, 0.0, 5.0, 2.0])
    return torch.tensor(rows, dtype=torch.float64)


def make_inputs(
    workload: Workload, device: torch.device, dtype: torch.dtype = torch.float32
) -> List[Optional[torch.Tensor]]:
    """[positions, colours, radii, opacity or None, cam_params] as performance.md draws
    them: a CPU generator seeded 1 draws positions rand(N, 3) * 10 (z += 25, x, y -= 5),
    colours rand(N, 3), u = rand(N) for the radius (at least 1e-5), then rand(N) for the
    opacity when the workload has one; then cast and moved to ``device``."""
    gen = torch.Generator().manual_seed(SEED)
    n = workload.n_spheres
    pos = torch.rand(n, 3, generator=gen) * 10
    pos[:, 2] += 25
    pos[:, :2] -= 5
    col = torch.rand(n, 3, generator=gen)
    u = torch.rand(n, generator=gen)
    rad = (workload.radius_scale * (workload.radius_offset + u)).clamp_min(1e-5)
    opacity = None
    if workload.opacity_range is not None:
        low, high = workload.opacity_range
        opacity = low + (high - low) * torch.rand(n, generator=gen)
    if workload.name == "tiny":  # one sphere in front of the camera, covering the image
        pos = torch.tensor([[0.0, 0.0, 30.0]])
    tensors = [pos, col, rad, opacity, cameras(workload)]
    return [None if t is None else t.to(device=device, dtype=dtype).contiguous() for t in tensors]


# ----------------------------------------------------------------------------------------
# One workload's calls

GRAD_NAMES = ("pos", "col", "rad", "opacity", "cam")


def parse_grads(text: str) -> Tuple[str, ...]:
    """'all' or a comma-separated subset of pos, col, rad, opacity, cam: the inputs whose
    gradients the forward+backward requests."""
    if text.strip().lower() == "all":
        return GRAD_NAMES
    names = tuple(s.strip().lower() for s in text.split(",") if s.strip())
    unknown = [s for s in names if s not in GRAD_NAMES]
    if unknown or not names:
        raise ValueError(f"--grads: expected 'all' or some of {', '.join(GRAD_NAMES)}, got {text!r}")
    return names


def parse_attrs(items: Sequence[str]) -> Dict[str, object]:
    """['name=value', ...] -> {name: int, float or str value}."""
    attrs: Dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--set: expected NAME=VALUE, got {item!r}")
        value: object = text
        for kind in (int, float):
            try:
                value = kind(text)
                break
            except ValueError:
                continue
        attrs[name] = value
    return attrs


class RenderCall(torch.nn.Module):
    """A module whose forward is one render call with the workload's settings: what
    ``torch.compile`` compiles for the compiled variant."""

    def __init__(self, renderer: torch.nn.Module) -> None:
        super().__init__()
        self.renderer = renderer

    def forward(self, pos, col, rad, cam, opacity=None):
        kwargs = dict(percent_allowed_difference=PERCENT_ALLOWED_DIFFERENCE)
        if opacity is not None:
            kwargs["opacity"] = opacity
        return self.renderer(pos, col, rad, cam, GAMMA, MAX_DEPTH, **kwargs)


class Case:
    """One workload on one device with the imported pulsar_py: ``forward()`` renders
    without gradients; ``forward_backward()`` renders the inputs named in ``grads`` as
    leaves requiring gradients and back-propagates a fixed random dL/dimage; ``reset()``
    clears their gradients (outside the timed region). ``compiled``: the call goes through
    ``torch.compile`` of a RenderCall (``compile_backend``)."""

    def __init__(
        self,
        workload: Workload,
        device: torch.device,
        grads: Sequence[str] = GRAD_NAMES,
        attrs: Optional[Dict[str, object]] = None,
        compiled: bool = False,
        compile_backend: str = "inductor",
        check_values: bool = False,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        from pulsar_py import Renderer

        self.workload, self.device = workload, device
        renderer = Renderer(workload.width, workload.height, workload.n_spheres, n_channels=3, n_track=N_TRACK).to(
            device
        )
        if hasattr(renderer, "check_values"):
            renderer.check_values = check_values
        for name, value in (attrs or {}).items():
            if not hasattr(renderer, name):
                raise AttributeError(f"--set {name}: this build's Renderer has no attribute {name!r}")
            setattr(renderer, name, value)
        self.renderer = renderer
        call = RenderCall(renderer)
        self.call = torch.compile(call, backend=compile_backend) if compiled else call
        self.inputs = make_inputs(workload, device, dtype)
        self.leaves = [
            None if t is None else t.detach().clone().requires_grad_(name in grads)
            for name, t in zip(GRAD_NAMES, self.inputs)
        ]
        if not any(t is not None and t.requires_grad for t in self.leaves):
            raise ValueError(f"{workload.name}: none of the inputs named in --grads exists")
        with torch.no_grad():
            shape = self.forward().shape
        gen = torch.Generator().manual_seed(SEED + 1)
        self.grad_image = torch.rand(shape, generator=gen).to(device=device, dtype=dtype)

    def _render(self, tensors: List[Optional[torch.Tensor]]) -> torch.Tensor:
        pos, col, rad, opacity, cam = tensors
        return self.call(pos, col, rad, cam, opacity)

    def forward(self) -> torch.Tensor:
        with torch.no_grad():
            return self._render(self.inputs)

    def forward_with_graph(self) -> torch.Tensor:
        """The forward of forward_backward(): the image, with its autograd graph."""
        return self._render(self.leaves)

    def forward_backward(self) -> None:
        self._render(self.leaves).backward(self.grad_image)

    def reset(self) -> None:
        for t in self.leaves:
            if t is not None:
                t.grad = None

    def step(self) -> None:
        """reset() then forward_backward(): one unit for profilers."""
        self.reset()
        self.forward_backward()

    def fix_instance_capacity(self, steps: int = 3) -> bool:
        """Fix the renderer's instance capacity at what ``steps`` forward+backward steps
        taught it, so that no later call reads its instance count back (no call waits for
        the device). False where the renderer keeps no capacity (the CPU; builds without
        one)."""
        for _ in range(steps):
            self.step()
        return fix_learnt_capacity(self.renderer)


def fix_learnt_capacity(renderer: torch.nn.Module) -> bool:
    """Fix a Renderer's instance capacity at what its calls so far taught its native
    renderer. False where it keeps none (the CPU; builds without one; no call yet)."""
    from pulsar_py import ops

    natives = ops.natives_of(renderer._renderer_id) if hasattr(ops, "natives_of") else []
    capacity = natives[0].instance_capacity if len(natives) == 1 else 0
    if capacity <= 0:
        return False
    renderer.instance_capacity = capacity
    return True


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(
    device: torch.device,
    run: Callable[[], object],
    prepare: Callable[[], None],
    warmup: int,
    repeats: int,
    host: Optional[List[float]] = None,
) -> List[float]:
    """Milliseconds of ``repeats`` calls of ``run`` after ``warmup`` untimed ones, each
    from an idle device; ``prepare`` runs before each, outside the timed region. CUDA:
    events on the current stream; CPU: time.perf_counter (the driver's method). ``host``:
    a list that also gets each CUDA call's host time, time.perf_counter from the call to
    its return (the device may still be working; waits inside the call count)."""
    for _ in range(warmup):
        prepare()
        run()
    sync(device)
    times = []
    for _ in range(repeats):
        prepare()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            run()
            if host is not None:
                host.append((time.perf_counter() - t0) * 1000.0)
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1000.0)
    return times


def median(values: Sequence[float]) -> Optional[float]:
    return statistics.median(values) if values else None


# ----------------------------------------------------------------------------------------
# Kernel times (CUPTI through torch.profiler)


def kernel_base_name(name: str) -> str:
    """A kernel's name without its return type, namespaces, template arguments and
    parameters: 'void ns::render_forward_kernel<float, 3>(Args)' -> 'render_forward_kernel'."""
    text = name.replace("(anonymous namespace)", "anonymous")
    cut = min([i for i in (text.find("<"), text.find("(")) if i >= 0], default=len(text))
    head = text[:cut].strip()
    if head.startswith(("Memset", "Memcpy")):
        return head
    return head.split(" ")[-1].split("::")[-1] or name


def device_activities(prof) -> List[Tuple[float, float, str]]:
    """(start us, end us, name) of every device activity (kernels, memsets, copies) a
    torch.profiler run recorded, by start."""
    out = []
    for e in prof.events():
        if getattr(e.device_type, "name", str(e.device_type)) == "CUDA":
            out.append((float(e.time_range.start), float(e.time_range.end), e.name))
    return sorted(out)


def kernel_times(
    step: Callable[[], None], device: torch.device, steps: int = 10, full_names: bool = False
) -> Dict[str, Tuple[float, float]]:
    """{kernel: (ms per step, launches per step)} over ``steps`` runs of ``step`` (CUPTI
    activities only, so the host is not slowed by tracing); kernels of one base name
    (kernel_base_name) are summed unless ``full_names``."""
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync(device)
    totals: Dict[str, List[float]] = {}
    for start, end, name in device_activities(prof):
        key = name if full_names else kernel_base_name(name)
        entry = totals.setdefault(key, [0.0, 0.0])
        entry[0] += (end - start) / 1000.0
        entry[1] += 1
    return {k: (v[0] / steps, v[1] / steps) for k, v in totals.items()}


# ----------------------------------------------------------------------------------------
# Build folders


def native_module(build: str) -> Path:
    """The one pulsar_py/_native* module of a build folder (a ``pip install --target``
    folder or a copy of an installed package); ValueError otherwise."""
    package = Path(build, "pulsar_py")
    if not (package / "__init__.py").is_file():
        raise ValueError(f"{build}: no pulsar_py package (expected {package}/__init__.py)")
    modules = sorted(p for p in package.glob("_native*") if p.suffix in (".so", ".pyd"))
    if len(modules) != 1:
        found = ", ".join(m.name for m in modules) or "none"
        raise ValueError(f"{build}: expected one pulsar_py/_native module, found {found}")
    return modules[0]


def module_digest(build: str) -> str:
    """SHA-256 of the build folder's native module."""
    return hashlib.sha256(native_module(build).read_bytes()).hexdigest()


def check_builds(builds: Sequence[str], same_native: bool = False) -> List[str]:
    """The builds' module digests. ValueError when a folder holds no built package, when
    two folders carry the same native module (a build whose link never ran leaves the old
    module in place, and the A/B would then report no change), or, with ``same_native``
    (an A/B of the Python package alone), when they do not all carry the same one."""
    if len(builds) < 2:
        raise ValueError("expected at least two build folders")
    resolved = [str(Path(b).resolve()) for b in builds]
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"a build folder is named twice: {' '.join(builds)}")
    digests = [module_digest(b) for b in builds]
    if same_native:
        if len(set(digests)) != 1:
            raise ValueError(
                f"--same-native: the folders carry {len(set(digests))} different native modules: {', '.join(builds)}"
            )
        return digests
    seen: Dict[str, str] = {}
    for build, digest in zip(builds, digests):
        if digest in seen:
            raise ValueError(
                f"{seen[digest]} and {build} carry the same native module (sha256 "
                f"{digest[:12]}): rebuild and check that the link ran, or pass "
                f"--same-native to compare Python-only changes"
            )
        seen[digest] = build
    return digests


def use_build(build: Optional[str]) -> None:
    """Import pulsar_py from ``build`` (None: the installed one) and check where it came
    from: a build folder must win over any other pulsar_py on the path."""
    if build is not None:
        root = Path(build).resolve()
        sys.path.insert(0, str(root))
        # An editable install's import hook (a finder on sys.meta_path, consulted before
        # sys.path) would still hand out the source tree's pulsar_py: drop every finder
        # that places it outside the build folder.
        for finder in list(sys.meta_path):
            spec = finder.find_spec("pulsar_py", None) if hasattr(finder, "find_spec") else None
            origin = getattr(spec, "origin", None)
            if origin is not None and root not in Path(origin).resolve().parents:
                sys.meta_path.remove(finder)
    import pulsar_py

    if build is not None:
        where = Path(pulsar_py.__file__).resolve()
        if Path(build).resolve() not in where.parents:
            raise SystemExit(f"pulsar_py was imported from {where}, not from {build}")


def child_env(build: str) -> Dict[str, str]:
    """Environment of a process that must import pulsar_py from ``build``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(build).resolve())] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    )
    env["PYTHONNOUSERSITE"] = "1"
    return env


def driver_version() -> Optional[str]:
    """The NVIDIA driver's version from nvidia-smi, or None."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.split()
    return lines[0] if done.returncode == 0 and lines else None


def build_description() -> Dict[str, object]:
    """Version and build facts of the imported pulsar_py (what it exposes of them)."""
    import pulsar_py

    info: Dict[str, object] = {
        "version": getattr(pulsar_py, "__version__", None),
        "file": str(Path(pulsar_py.__file__).resolve().parent),
    }
    build_info = getattr(pulsar_py, "build_info", None)
    if callable(build_info):
        try:
            info["build_info"] = {k: list(v) if isinstance(v, tuple) else v for k, v in build_info().items()}
        except Exception as exc:  # an old build's build_info failing must not stop the timing
            info["build_info"] = f"{type(exc).__name__}: {exc}"
    return info


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``harness.py --step W3 [--dtype float64]``: one forward+backward of a workload on
    the GPU, every gradient requested (what gpu_check.sh runs under compute-sanitizer)."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--step", required=True, choices=sorted(WORKLOADS), help="the workload")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    case = Case(WORKLOADS[args.step], device, dtype=getattr(torch, args.dtype))
    case.step()
    sync(device)
    print(f"{args.step} ({args.dtype}): one forward+backward done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
