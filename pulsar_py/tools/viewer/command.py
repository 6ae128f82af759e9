"""``pulsar-py view PATH``: show a PLY file or the demo's scene in the browser.

PATH is a PLY point cloud (colours, radii, opacities), a 3D Gaussian Splatting PLY (as
``pulsar-py render`` reads them) or the ``scene.ply`` that ``pulsar-py demo`` writes (or
the demo's output folder). The command prints the page's address and serves it until
Ctrl-C. docs/viewer.md describes the page.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Optional, Sequence

from ..args import command_device, command_prog
from .camera import UP_AXES
from .deps import INSTALL

if TYPE_CHECKING:
    from .server import SceneViewer

#: How the command names itself in its messages.
NAME = "pulsar-py view"


def _build_parser(prog: Optional[str] = None) -> argparse.ArgumentParser:
    from .server import DEFAULT_HOST, DEFAULT_PORT

    parser = argparse.ArgumentParser(
        prog=command_prog("view", prog),
        description="Show a PLY point cloud, a 3D Gaussian Splatting PLY or the scene pulsar-py demo saved "
        "(its scene.ply, or its output folder) in the browser: the page's camera drives "
        "pulsar_py renders on this machine. Serves until Ctrl-C. Needs viser: " + INSTALL + ".",
    )
    parser.add_argument("path", metavar="PATH", help="a .ply file, or a folder holding the demo's scene.ply")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port to serve on (default {DEFAULT_PORT}; 0: any free port)"
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}: this machine only). Another address "
        f"lets anyone who reaches it see the scene and load this machine; see docs/viewer.md",
    )
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--up", default="+y", choices=tuple(UP_AXES), help="world axis shown upwards (default +y)")
    parser.add_argument(
        "--gamma",
        type=float,
        default=1e-3,
        help="first blending softness in [1e-5, 1] (default 1e-3; a control on the page)",
    )
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> argparse.Namespace:
    """The command's arguments (argparse exits with status 2 on bad ones)."""
    return _build_parser(prog).parse_args(argv)


def serve(args: argparse.Namespace) -> "SceneViewer":
    """Read the scene and start serving it as ``args`` say; returns the running
    ``SceneViewer`` (stop it with ``stop()``). Raises ValueError or OSError (a bad PATH,
    an address that cannot be listened on, a device this machine lacks) and
    MissingDependency (an ImportError) without viser, each with a one-line message."""
    if not 1e-5 <= args.gamma <= 1:
        raise ValueError(f"--gamma: expected a value in [1e-5, 1], got {args.gamma}")
    device = command_device(args.device)
    from .deps import require_viser
    from .scene import SceneSource, load_scene, resolve_scene_path

    path = resolve_scene_path(args.path)  # a wrong PATH is told first, viser installed or not
    require_viser()
    from .server import SceneViewer, check_address
    from .tab import ViewOptions

    check_address(args.host, args.port)  # before a long load
    start = time.perf_counter()
    print(f"{NAME}: reading {path} ...", file=sys.stderr, flush=True)
    scene = load_scene(path, device)
    sh = f", SH degree {scene.sh_degree}" if scene.sh_degree is not None else ""
    print(
        f"{NAME}: {len(scene)} spheres{sh} on {device.type} ({time.perf_counter() - start:.1f} s)",
        file=sys.stderr,
        flush=True,
    )
    return SceneViewer(
        SceneSource(scene),
        args.host,
        args.port,
        ViewOptions(gamma=args.gamma, up=args.up),
        title=f"pulsar_py: {scene.name}",
    )


def main(argv: Optional[Sequence[str]] = None, prog: Optional[str] = None) -> int:
    """``pulsar-py view PATH [--port N] [--host ADDR] [--device cpu|cuda]``; returns the
    exit status: 0 after Ctrl-C, 1 with a one-line message where the scene cannot be
    read, the address cannot be listened on or viser is missing, 2 for bad arguments."""
    from .server import wait_for_interrupt

    args = parse_args(argv, prog)
    try:
        viewer = serve(args)
    except (ImportError, OSError, ValueError) as exc:  # ImportError: viser missing (deps.MissingDependency)
        print(f"{NAME}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if not viewer.loopback_only:
        print(
            f"{NAME}: listening on {args.host}: anyone who can reach this address can open the page, "
            f"without a password (docs/viewer.md, 'Security')",
            file=sys.stderr,
            flush=True,
        )
    print(f"{NAME}: serving {viewer.source.get()[0].name} at {viewer.url} (Ctrl-C to stop)", flush=True)
    try:
        wait_for_interrupt()
    finally:
        viewer.stop()
    return 0
