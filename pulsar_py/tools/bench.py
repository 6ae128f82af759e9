"""Benchmark driver: the standard workloads W1-W6 of docs/benchmarks.md (performance.md).

    python -m pulsar_py bench [--device cuda] [--workloads W3,W4] [--json PATH]
    python benchmarks/run.py ...        (the same, from a checkout)

For each workload: the median forward and forward+backward time (all gradients
requested: positions, colours, radii, opacity when present, camera), and the memory the
call needs: on CUDA the caching allocator's peak growth over the call plus the
renderer's own scratch; on the CPU the renderer's scratch alone. When ``pytorch3d`` is
importable, PyTorch3D's Pulsar renders the same inputs in the same process and the
ratios are printed; otherwise Pulsar's H100 figures from performance.md are shown as the
reference. The driver builds nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .args import command_device

# Render settings every workload uses (performance.md, "Standard workloads").
GAMMA = 0.1
MAX_DEPTH = 45.0
PERCENT_ALLOWED_DIFFERENCE = 0.01
N_TRACK = 5
CAM_PARAMS = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 2.0)  # at the origin, along +z, focal 5, sensor 2
SEED = 1
MIB = 2.0**20


@dataclass(frozen=True)
class PulsarFigures:
    """Pulsar on an H100 (performance.md): forward and forward+backward ms, device MiB."""

    fwd_ms: float
    fwd_bwd_ms: float
    memory_mib: float


@dataclass(frozen=True)
class Workload:
    """One standard workload. Radius = radius_scale * (radius_offset + u), u ~ U(0, 1)."""

    name: str
    label: str
    n_spheres: int
    width: int
    height: int
    radius_scale: float
    radius_offset: float
    opacity_range: Optional[Tuple[float, float]]
    views: int
    reference: PulsarFigures

    @property
    def image_text(self) -> str:
        size = f"{self.width}x{self.height}"
        return size if self.views == 1 else f"{size}x{self.views}"


WORKLOADS: Dict[str, Workload] = {
    w.name: w
    for w in [
        Workload("W1", "pulsar_bm", 1_000_000, 1000, 1000, 1.0, 0.0, None, 1, PulsarFigures(12.6, 17.7, 700)),
        Workload(
            "W2", "pulsar_bm_opacity", 1_000_000, 1000, 1000, 1.0, 0.0, (0.1, 1.0), 1, PulsarFigures(39.7, 45.2, 430)
        ),
        Workload("W3", "small", 10_000, 512, 512, 1.0, 0.0, (0.1, 1.0), 1, PulsarFigures(4.4, 8.8, 40)),
        Workload("W4", "dense_1m", 1_000_000, 1024, 1024, 0.038, 0.5, (0.1, 0.9), 1, PulsarFigures(13.7, 18.2, 434)),
        Workload("W5", "dense_4m", 4_000_000, 1024, 1024, 0.019, 0.5, (0.1, 0.9), 1, PulsarFigures(37.5, 42.7, 1334)),
        Workload("W6", "multiview", 400_000, 512, 512, 0.05, 0.5, (0.1, 0.9), 8, PulsarFigures(57.8, 65.3, 1508)),
    ]
}


# ----------------------------------------------------------------------------------------
# Inputs


@dataclass
class Inputs:
    """One workload's tensors: positions [N, 3], colours [N, 3], radii [N], opacity [N]
    or None, cam_params [8] (one view) or [V, 8] (V views of the same spheres)."""

    positions: torch.Tensor
    colours: torch.Tensor
    radii: torch.Tensor
    opacity: Optional[torch.Tensor]
    cam_params: torch.Tensor

    def tensors(self) -> List[torch.Tensor]:
        return [t for t in (self.positions, self.colours, self.radii, self.opacity, self.cam_params) if t is not None]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "Inputs":
        return Inputs(
            fn(self.positions),
            fn(self.colours),
            fn(self.radii),
            None if self.opacity is None else fn(self.opacity),
            fn(self.cam_params),
        )


def workload_cameras(workload: Workload) -> torch.Tensor:
    """[8] for one view; for W6 [8, 8]: cameras on a circle of radius 30 around
    (0, 0, 30) in the x-z plane, camera k at angle a = 2 pi k / 8, looking at the centre
    (axis-angle rotation by a about y)."""
    if workload.views == 1:
        return torch.tensor(CAM_PARAMS, dtype=torch.float64)
    rows = []
    for k in range(workload.views):
        a = 2 * math.pi * k / workload.views
        rows.append([-30 * math.sin(a), 0.0, 30 - 30 * math.cos(a), 0.0, a, 0.0, 5.0, 2.0])
    return torch.tensor(rows, dtype=torch.float64)


def make_inputs(workload: Workload, device: torch.device, dtype: torch.dtype = torch.float32) -> Inputs:
    """The workload's spheres, drawn exactly as performance.md says, on ``device``.

    A CPU ``torch.Generator`` seeded 1 draws (float32), in this order: positions
    ``rand(N, 3) * 10`` with z += 25 and x, y -= 5; colours ``rand(N, 3)``; ``u = rand(N)``
    for the radius (clamped to at least 1e-5); ``rand(N)`` for the opacity when the
    workload has one, scaled to its range. Then cast to ``dtype`` and moved.
    """
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
    inputs = Inputs(pos, col, rad, opacity, workload_cameras(workload))
    return inputs.map(lambda t: t.to(device=device, dtype=dtype).contiguous())


# ----------------------------------------------------------------------------------------
# Timing and memory


def _native_counter(renderer: torch.nn.Module, device: torch.device, name: str) -> Optional[int]:
    """A counter of the renderer's native object for ``device``: ``scratch_bytes`` or
    ``binned_instances``; None when it cannot be read.

    The one place where the driver reaches into the renderer's internals: the native
    renderers a Renderer module made (pulsar_py.ops.natives_of, keyed by the module's id),
    each exposing the counters as read-only properties. Every figure it feeds is optional,
    so a renderer without them (a peer) gives None and the timings stand.
    """
    from .. import _native, ops

    renderer_id = getattr(renderer, "_renderer_id", None)
    if renderer_id is None:
        return None
    kind = _native.DeviceKind.cuda if device.type == "cuda" else _native.DeviceKind.cpu
    index = device.index if device.index is not None else (torch.cuda.current_device() if device.type == "cuda" else 0)
    natives = [
        n
        for n in ops.natives_of(renderer_id)
        if n.config.device == kind and (device.type != "cuda" or n.config.device_index == index)
    ]
    if not natives:
        return None
    native = natives[-1]
    value = getattr(native, name, None)
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


def scratch_bytes(renderer: torch.nn.Module, device: torch.device) -> Optional[int]:
    """Bytes of scratch the renderer's native object for ``device`` holds (host memory on
    the CPU, device memory on CUDA); None when it has none or it cannot be read."""
    return _native_counter(renderer, device, "scratch_bytes")


def binned_instances(renderer: torch.nn.Module, device: torch.device) -> Optional[int]:
    """(tile, sphere) instances the renderer's last binning stored; None when it cannot
    be read (nothing rendered yet, a peer renderer)."""
    return _native_counter(renderer, device, "binned_instances")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(
    device: torch.device,
    run: Callable[[], Any],
    prepare: Callable[[], None],
    warmup: int,
    repeats: int,
    progress: Callable[[str], None],
) -> List[float]:
    """Milliseconds of ``repeats`` calls of ``run`` after ``warmup`` untimed ones;
    ``prepare`` runs before each call, outside the timed region. CUDA: events on the
    current stream; CPU: time.perf_counter."""
    for i in range(warmup):
        prepare()
        run()
        progress(f"warm-up {i + 1}/{warmup}")
    _sync(device)
    times = []
    for i in range(repeats):
        prepare()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            times.append(float(start.elapsed_time(end)))
        else:
            start_s = time.perf_counter()
            run()
            times.append((time.perf_counter() - start_s) * 1000.0)
        progress(f"run {i + 1}/{repeats}: {times[-1]:.2f} ms")
    return times


class MemoryProbe:
    """Memory a phase needs. CUDA: allocator peak growth over the phase, and the
    growth of the device's used memory (what performance.md reports for Pulsar: its
    own buffers plus PyTorch's cache). CPU: nothing (the renderer's scratch is added
    separately)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def device_used(self) -> Optional[int]:
        if not self.cuda:
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        return int(total - free)

    def start(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)

    def peak_growth(self) -> Optional[int]:
        if not self.cuda:
            return None
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device) - self._base)


