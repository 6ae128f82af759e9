"""Host cost of the Python path of one call, on a scene too small for the GPU work to
matter (1 sphere, 16x16 pixels): microseconds per call of the whole forward, of the
forward + backward, and of the pieces the forward is made of, then a cProfile of the
forward sorted by own time. The benchmark's W3 and W4 pay this time with the GPU idle
(docs/benchmarks.md), so it is the figure to shrink.

Usage: python3 benchmarks/host_path.py [cuda|cpu]
"""
import cProfile
import pstats
import sys
import time

import torch

from pulsar_py import Renderer, _checks, _native
from pulsar_py._autograd import CallSettings, CameraParamsFunction, RenderFunction, _scene_args


def per_call_us(fn, n: int = 2000) -> float:
    for _ in range(200):
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def tiny_scene(device) -> tuple:
    """(renderer, scene): a 16x16 renderer (value checks off) and one sphere's inputs
    [positions, colours, radii, opacity, camera vectors] on ``device``, for host costs."""
    r = Renderer(16, 16).to(device)
    r.check_values = False
    like = dict(device=device)
    scene = [torch.tensor([[0.0, 0.0, 30.0]], **like), torch.rand(1, 3, **like), torch.ones(1, **like),
             torch.full((1,), 0.5, **like), torch.tensor([0.0, 0, 0, 0, 0, 0, 5, 2], **like)]
    return r, scene


def main() -> None:
    device = torch.device(sys.argv[1] if len(sys.argv) > 1 else ("cuda" if torch.cuda.is_available() else "cpu"))
    r, scene = tiny_scene(device)
    like = dict(device=device)
    leaves = [t.clone().requires_grad_() for t in scene]
    kw = dict(gamma=0.1, max_depth=45.0, percent_allowed_difference=0.01)

    def forward(inputs):
        return r(inputs[0], inputs[1], inputs[2], inputs[4], opacity=inputs[3], **kw)

    def forward_backward():
        img = forward(leaves)
        img.backward(grad)

    grad = torch.ones_like(forward(scene))
    rows = [("forward, no input requires grad", lambda: forward(scene)),
            ("forward, every input requires grad", lambda: forward(leaves)),
            ("forward + backward", forward_backward)]
    packed = torch.zeros(1, 15, **like)
    packed[0, 2] = 1.0
    native = r._native_for(device)
    settings = CallSettings(gamma=0.1, percent_allowed_difference=0.01, max_n_hits=-1, right_handed=False,
                            want_forward_info=False)
    bg = torch.ones(3, **like)
    cams = scene[4][None]
    cams_grad = leaves[4][None]
    packed_grad = CameraParamsFunction.apply(cams_grad, 16, 16, False, False, False, 0.0, 45.0)
    rows += [
        ("  CameraParamsFunction.apply", lambda: CameraParamsFunction.apply(cams, 16, 16, False, False, False,
                                                                            0.0, 45.0)),
        ("  CameraParamsFunction.apply, grad", lambda: CameraParamsFunction.apply(cams_grad, 16, 16, False, False,
                                                                                  False, 0.0, 45.0)),
        ("  RenderFunction.apply", lambda: RenderFunction.apply(native, settings, *scene[:4], bg, packed)),
        ("  RenderFunction.apply, grad", lambda: RenderFunction.apply(native, settings, *leaves[:4], bg,
                                                                      packed_grad)),
        ("  native.forward alone (sync included)", lambda: native.forward(scene_args, options, outputs)),
        ("  torch.empty((1, 16, 16, 3))", lambda: torch.empty((1, 16, 16, 3), **like)),
        ("  check_scene", lambda: r._check_scene(scene[0], scene[1], scene[2], scene[3], None, None)),
        ("  check_cam_params", lambda: r._check_cam_params(scene[4], scene[0], None)),
        ("  check_call_settings", lambda: _checks.check_call_settings(0.1, 0.01, None, 0, False)),
        ("  _scene_args", lambda: _scene_args(*scene[:4], bg, packed.shape[0], packed.data_ptr(), False)),
        ("  settings.options (stream)", lambda: settings.options(device)),
    ]
    if device.type == "cuda":
        rows.append(("  torch.cuda.current_stream", lambda: torch.cuda.current_stream(device)))
    scene_args = _scene_args(*scene[:4], bg, packed.shape[0], packed.data_ptr(), False)
    options = settings.options(device)
    image, state = torch.empty((1, 16, 16, 3), **like), torch.empty((1, 16, 16, 2), **like)
    hits, ends = (torch.empty((1, 16, 16), dtype=torch.int32, device=device) for _ in range(2))
    outputs = _native.ForwardOutputs()
    outputs.image, outputs.blend_state = image.data_ptr(), state.data_ptr()
    outputs.hit_count, outputs.traversal_end = hits.data_ptr(), ends.data_ptr()
    x = torch.ones(16, **like, requires_grad=True)
    rows.append(("  autograd engine: (2 x).sum().backward()", lambda: (2 * x).sum().backward()))
    print(f"{device}: microseconds per call (one run of 2000 calls each)")
    for name, fn in rows:
        print(f"  {name:44s} {per_call_us(fn):8.1f}")
    # The backward's own Python (it runs on autograd's device thread, out of cProfile's sight).
    spent = []
    original = RenderFunction.backward

    def timed(ctx, *grads):
        start = time.perf_counter()
        result = original(ctx, *grads)
        spent.append(time.perf_counter() - start)
        return result

    RenderFunction.backward = staticmethod(timed)
    per_call_us(forward_backward, 1000)
    RenderFunction.backward = staticmethod(original)
    spent.sort()
    print(f"  {'  RenderFunction.backward body (median)':44s} {spent[len(spent) // 2] * 1e6:8.1f}")
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(500):
        forward(leaves)
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
