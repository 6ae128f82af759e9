#!/usr/bin/env python3
"""The viewer's server-side frame loop without a browser: ``python benchmarks/viewer.py --device cuda``.

For the demo's scene (its true spheres, 4969, as ``pulsar-py view`` shows a demo's
scene.ply) seen by the viewer's first camera, orbiting one degree per frame, it times
``--frames`` frames of what a tab's render thread does for each: ``FrameRenderer.render``
(camera conversion, ``Renderer.render``, colour mapping and uint8 conversion on the
device, copy to the host) and ``set_background_image`` (JPEG encoding by viser: OpenCV
where installed, else imageio) on a viser server on 127.0.0.1 with no page connected, so
nothing crosses the network. Prints one JSON line:

    {"device", "width", "height", "spheres", "frames", "fps" (1 / median frame time),
     "median_ms", "render_ms", "encode_ms" (medians), "jpeg_quality", "encoder"}
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

try:
    import pulsar_py  # noqa: F401
except ImportError:  # not installed: the checkout's own (needs an in-place build of _native)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from pulsar_py.tools.demo_setup import DemoSettings, build_scene
from pulsar_py.tools.viewer.camera import DEFAULT_FOV_Y_DEG, camera_for_eye, default_max_depth, fit_view
from pulsar_py.tools.viewer.deps import quiet_stdout, require_viser
from pulsar_py.tools.viewer.frame import FrameRenderer, FrameSettings
from pulsar_py.tools.viewer.scene import scene_frame, scene_from_tensors
from pulsar_py.tools.viewer.tab import ViewOptions


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--size", type=int, default=1024, help="frame width and height in pixels (default 1024)")
    parser.add_argument("--frames", type=int, default=60, help="timed frames (default 60)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed frames first (default 5)")
    parser.add_argument(
        "--jpeg-quality",
        type=int,
        default=ViewOptions().jpeg_quality,
        help=f"JPEG quality (default {ViewOptions().jpeg_quality}, the viewer's)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    viser = require_viser()
    truth = build_scene(DemoSettings(), device)
    # The demo renders Pulsar's left-handed convention; the viewer shows it right-handed.
    scene = scene_from_tensors(
        truth.positions, truth.colours, truth.radii, right_handed=False, background=truth.bg_col.tolist()
    )
    frame = scene_frame(scene)
    settings = FrameSettings(gamma=ViewOptions().gamma, max_depth=default_max_depth(frame))
    eye, target = fit_view(frame)
    offset = eye - target
    renderer = FrameRenderer()
    with quiet_stdout():
        server = viser.ViserServer(host="127.0.0.1", port=0, verbose=False)
    render_s, encode_s, total_s = [], [], []
    try:
        for k in range(args.warmup + args.frames):
            turn = math.radians(k)  # orbit about +y, one degree per frame
            rotated = (
                offset[0] * math.cos(turn) + offset[2] * math.sin(turn),
                offset[1],
                -offset[0] * math.sin(turn) + offset[2] * math.cos(turn),
            )
            view = camera_for_eye(target + rotated, target, "+y", math.radians(DEFAULT_FOV_Y_DEG), 1.0)
            start = time.perf_counter()
            rendered = renderer.render(scene, frame, view, args.size, args.size, settings)
            encode_start = time.perf_counter()
            server.scene.set_background_image(rendered.pixels, format="jpeg", jpeg_quality=args.jpeg_quality)
            end = time.perf_counter()
            if k >= args.warmup:
                render_s.append(encode_start - start)
                encode_s.append(end - encode_start)
                total_s.append(end - start)
    finally:
        with quiet_stdout():
            server.stop()
    try:
        import cv2  # noqa: F401

        encoder = "opencv"
    except ImportError:
        encoder = "imageio"
    median = statistics.median(total_s)
    print(
        json.dumps(
            {
                "device": device.type,
                "width": args.size,
                "height": args.size,
                "spheres": len(scene),
                "frames": args.frames,
                "fps": round(1.0 / median, 1),
                "median_ms": round(1e3 * median, 2),
                "render_ms": round(1e3 * statistics.median(render_s), 2),
                "encode_ms": round(1e3 * statistics.median(encode_s), 2),
                "jpeg_quality": args.jpeg_quality,
                "encoder": encoder,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
