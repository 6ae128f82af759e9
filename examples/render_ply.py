"""Render a PLY point cloud or 3D Gaussian Splatting scene to an image.

Reads a PLY file (ascii or binary; a point cloud with x y z, optional red green blue,
radius or scale, opacity or alpha, or a 3DGS scene) with ``pulsar_py.io.ply.read_ply``
(plyfile) and renders every point as a sphere with
``pulsar_py.tools.render.render_point_cloud`` (what ``pulsar-py render`` runs): the
camera fits the cloud in view, ``--azimuth``/``--elevation`` turn it around.
Without ``--ply`` it first writes a sample cloud (the built-in trefoil knot) to
``--out``'s folder, so the example runs on its own.

    python examples/render_ply.py [--ply cloud.ply] [--out render.png] [--width 640 --height 480]
        [--azimuth 30 --elevation 20] [--device cpu|cuda]

(with pulsar_py installed, or ``PYTHONPATH=.`` from the repository root).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Dict, Optional, Sequence

from pulsar_py.io.images import write_image
from pulsar_py.io.ply import read_ply, write_ply
from pulsar_py.tools.render import render_point_cloud
from pulsar_py.tools.sample_scene import make_sample_scene


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ply", default=None, help="point cloud to render (default: write a sample one)")
    parser.add_argument("--out", default="render.png", help="image to write (.png, .jpg, ...)")
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--azimuth", type=float, default=30.0, help="degrees around the up axis")
    parser.add_argument("--elevation", type=float, default=20.0, help="degrees above the level")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    start = time.perf_counter()

    ply_path = args.ply
    if ply_path is None:
        # A sample cloud: the knot's sphere centres and colours, without radii (the
        # renderer estimates a radius from the point spacing).
        knot = make_sample_scene(n_spheres=6000)
        ply_path = os.path.join(os.path.dirname(os.path.abspath(args.out)), "sample_cloud.ply")
        write_ply(ply_path, knot.positions, knot.colours)
    cloud = read_ply(ply_path)
    image = render_point_cloud(
        cloud,
        args.width,
        args.height,
        args.device,
        azimuth_deg=args.azimuth,
        elevation_deg=args.elevation,
        background=(1.0, 1.0, 1.0),
    )
    write_image(args.out, image)
    seconds = time.perf_counter() - start
    print(f"rendered {len(cloud)} points from {ply_path} to {args.out} ({args.width}x{args.height}, {seconds:.2f} s)")
    return {"ply": ply_path, "out": args.out, "points": len(cloud), "image": image, "seconds": seconds}


if __name__ == "__main__":
    main(sys.argv[1:])