# ----------------------------------------------------------------------------------------
# One renderer on one workload


@dataclass
class Measurement:
    """Figures of one renderer on one workload (times in ms, memory in MiB)."""

    fwd_ms: float
    fwd_bwd_ms: float
    fwd_times_ms: List[float]
    fwd_bwd_times_ms: List[float]
    memory_mib: Optional[float]  # allocator peak growth (fwd+bwd) + scratch
    allocator_peak_fwd_mib: Optional[float]
    allocator_peak_fwd_bwd_mib: Optional[float]
    scratch_mib: Optional[float]
    device_used_growth_mib: Optional[float]
    binned_instances: Optional[int] = None  # (tile, sphere) instances of the last binning
    image: Optional[torch.Tensor] = None  # last forward image (for the peer comparison)


def _render_args(inputs: Inputs) -> Dict[str, Any]:
    return dict(
        gamma=GAMMA, max_depth=MAX_DEPTH, opacity=inputs.opacity, percent_allowed_difference=PERCENT_ALLOWED_DIFFERENCE
    )


def measure(
    renderer_factory: Callable[[], torch.nn.Module],
    inputs: Inputs,
    device: torch.device,
    warmup_fwd: int,
    warmup_bwd: int,
    repeats: int,
    progress: Callable[[str], None],
    keep_image: bool = False,
) -> Measurement:
    """Time the forward (no gradients) and forward+backward (every input requires a
    gradient; dL/dimage is a fixed random tensor) of a renderer made by
    ``renderer_factory`` on ``inputs``."""
    probe = MemoryProbe(device)
    if probe.cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
    used_before = probe.device_used()
    renderer = renderer_factory()

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return renderer(inputs.positions, inputs.colours, inputs.radii, inputs.cam_params, **_render_args(inputs))

    probe.start()
    fwd_times = time_runs(device, forward, lambda: None, warmup_fwd, repeats, lambda s: progress(f"forward {s}"))
    peak_fwd = probe.peak_growth()
    image = forward() if keep_image else None

    leaves = inputs.map(lambda t: t.detach().clone().requires_grad_(True))
    gen = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        shape = forward().shape
    grad_image = torch.rand(shape, generator=gen).to(device=device, dtype=inputs.positions.dtype)

    def clear_grads() -> None:
        for t in leaves.tensors():
            t.grad = None

    def forward_backward() -> None:
        img = renderer(leaves.positions, leaves.colours, leaves.radii, leaves.cam_params, **_render_args(leaves))
        img.backward(grad_image)

    clear_grads()
    probe.start()
    bwd_times = time_runs(
        device, forward_backward, clear_grads, warmup_bwd, repeats, lambda s: progress(f"forward+backward {s}")
    )
    peak_bwd = probe.peak_growth()
    missing = [
        name
        for name, t in zip(
            ("positions", "colours", "radii", "opacity", "cam_params"),
            (leaves.positions, leaves.colours, leaves.radii, leaves.opacity, leaves.cam_params),
        )
        if t is not None and t.grad is None
    ]
    if missing:
        raise RuntimeError(f"benchmark: the backward produced no gradient for {', '.join(missing)}")
    used_after = probe.device_used()
    scratch = scratch_bytes(renderer, device)
    instances = binned_instances(renderer, device)
    memory = None
    if peak_bwd is not None or scratch is not None:
        memory = ((peak_bwd or 0) + (scratch or 0)) / MIB
    mib = lambda v: None if v is None else v / MIB  # noqa: E731
    return Measurement(
        fwd_ms=statistics.median(fwd_times),
        fwd_bwd_ms=statistics.median(bwd_times),
        fwd_times_ms=fwd_times,
        fwd_bwd_times_ms=bwd_times,
        memory_mib=memory,
        allocator_peak_fwd_mib=mib(peak_fwd),
        allocator_peak_fwd_bwd_mib=mib(peak_bwd),
        scratch_mib=mib(scratch),
        device_used_growth_mib=None if used_before is None else (used_after - used_before) / MIB,
        binned_instances=instances,
        image=image,
    )


