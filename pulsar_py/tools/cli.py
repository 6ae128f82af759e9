"""The command line: ``pulsar-py <command>`` (also ``python -m pulsar_py``).

Commands:
    demo       joint optimisation of a camera and thousands of spheres (pulsar_py.tools.demo)
    render     render a PLY point cloud to a PNG (pulsar_py.tools.render)
    selftest   compare this build's images and gradients with stored reference output
    sample     render the built-in sample scene to a PNG
    gradcheck  finite-difference check of every gradient (pulsar_py.tools.gradcheck)
    bench      the benchmark driver (workloads W1-W6 of docs/benchmarks.md)
    info       version, compiled backends and compiler
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .args import positive_int

# Commands whose arguments belong to another module's own parser: everything after the
# command name is handed over unchanged (so ``bench --help`` shows the driver's help).
# command -> (module under pulsar_py, help line)
_FORWARDED: Dict[str, Tuple[str, str]] = {
    "demo": ("demo", "joint camera + sphere optimisation demo (writes PNGs, a GIF, summary.json); "
                     "see 'demo --help'"),
    "render": ("render", "render a PLY point cloud to a PNG; see 'render --help'"),
    "selftest": ("selftest", "render built-in scenes on every backend and compare with stored reference "
                             "output; see 'selftest --help'"),
    "gradcheck": ("gradcheck", "finite-difference check of every gradient (pulsar_py.gradcheck); "
                               "see 'gradcheck --help'"),
    "bench": ("bench", "benchmark driver, workloads W1-W6 (pulsar_py.bench); see 'bench --help'"),
}


class CommandError(Exception):
    """A user-facing error: printed without a traceback, exit status 1."""


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pulsar_py",
        description="pulsar_py: differentiable sphere renderer with exact gradients (Pulsar-compatible).")
    commands = parser.add_subparsers(dest="command", metavar="<command>")
    commands.required = True

    sample = commands.add_parser("sample", help="render the built-in sample scene to a PNG",
                                 description="Render the built-in sample scene (a shaded trefoil knot "
                                             "of spheres) with pulsar_py.Renderer and write a PNG.")
    sample.add_argument("--out", required=True, help="PNG file to write (folders are created)")
    sample.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    sample.add_argument("--width", type=positive_int, default=512, help="image width in pixels (default 512)")
    sample.add_argument("--height", type=positive_int, default=384, help="image height in pixels (default 384)")
    sample.add_argument("--spheres", type=positive_int, default=4800, help="number of spheres (default 4800)")
    sample.set_defaults(handler=_cmd_sample)

    for name, (_module, text) in _FORWARDED.items():
        commands.add_parser(name, help=text, add_help=False)

    info = commands.add_parser("info", help="print version, compiled backends and compiler")
    info.set_defaults(handler=_cmd_info)
    return parser


def _resolve_device(name: str):
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise CommandError(f"--device: expected cpu or cuda, got {name!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise CommandError(f"--device: expected cpu or cuda, got {name!r}")
    if device.type == "cuda":
        import pulsar_py

        if "cuda" not in pulsar_py.build_info()["backends"]:
            raise CommandError("--device cuda: this build of pulsar_py has no CUDA backend "
                               "(rebuild on a machine with nvcc; see README.md, 'GPU build')")
        if not torch.cuda.is_available():
            raise CommandError("--device cuda: PyTorch sees no CUDA device")
    return device


def _cmd_sample(args: argparse.Namespace) -> int:
    import torch

    import pulsar_py
    from pulsar_py.io.png import write_png
    from pulsar_py.tools.sample_scene import make_sample_scene

    device = _resolve_device(args.device)
    scene = make_sample_scene(width=args.width, height=args.height, n_spheres=args.spheres, device=device)
    renderer = pulsar_py.Renderer(scene.width, scene.height, n_channels=3).to(device)
    start = time.perf_counter()
    with torch.no_grad():
        image = renderer(**scene.render_kwargs())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    try:
        write_png(args.out, image)
    except OSError as exc:
        raise CommandError(f"--out: cannot write {args.out!r}: {exc}") from None
    print(f"wrote {args.out} ({scene.width}x{scene.height}, {scene.n_spheres} spheres, {device.type}); "
          f"render took {seconds * 1000:.1f} ms")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    import pulsar_py

    info = pulsar_py.build_info()
    print(f"pulsar_py {info['version']}")
    for key, value in info.items():
        if key != "version":
            print(f"  {key}: {', '.join(value) if isinstance(value, (tuple, list)) else value}")
    return 0


def _forwarded_main(name: str) -> Callable[[List[str]], Optional[int]]:
    """The ``main(argv)`` of a forwarded command, imported only when that command runs
    (so the other commands work even where its module is missing)."""
    import importlib

    module_name = f"pulsar_py.tools.{_FORWARDED[name][0]}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise CommandError(f"{name}: this installation has no {module_name} module") from None
        raise
    return module.main


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] in _FORWARDED:
            status = _forwarded_main(argv[0])(argv[1:])
            return 0 if status is None else int(status)
        args = _build_parser().parse_args(argv)
        return args.handler(args)
    except SystemExit as exc:  # argparse (here or in a forwarded command): usage errors, --help
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except CommandError as exc:
        print(f"pulsar_py: error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, RuntimeError, OSError) as exc:
        print(f"pulsar_py: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pulsar_py: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
