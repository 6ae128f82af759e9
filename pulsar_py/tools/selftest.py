"""``pulsar-py selftest``: does this build render what the model says?

Renders built-in scenes on every available backend (the CPU, and CUDA when the build has
it and a GPU is present), in float32 and float64, and compares images and gradients with
reference output stored in the package (``pulsar_py/tools/data/selftest_reference.npz``). The
reference was computed by the pure-PyTorch reference renderer (``pulsar_py.reference``,
float64), not by the native code, so a build that compiles but renders wrong (a bad
compiler flag, a broken kernel, a mismatched module) fails here. Prints a table; exit
status 0 when everything matches, 1 on any mismatch.

Cases:
  perspective   the sample scene (rainbow trefoil knot), 48x36 pixels, 360 spheres with
                opacities, gamma 0.05; image, and the gradients of sum(image * W) (W a
                fixed random weight) for positions, colours, radii, opacities, the
                background and the camera vector.
  orthographic  the same spheres seen by a right-handed orthographic camera turned about
                two axes, gamma 0.02, 6D rotation: image.
  batch         two 6D cameras with principal-point offsets ([2, 13] camera vectors) in
                one call: images.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..cameras.params import camera_from_params
from ..cameras.rotations import axis_angle_to_matrix
from .args import command_prog
from .sample_scene import make_sample_scene

REFERENCE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "selftest_reference.npz")
_GRADIENT_INPUTS = ("vert_pos", "vert_col", "vert_rad", "opacity", "bg_col", "cam_params")
# Tolerances per dtype of the native run. Images: the largest absolute difference
# (values in [0, 1]). Gradients: |g - g_ref| / |g_ref| (Euclidean norms over the whole
# gradient of one input), the metric of the CUDA parity tests: a pair within float32
# rounding of a silhouette differs by up to ~1e-3 in its own term while the gradient as
# a whole agrees. The float32 limits are 6-8x the largest error measured on the CPU;
# a wrong image or gradient is off by far more (typically > 1e-2).
TOLERANCES: Dict[torch.dtype, Dict[str, float]] = {
    torch.float64: {"image": 1e-9, "gradient": 1e-9},
    torch.float32: {"image": 5e-4, "gradient": 5e-3},
}


@dataclass
class SelftestCase:
    """One built-in scene: renderer settings, call arguments (float64, CPU) and, for
    gradient cases, the weight W of the loss sum(image * W)."""

    name: str
    renderer: Dict[str, object]
    call: Dict[str, object]
    gradient_weight: Optional[torch.Tensor] = None


def builtin_cases() -> List[SelftestCase]:
    """The selftest's scenes (deterministic on every machine)."""
    scene = make_sample_scene(48, 36, n_spheres=360, seed=3, dtype=torch.float64)
    gen = torch.Generator().manual_seed(7)
    f64 = torch.float64
    opacity = 0.35 + 0.65 * torch.rand(scene.n_spheres, generator=gen, dtype=f64)
    common = dict(vert_pos=scene.positions, vert_col=scene.colours, vert_rad=scene.radii, bg_col=scene.bg_col)
    perspective = SelftestCase(
        "perspective",
        dict(width=48, height=36),
        dict(
            common,
            cam_params=scene.cam_params + torch.tensor([0.2, -0.1, 0.3, 0.02, -0.03, 0.01, 0, 0], dtype=f64),
            opacity=opacity,
            gamma=0.05,
            max_depth=30.0,
            min_depth=0.0,
        ),
        gradient_weight=torch.randn(36, 48, 3, generator=gen, dtype=f64),
    )
    # Orthographic, right-handed: look at the knot (centre (0, 0.5, 20)) from behind,
    # turned about y by pi + 0.3 and about x by 0.2 (6D rotation, rows of the matrix).
    turn = torch.tensor([0.2, math.pi + 0.3, 0.0], dtype=f64)
    matrix = axis_angle_to_matrix(turn[None])[0]
    centre = torch.tensor([0.0, 0.5, 20.0], dtype=f64)
    eye = centre - 15.0 * (-matrix[:, 2])  # right-handed: the optical axis is -M z
    ortho_cam = torch.cat([eye, matrix[0], matrix[1], torch.tensor([0.0, 9.0], dtype=f64)])
    orthographic = SelftestCase(
        "orthographic",
        dict(width=40, height=30, orthogonal_projection=True, right_handed_system=True),
        dict(common, cam_params=ortho_cam, opacity=None, gamma=0.02, max_depth=30.0, min_depth=1.0),
    )
    rows = []
    for k, (angle, ox, oy) in enumerate(((0.15, 1.5, -2.25), (-0.2, -3.0, 0.5))):
        m = axis_angle_to_matrix(torch.tensor([[0.05 * k, angle, 0.0]], dtype=f64))[0]
        position = centre - 20.0 * m[:, 2]
        rows.append(
            torch.cat([position, m[0], m[1], torch.tensor([1.0, scene.cam_params[7].item(), ox, oy], dtype=f64)])
        )
    batch = SelftestCase(
        "batch",
        dict(width=32, height=24),
        dict(common, cam_params=torch.stack(rows), opacity=opacity, gamma=0.1, max_depth=28.0, min_depth=12.0),
    )
    return [perspective, orthographic, batch]