# ----------------------------------------------------------------------------------------
# The peer: PyTorch3D's Pulsar, when installed


def load_peer() -> Tuple[Optional[type], str]:
    """(PyTorch3D's Pulsar Renderer class or None, its version or why it is missing)."""
    try:
        import pytorch3d
        from pytorch3d.renderer.points.pulsar import Renderer as PulsarRenderer
    except Exception as exc:  # ImportError, or a pytorch3d built for another torch
        return None, f"{type(exc).__name__}: {exc}"
    return PulsarRenderer, str(getattr(pytorch3d, "__version__", "unknown"))


def peer_inputs(inputs: Inputs) -> Inputs:
    """Pulsar renders a batch of cameras only with a batch of spheres: for several views
    the spheres are repeated per view (outside the timed region)."""
    if inputs.cam_params.dim() == 1:
        return inputs
    views = inputs.cam_params.shape[0]
    rep = lambda t: t[None].expand(views, *t.shape).contiguous()  # noqa: E731
    return Inputs(
        rep(inputs.positions),
        rep(inputs.colours),
        rep(inputs.radii),
        None if inputs.opacity is None else rep(inputs.opacity),
        inputs.cam_params,
    )


# ----------------------------------------------------------------------------------------
# Reporting


def git_commit(start: Path) -> Optional[str]:
    """HEAD of the git checkout holding ``start`` (with '-dirty' when it has uncommitted
    changes), or None outside a checkout."""
    for folder in (start, Path.cwd()):
        try:
            head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=10)
            if head.returncode != 0:
                continue
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=folder,
                capture_output=True,
                text=True,
                timeout=10,
            )
            return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
        except (OSError, subprocess.SubprocessError):
            continue
    return None


