"""The command line: ``pulsar-py <command>`` (also ``python -m pulsar_py``).

Commands:
    demo       joint optimisation of a camera and thousands of spheres (pulsar_py.tools.demo)
    render     render a PLY point cloud or 3DGS scene to an image (pulsar_py.tools.render)
    view       show a PLY file or the demo's scene in the browser (pulsar_py.tools.viewer)
    selftest   compare this build's images and gradients with stored reference output
    sample     render the built-in sample scene to an image
    gradcheck  finite-difference check of every gradient (pulsar_py.tools.gradcheck_command)
    bench      the benchmark driver (workloads W1-W6 of docs/benchmarks.md)
    info       version, compiled backends and compiler

``--version`` prints the version. Help and usage lines name the program as it was
invoked: ``pulsar-py`` for the installed script, ``python -m pulsar_py`` for the module.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .args import SCRIPT, positive_int

# Commands whose arguments belong to another module's own parser: everything after the
# command name is handed over unchanged (so ``bench --help`` shows the driver's help).
# command -> (module under pulsar_py.tools, help line)
_FORWARDED: Dict[str, Tuple[str, str]] = {
    "demo": (
        "demo",
        "joint camera + sphere optimisation demo (writes PNGs, a GIF, a loss plot, summary.json); see 'demo --help'",
    ),
    "render": ("render", "render a PLY point cloud or 3D Gaussian Splatting scene to an image; see 'render --help'"),
    "selftest": (
        "selftest",
        "render built-in scenes on every backend and compare with stored reference output; see 'selftest --help'",
    ),
    "gradcheck": (
        "gradcheck_command",
        "finite-difference check of every gradient (pulsar_py.gradcheck); see 'gradcheck --help'",
    ),
    "bench": ("bench", "benchmark driver, workloads W1-W6 (pulsar_py.tools.bench); see 'bench --help'"),
    "view": (
        "viewer.command",
        "show a PLY file or the demo's scene in the browser, rendered by pulsar_py; see 'view --help'",
    ),
}


class CommandError(Exception):
    """A user-facing error: printed without a traceback, exit status 1."""


def _version() -> str:
    import pulsar_py

    return f"pulsar_py {pulsar_py.__version__}"


class _VersionAction(argparse.Action):
    """``--version``: prints "pulsar_py <version>" and exits (the import happens only then)."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(_version())
        parser.exit()


def _build_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="pulsar_py: differentiable sphere renderer with exact gradients (Pulsar-compatible)."
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="<command>")
    commands.required = True

    sample = commands.add_parser(
        "sample",
        help="render the built-in sample scene to an image",
        description="Render the built-in sample scene (a shaded trefoil knot "
        "of spheres) with pulsar_py.Renderer and write an image.",
    )
    sample.add_argument(
        "--out",
        required=True,
        help="image file to write, its format from the extension: .png, .jpg, ... (folders are created)",
    )
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
    from pulsar_py.tools.args import command_device

    try:
        return command_device(name)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def _cmd_sample(args: argparse.Namespace) -> int:
    import torch

    import pulsar_py
    from pulsar_py.io.images import write_image
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
        write_image(args.out, image)
    except (OSError, ValueError) as exc:
        raise CommandError(f"--out: cannot write {args.out!r}: {exc}") from None
    print(
        f"wrote {args.out} ({scene.width}x{scene.height}, {scene.n_spheres} spheres, {device.type}); "
        f"render took {seconds * 1000:.1f} ms"
    )
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    import pulsar_py

    info = pulsar_py.build_info()
    print(f"pulsar_py {info['version']}")
    for key, value in info.items():
        if key != "version":
            print(f"  {key}: {', '.join(value) if isinstance(value, (tuple, list)) else value}")
    return 0


def _forwarded_main(name: str) -> Callable[..., Optional[int]]:
    """The ``main(argv[, prog])`` of a forwarded command, imported only when that command
    runs (so the other commands work even where its module is missing)."""
    module_name = f"pulsar_py.tools.{_FORWARDED[name][0]}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise CommandError(f"{name}: this installation has no {module_name} module") from None
        raise
    return module.main


def _run_forwarded(name: str, argv: List[str], prog: str) -> int:
    command_main = _forwarded_main(name)
    # A command whose main takes ``prog`` names itself as invoked in its help and usage.
    if "prog" in inspect.signature(command_main).parameters:
        status = command_main(argv, prog=f"{prog} {name}")
    else:
        status = command_main(argv)
    return 0 if status is None else int(status)


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status.

    ``prog``: how the program was invoked, for help and usage lines (default "pulsar-py",
    the installed script; ``python -m pulsar_py`` passes its own).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or SCRIPT
    try:
        if argv and argv[0] in _FORWARDED:
            return _run_forwarded(argv[0], argv[1:], prog)
        args = _build_parser(prog).parse_args(argv)
        return args.handler(args)
    except SystemExit as exc:  # argparse (here or in a forwarded command): usage errors, --help
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except CommandError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except ImportError as exc:  # an optional package of a tool (pulsar_py.io._deps.MissingDependency)
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, RuntimeError, OSError) as exc:
        print(f"{prog}: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