def _reference_outputs(case: SelftestCase) -> Dict[str, np.ndarray]:
    """Image(s) and gradients of ``case`` by the pure-PyTorch reference renderer."""
    from ..reference import render_reference

    r = case.renderer
    width, height = int(r["width"]), int(r["height"])
    call = dict(case.call)
    wants_grad = case.gradient_weight is not None
    leaves = {}
    for name in _GRADIENT_INPUTS:
        t = call.get(name)
        if t is not None:
            leaves[name] = t.detach().clone().requires_grad_(wants_grad)
            call[name] = leaves[name]
    cams = call["cam_params"]
    cams = cams if cams.dim() == 2 else cams[None]
    images = []
    for b in range(cams.shape[0]):
        camera = camera_from_params(
            cams[b : b + 1],
            width,
            height,
            bool(r.get("orthogonal_projection", False)),
            bool(r.get("right_handed_system", False)),
        )
        result = render_reference(
            call["vert_pos"],
            call["vert_col"],
            call["vert_rad"],
            camera,
            width,
            height,
            call["gamma"],
            call["max_depth"],
            call["min_depth"],
            bg_col=call["bg_col"],
            opacity=call.get("opacity"),
            percent_allowed_difference=0.01,
        )
        images.append(result.image)
    image = torch.stack(images) if case.call["cam_params"].dim() == 2 else images[0]
    out = {"image": image.detach().numpy()}
    if wants_grad:
        (image * case.gradient_weight).sum().backward()
        for name, leaf in leaves.items():
            out[f"grad/{name}"] = leaf.grad.numpy()
    return out


def make_reference() -> Dict[str, np.ndarray]:
    """The reference data for every built-in case: {"<case>/<quantity>": array}."""
    data: Dict[str, np.ndarray] = {}
    for case in builtin_cases():
        for key, value in _reference_outputs(case).items():
            data[f"{case.name}/{key}"] = value
    return data


def write_reference(path: str = REFERENCE_FILE) -> None:
    """Recompute the reference data (slow-ish: the dense reference renderer) and store it."""
    data = make_reference()
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    np.savez_compressed(path, **data)


