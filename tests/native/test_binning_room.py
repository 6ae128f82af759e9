"""CUDA binning room: a call outside a capture sizes its lists by the room its renderer's
earlier counts call for (native/core/binning_room.h) and reads its own count back once
the lists are built, before it renders; a scene whose instances outgrow the room is
binned again. Whatever the path (count read first, room, binned again), every call gives
bit for bit what a fresh renderer (whose first call reads its count back before it
builds its lists) gives on the same scene: images, every gradient, the instance count.
tests/native/test_binning_room_rule.py checks which path the rule picks."""

from __future__ import annotations

import pytest
import torch
from helpers import HAS_CUDA, native_of
from scenes import scene_in_front

from pulsar_py import Renderer

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA (a GPU and the CUDA backend)")

DTYPES = [pytest.param(torch.float32, id="f32"), pytest.param(torch.float64, id="f64")]
WIDTH, HEIGHT = 160, 128


def _scene(seed: int, n: int, dtype: torch.dtype) -> list:
    return [t.cuda() for t in scene_in_front(seed, n, dtype, False)]


def _scaled(tensors: list, scale: float) -> list:
    """The scene with its radii scaled (more or fewer (tile, sphere) instances)."""
    pos, col, rad, opa, cam = tensors
    return [pos, col, rad * scale, opa, cam]


def _step(renderer: Renderer, tensors: list):
    """Image, every gradient and the instance count of one forward+backward."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    pos, col, rad, opa, cam = leaves
    image = renderer(pos, col, rad, cam, 0.1, 40.0, opacity=opa)
    count = native_of(renderer).binned_instances
    grads = torch.autograd.grad((image * image).sum(), leaves)
    return image.detach(), grads, count


def _renderer() -> Renderer:
    return Renderer(WIDTH, HEIGHT).cuda()


def _fresh(tensors: list):
    return _step(_renderer(), tensors)


def _assert_same(got, want, what: str) -> None:
    image, grads, count = got
    want_image, want_grads, want_count = want
    assert count == want_count, what
    assert torch.equal(image, want_image), what
    for name, a, b in zip(("positions", "colours", "radii", "opacities", "camera"), grads, want_grads):
        assert torch.equal(a, b), f"{what}: {name}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_scenes_that_grow_and_shrink_give_a_fresh_renderers_results(dtype):
    base = _scene(3, 300, dtype)
    renderer = _renderer()
    counts = []
    # Radii x 1: reads its count first; 6: outgrows the room of that count (binned again);
    # 1 and 0.8: the counts before each lie more than a factor 2 apart (read first); 0.3:
    # in the room of 1 and 0.8 (padding sorted after the lists); 6, 6: read first; 6:
    # in exactly its count.
    for scale in (1.0, 6.0, 1.0, 0.8, 0.3, 6.0, 6.0, 6.0):
        scene = _scaled(base, scale)
        want = _fresh(scene)
        got = _step(renderer, scene)
        _assert_same(got, want, f"radii x {scale}")
        counts.append(got[2])
    assert counts[1] > 2 * counts[0] and counts[4] < counts[2] // 2  # the premise: room outgrown and shrunk


def test_a_backward_that_bins_again_gets_its_forwards_gradients():
    """A backward whose forward's binning was replaced by two calls of another scene bins
    again, in the room those calls left: larger (padding) and smaller (outgrown, binned a
    second time)."""
    base = _scene(4, 300, torch.float32)
    small, large = _scaled(base, 1.0), _scaled(base, 1.3)
    for first, between in ((small, large), (large, small)):
        want_image, want_grads, _ = _fresh(first)
        renderer = _renderer()
        _step(renderer, first)
        leaves = [t.detach().clone().requires_grad_() for t in first]
        pos, col, rad, opa, cam = leaves
        image = renderer(pos, col, rad, cam, 0.1, 40.0, opacity=opa)
        with torch.no_grad():
            for _ in range(2):  # replace the binning; the room becomes the other scene's count
                renderer(*between[:3], between[4], 0.1, 40.0, opacity=between[3])
        grads = torch.autograd.grad((image * image).sum(), leaves)
        assert torch.equal(image.detach(), want_image)
        for a, b in zip(grads, want_grads):
            assert torch.equal(a, b)


def test_a_grown_batch_of_cameras_gives_a_fresh_renderers_results():
    pos, col, rad, opa, cam = _scene(5, 200, torch.float32)
    side = cam.clone()
    side[0] += 0.3
    renderer = _renderer()
    _step(renderer, [pos, col, rad, opa, cam])  # one camera: the room of one view
    both = [pos, col, rad * 3.0, opa, torch.stack([cam, side])]
    _assert_same(_step(renderer, both), _fresh(both), "two views, radii x 3")


def test_a_backward_in_many_windows_sums_as_a_binning_sized_by_its_count():
    """A backward whose gradient rows take several windows splits the slots by the count
    read back, not by the room: a scene binned with padding (its room that of larger
    scenes before it) gets a fresh renderer's gradients bit for bit."""
    base = _scene(6, 300, torch.float32)
    budget = 4096  # bytes of gradient rows per window: a few dozen rows, many windows

    def renderer() -> Renderer:
        r = _renderer()
        r._backward_row_budget = budget
        return r

    seen = renderer()
    for scale in (1.0, 0.8, 0.3):  # 0.3: within the room of 1 and 0.8, with padding
        scene = _scaled(base, scale)
        _assert_same(_step(seen, scene), _step(renderer(), scene), f"radii x {scale}")