def driver_version(device: torch.device) -> Optional[str]:
    """The NVIDIA driver's version (``nvidia-smi``), or None on the CPU or when it
    cannot be read."""
    if device.type != "cuda":
        return None
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[0] if done.returncode == 0 and lines else None


def host_load() -> Optional[float]:
    """The host's one-minute load average (None where the system has none): other work on
    the machine slows the CPU backend's figures and the host's share of CUDA's."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU, {os.cpu_count()} cores"


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_table(rows: List[Dict[str, Any]], peer_ran: bool, device: torch.device) -> str:
    """The printed table: one row per workload."""
    cuda = device.type == "cuda"
    header = ["workload", "N", "image", "fwd ms", "fwd+bwd ms", "memory MiB"]
    if cuda:
        header.append("device MiB")
    if peer_ran:
        header += ["Pulsar fwd ms", "Pulsar fwd+bwd ms", "Pulsar device MiB", "speed-up fwd", "speed-up fwd+bwd"]
    else:
        header += ["Pulsar H100 fwd / fwd+bwd ms (ref)"]
    lines = []
    for r in rows:
        line = [
            f"{r['workload']} {r['label']}",
            f"{r['n_spheres']:,}",
            r["image"],
            _fmt(r["fwd_ms"]),
            _fmt(r["fwd_bwd_ms"]),
            _fmt(r["memory_mib"], 1),
        ]
        if cuda:
            line.append(_fmt(r.get("device_used_growth_mib"), 1))
        if peer_ran:
            p = r.get("peer") or {}
            line += [
                _fmt(p.get("fwd_ms")),
                _fmt(p.get("fwd_bwd_ms")),
                _fmt(p.get("device_used_growth_mib"), 1),
                _fmt(p.get("speedup_fwd")) + "x" if p.get("speedup_fwd") else "-",
                _fmt(p.get("speedup_fwd_bwd")) + "x" if p.get("speedup_fwd_bwd") else "-",
            ]
        else:
            ref = r["pulsar_reference_h100"]
            line.append(f"{ref['fwd_ms']} / {ref['fwd_bwd_ms']}")
        lines.append(line)
    widths = [max(len(header[i]), *(len(line[i]) for line in lines)) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines]
    if cuda:
        out.append(
            "memory: allocator peak growth over forward+backward + the renderer's scratch; device: "
            "growth of the device's used memory over the whole measurement (performance.md's measure)"
        )
    else:
        out.append("memory on the CPU: the renderer's scratch only (PyTorch's CPU allocator is not tracked)")
    return "\n".join(out)


def _parse_workloads(text: str) -> List[Workload]:
    names = [s.strip().upper() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in WORKLOADS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(WORKLOADS)}, got {text!r}")
    return [WORKLOADS[s] for s in names]


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pulsar_py bench",
        description="Benchmark pulsar_py on the standard workloads W1-W6 (docs/benchmarks.md); "
        "compares with PyTorch3D's Pulsar when pytorch3d is importable.",
    )
    parser.add_argument(
        "--workloads",
        type=_parse_workloads,
        default=list(WORKLOADS.values()),
        help="comma-separated subset, e.g. W3,W4 (default: all)",
    )
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda when available)",
    )
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed runs per measurement (default: 20 on CUDA, 5 on the CPU)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed runs first (default on CUDA: 3 forward, 10 forward+backward; CPU: 1)",
    )
    parser.add_argument("--json", dest="json_path", default=None, help="write the results as JSON here")
    parser.add_argument("--no-peer", action="store_true", help="do not run PyTorch3D's Pulsar even if installed")
    parser.add_argument(
        "--check-values",
        action="store_true",
        help="keep the renderer's per-call value checks (NaN/Inf and range checks; "
        "on CUDA they synchronise the host). Default: off, the steady-state path",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the benchmark; returns the exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    import pulsar_py

    try:
        device = command_device(args.device)
    except ValueError as exc:
        parser.error(str(exc))
    info = pulsar_py.build_info()
    if args.repeats is not None and args.repeats < 1:
        parser.error(f"--repeats: expected >= 1, got {args.repeats}")
    if args.warmup is not None and args.warmup < 0:
        parser.error(f"--warmup: expected >= 0, got {args.warmup}")
    cuda = device.type == "cuda"
    repeats = args.repeats if args.repeats is not None else (20 if cuda else 5)
    warmup_fwd = args.warmup if args.warmup is not None else (3 if cuda else 1)
    warmup_bwd = args.warmup if args.warmup is not None else (10 if cuda else 1)
    dtype = torch.float64 if args.dtype == "float64" else torch.float32

    peer_cls, peer_version = (None, "disabled with --no-peer") if args.no_peer else load_peer()
    if peer_cls is not None and dtype != torch.float32:
        peer_cls, peer_version = None, f"pytorch3d {peer_version} renders float32 only"

    def say(text: str) -> None:
        if not args.quiet:
            print(text, file=sys.stderr, flush=True)

    say(
        f"pulsar_py {info['version']} on {device_name(device)}; {args.dtype}; "
        f"{repeats} timed runs, warm-up {warmup_fwd} (fwd) / {warmup_bwd} (fwd+bwd)"
    )
    load_start = host_load()
    rows = []
    for w in args.workloads:
        say(f"{w.name} {w.label}: generating {w.n_spheres:,} spheres ...")
        inputs = make_inputs(w, device, dtype)

        def ours() -> torch.nn.Module:
            r = pulsar_py.Renderer(w.width, w.height, n_channels=3, n_track=N_TRACK).to(device)
            r.check_values = bool(args.check_values)
            return r

        mine = measure(
            ours,
            inputs,
            device,
            warmup_fwd,
            warmup_bwd,
            repeats,
            lambda s, w=w: say(f"  {w.name} pulsar_py {s}"),
            keep_image=peer_cls is not None,
        )
        row: Dict[str, Any] = dict(
            workload=w.name,
            label=w.label,
            n_spheres=w.n_spheres,
            image=w.image_text,
            width=w.width,
            height=w.height,
            views=w.views,
            has_opacity=w.opacity_range is not None,
            pulsar_reference_h100=asdict(w.reference),
            **{k: v for k, v in asdict(mine).items() if k != "image"},
        )
        if peer_cls is not None:
            pin = peer_inputs(inputs)

            def peer() -> torch.nn.Module:
                return peer_cls(w.width, w.height, max_num_balls=w.n_spheres, n_channels=3, n_track=N_TRACK).to(device)

            try:
                theirs = measure(
                    peer,
                    pin,
                    device,
                    warmup_fwd,
                    warmup_bwd,
                    repeats,
                    lambda s, w=w: say(f"  {w.name} Pulsar {s}"),
                    keep_image=True,
                )
                p = {k: v for k, v in asdict(theirs).items() if k != "image"}
                p["speedup_fwd"] = theirs.fwd_ms / mine.fwd_ms
                p["speedup_fwd_bwd"] = theirs.fwd_bwd_ms / mine.fwd_bwd_ms
                p["max_abs_image_difference"] = float((theirs.image.reshape(mine.image.shape) - mine.image).abs().max())
                row["peer"] = p
            except Exception as exc:  # the peer failing must not lose our figures
                row["peer"] = {"error": f"{type(exc).__name__}: {exc}"}
                say(f"  {w.name} Pulsar failed: {row['peer']['error']}")
        del inputs
        say(f"  {w.name}: fwd {mine.fwd_ms:.2f} ms, fwd+bwd {mine.fwd_bwd_ms:.2f} ms")
        rows.append(row)

    peer_ran = any("peer" in r and "error" not in r["peer"] for r in rows)
    print(format_table(rows, peer_ran, device))
    if peer_cls is None:
        print(
            f"PyTorch3D's Pulsar was not run ({peer_version}); the reference column gives Pulsar's "
            "figures on an H100 from performance.md (comparable only on that GPU)."
        )
    report = dict(
        device=device_name(device),
        driver=driver_version(device),
        torch=torch.__version__ + (f", CUDA {torch.version.cuda}" if torch.version.cuda else ""),
        commit=git_commit(Path(__file__).resolve().parent),
        date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        command=shlex.join(["pulsar-py", "bench", *(sys.argv[1:] if argv is None else argv)]),
        python=platform.python_version(),
        host_load_average=dict(start=load_start, end=host_load()),
        build={k: list(v) if isinstance(v, tuple) else v for k, v in info.items()},
        settings=dict(
            device_type=device.type,
            dtype=args.dtype,
            repeats=repeats,
            warmup_fwd=warmup_fwd,
            warmup_fwd_bwd=warmup_bwd,
            check_values=bool(args.check_values),
            gamma=GAMMA,
            max_depth=MAX_DEPTH,
            percent_allowed_difference=PERCENT_ALLOWED_DIFFERENCE,
            n_track=N_TRACK,
            seed=SEED,
        ),
        peer=dict(available=peer_cls is not None, version=peer_version),
        rows=rows,
    )
    if args.json_path:
        folder = os.path.dirname(args.json_path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        with open(args.json_path, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