def load_reference(path: str = REFERENCE_FILE) -> Dict[str, np.ndarray]:
    """The stored reference data (see ``make_reference``)."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"selftest: reference data {path!r} is missing from this installation")
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


@dataclass
class Check:
    """One comparison: backend, dtype, case, quantity, error, tolerance."""

    device: str
    dtype: str
    case: str
    quantity: str
    error: float
    tolerance: float

    @property
    def passed(self) -> bool:
        return math.isfinite(self.error) and self.error <= self.tolerance


def _native_outputs(case: SelftestCase, device: torch.device, dtype: torch.dtype) -> Dict[str, torch.Tensor]:
    from .. import Renderer

    renderer = Renderer(**case.renderer).to(device)
    wants_grad = case.gradient_weight is not None
    call, leaves = {}, {}
    for key, value in case.call.items():
        if isinstance(value, torch.Tensor):
            value = value.to(device=device, dtype=dtype).detach().clone()
            if wants_grad and key in _GRADIENT_INPUTS:
                value.requires_grad_(True)
                leaves[key] = value
        call[key] = value
    image = renderer(**call)
    out = {"image": image.detach().double().cpu()}
    if wants_grad:
        (image * case.gradient_weight.to(device=device, dtype=dtype)).sum().backward()
        for name, leaf in leaves.items():
            out[f"grad/{name}"] = leaf.grad.detach().double().cpu()
    return out


def run_checks(
    devices: Sequence[str],
    reference: Dict[str, np.ndarray],
    dtypes: Sequence[torch.dtype] = (torch.float32, torch.float64),
    cases: Optional[Sequence[SelftestCase]] = None,
) -> List[Check]:
    """Render every case on every device and dtype; compare with ``reference``."""
    checks: List[Check] = []
    for device_name in devices:
        device = torch.device(device_name)
        for dtype in dtypes:
            tol = TOLERANCES[dtype]
            for case in builtin_cases() if cases is None else cases:
                got = _native_outputs(case, device, dtype)
                for quantity, value in got.items():
                    key = f"{case.name}/{quantity}"
                    if key not in reference:
                        raise KeyError(f"selftest: reference data has no {key!r} (stale reference file?)")
                    expected = torch.from_numpy(reference[key])
                    if tuple(expected.shape) != tuple(value.shape):
                        error = float("inf")
                    elif quantity == "image":
                        error = float((value - expected).abs().max())
                    else:
                        error = float((value - expected).norm()) / max(float(expected.norm()), 1e-30)
                    if not math.isfinite(float(value.abs().max())):
                        error = float("nan")
                    checks.append(
                        Check(
                            device_name,
                            str(dtype).replace("torch.", ""),
                            case.name,
                            quantity,
                            error,
                            tol["image" if quantity == "image" else "gradient"],
                        )
                    )
    return checks


def available_devices() -> Tuple[List[str], List[str]]:
    """(devices to test, notes about backends that cannot be tested here)."""
    from .. import build_info

    backends = build_info()["backends"]
    devices, notes = ["cpu"], []
    if "cuda" in backends:
        if torch.cuda.is_available():
            devices.append("cuda")
        else:
            notes.append("cuda: built, but torch sees no CUDA device here; not tested")
    else:
        notes.append("cuda: not in this build")
    return devices, notes


def format_table(checks: Sequence[Check]) -> str:
    header = ("backend", "dtype", "case", "quantity", "error", "tolerance", "result")
    rows = [header] + [
        (
            c.device,
            c.dtype,
            c.case,
            c.quantity,
            f"{c.error:.2e}",
            f"{c.tolerance:.0e}",
            "ok" if c.passed else "MISMATCH",
        )
        for c in checks
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _parse_args(argv: Optional[Sequence[str]], prog: Optional[str] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=command_prog("selftest", prog),
        description="Render built-in scenes on every available backend (cpu; cuda when built and present), "
        "in float32 and float64, and compare images and gradients with the stored reference "
        "output of the pure-PyTorch reference renderer. Exit status 0 when all match, 1 otherwise.",
    )
    parser.add_argument(
        "--device", choices=("all", "cpu", "cuda"), default="all", help="backend(s) to test (default: all available)"
    )
    parser.add_argument(
        "--reference", default=REFERENCE_FILE, help="reference data file (default: the one installed with the package)"
    )
    parser.add_argument(
        "--write-reference",
        metavar="PATH",
        default=None,
        help="maintainers: recompute the reference data with the reference renderer, write it to PATH, and exit",
    )
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """``pulsar-py selftest [--device all|cpu|cuda]``; returns the exit status.
    ``prog``: the program name for help and usage (default "pulsar-py selftest")."""
    args = _parse_args(argv, prog)
    from .. import build_info

    if args.write_reference:
        start = time.perf_counter()
        write_reference(args.write_reference)
        print(f"selftest: wrote {args.write_reference} in {time.perf_counter() - start:.1f} s")
        return 0
    devices, notes = available_devices()
    if args.device != "all":
        if args.device not in devices:
            print(
                f"selftest: --device {args.device}: not available here "
                f"({'; '.join(notes) or 'backends: ' + ', '.join(build_info()['backends'])})",
                file=sys.stderr,
            )
            return 1
        devices, notes = [args.device], []
    try:
        reference = load_reference(args.reference)
    except (OSError, ValueError) as exc:
        print(f"selftest: cannot read the reference data: {exc}", file=sys.stderr)
        return 1
    info = build_info()
    print(f"pulsar_py {info['version']} selftest: backends {', '.join(info['backends'])}; testing {', '.join(devices)}")
    start = time.perf_counter()
    checks = run_checks(devices, reference)
    print(format_table(checks))
    for note in notes:
        print(f"note: {note}")
    failed = [c for c in checks if not c.passed]
    seconds = time.perf_counter() - start
    if failed:
        print(
            f"selftest: FAILED: {len(failed)} of {len(checks)} comparisons do not match the reference "
            f"({seconds:.2f} s). This build renders wrong; please report it with the output of "
            f"'pulsar-py info'."
        )
        return 1
    print(f"selftest: passed: all {len(checks)} comparisons match the reference ({seconds:.2f} s)")
    return 0
