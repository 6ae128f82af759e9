"""The native camera conversion (include/pulsar/camera_params.h; the operator
pulsar::pack_cameras, and the render operator's own conversion of camera vectors)
against its torch reference (camera_from_params, the near/far resolution, NativeCamera.pack).

* Forward: packed [B, 15] equal to the reference to 1e-12 (float64) / 1e-6 (float32), for
  every camera-vector length, projection, handedness, first_R_then_T, min_depth 0 and > 0,
  the identity, small (series branch) and generic rotations, B = 1 and 3.
* Backward: equal to autograd through the reference to 1e-10 (float64) for a random
  upstream gradient; torch.autograd.gradcheck on a few cases.
* Bad arguments raise naming the argument.
* The render operator's conversion of camera vectors renders and differentiates like
  packed cameras from pulsar::pack_cameras (taken when a depth is a tensor that requires
  grad).
"""

from __future__ import annotations

import itertools

import pytest
import torch
from helpers import DEVICES, operator_settings

import pulsar_py
from pulsar_py import Renderer, _native, ops
from pulsar_py.cameras.params import camera_from_params

F64 = torch.float64
WIDTH, HEIGHT = 37, 23  # odd and non-square: (W - 1) / 2 and (H - 1) / 2 differ
MAX_DEPTH = 50.0
LENGTHS = (8, 10, 11, 13)
ROTATIONS = ("identity", "small", "generic")


def make_params(length: int, rotation: str, batch: int, orthographic: bool, seed: int) -> torch.Tensor:
    """Camera vectors [batch, length] in float64 on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    rnd = lambda *shape: torch.randn(shape, generator=gen, dtype=F64)  # noqa: E731
    uni = lambda low, high, n: low + (high - low) * torch.rand(n, generator=gen, dtype=F64)  # noqa: E731
    n_rot = 6 if length in (11, 13) else 3
    if n_rot == 3:
        if rotation == "identity":
            rot = torch.zeros(batch, 3, dtype=F64)
        elif rotation == "small":  # theta^2 ~ 1e-10 < 1e-8: the series branch
            rot = 1e-5 * rnd(batch, 3)
        else:
            rot = rnd(batch, 3)
    else:
        eye6 = torch.tensor([1.0, 0, 0, 0, 1, 0], dtype=F64).expand(batch, 6)
        if rotation == "identity":
            rot = eye6.clone()
        elif rotation == "small":
            rot = eye6 + 1e-5 * rnd(batch, 6)
        else:
            rot = rnd(batch, 6) * 2
    parts = [
        2 * rnd(batch, 3),
        rot,
        # Orthographic cameras have focal length 0; a non-zero one must be ignored
        # (packed as 0, zero gradient): every other batch item gets one.
        uni(0.5, 2.0, batch) * (torch.arange(batch) % 2 if orthographic else 1),
        uni(0.5, 2.0, batch),
    ]
    if length in (10, 13):
        parts.append(3 * rnd(batch, 2))
    return torch.cat([p.reshape(batch, -1) for p in parts], -1)


def reference_packed(
    cams: torch.Tensor,
    orthographic: bool,
    right_handed: bool,
    first_R_then_T: bool,
    min_depth: float,
    max_depth: float = MAX_DEPTH,
) -> torch.Tensor:
    """The torch path: camera_from_params, near/far, cat -> [B, 15]."""
    camera = camera_from_params(cams, WIDTH, HEIGHT, orthographic, right_handed, first_R_then_T)
    min_t = torch.tensor(min_depth, dtype=cams.dtype, device=cams.device)
    max_t = torch.tensor(max_depth, dtype=cams.dtype, device=cams.device)
    near = torch.where(min_t == 0, camera.focal + 2e-6, min_t.expand_as(camera.focal))
    far = max_t.expand_as(camera.focal)
    return camera.pack(near, far)


def native_packed(
    cams: torch.Tensor,
    orthographic: bool,
    right_handed: bool,
    first_R_then_T: bool,
    min_depth: float,
    max_depth: float = MAX_DEPTH,
) -> torch.Tensor:
    settings = ops.PackSettings(WIDTH, HEIGHT, orthographic, right_handed, first_R_then_T, min_depth, max_depth)
    return ops.pack_cameras(cams, settings.encode())


FLAGS = list(itertools.product((False, True), repeat=3))  # orthographic, right_handed, first_R_then_T


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "ortho{:d}-rh{:d}-rt{:d}".format(*f))
@pytest.mark.parametrize("rotation", ROTATIONS)
@pytest.mark.parametrize("length", LENGTHS)
def test_matches_reference(length, rotation, flags, device):
    orthographic, right_handed, first_R_then_T = flags
    seed = 1000 * length + 10 * ROTATIONS.index(rotation) + FLAGS.index(flags)
    for batch, min_depth in itertools.product((1, 3), (0.0, 0.7)):
        base = make_params(length, rotation, batch, orthographic, seed)
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
            cams = base.to(dtype=dtype, device=device)
            got = native_packed(cams, orthographic, right_handed, first_R_then_T, min_depth)
            want = reference_packed(cams, orthographic, right_handed, first_R_then_T, min_depth)
            assert got.shape == (batch, 15) and got.dtype == dtype and got.device == cams.device
            # Absolute errors scale with the largest value: an entry that cancels (eye = M pos
            # with first_R_then_T) carries the rounding of terms as large as the others, and
            # torch's vectorised float32 kernels round differently on different CPUs (seen:
            # 6e-6 apart at values up to 50, each within 3e-6 of the float64 result).
            scale = max(1.0, want.abs().max().item())
            torch.testing.assert_close(got, want, rtol=tol, atol=tol * scale)
        # Backward in float64: the native Jacobian-vector product equals autograd's.
        g = torch.randn((batch, 15), generator=torch.Generator().manual_seed(seed + 1), dtype=F64).to(device)
        grads = []
        for convert in (native_packed, reference_packed):
            cams = base.to(device).requires_grad_(True)
            convert(cams, orthographic, right_handed, first_R_then_T, min_depth).backward(g)
            grads.append(cams.grad)
        torch.testing.assert_close(grads[0], grads[1], rtol=1e-10, atol=1e-10)
        if orthographic:  # the focal length is ignored
            n_rot = 6 if length in (11, 13) else 3
            assert torch.all(grads[0][:, 3 + n_rot] == 0)


@pytest.mark.parametrize("device", DEVICES)
def test_exact_zero_rotation_gradient_is_finite(device):
    """At rotvec = 0 exactly (sin(t)/t would be 0/0) the series branch gives a finite,
    non-zero rotation gradient (dM = K(dr) there), here through first_R_then_T."""
    cams = make_params(8, "identity", 1, False, 7).to(device).requires_grad_(True)
    g = torch.randn(1, 15, dtype=F64, generator=torch.Generator().manual_seed(3)).to(device)
    native_packed(cams, False, False, True, 0.0).backward(g)
    assert torch.isfinite(cams.grad).all() and cams.grad[0, 3:6].abs().sum() > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "length,rotation,flags,min_depth",
    [
        (8, "generic", (False, False, False), 0.0),
        (10, "small", (False, True, True), 0.0),
        (11, "generic", (True, False, True), 0.5),
        (13, "generic", (False, True, False), 0.0),
    ],
)
def test_gradcheck(length, rotation, flags, min_depth, device):
    orthographic, right_handed, first_R_then_T = flags
    cams = make_params(length, rotation, 2, orthographic, 11 * length).to(device).requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda c: native_packed(c, orthographic, right_handed, first_R_then_T, min_depth),
        (cams,),
        eps=1e-6,
        atol=1e-7,
        rtol=1e-6,
    )


@pytest.mark.parametrize("device", DEVICES)
def test_non_contiguous_and_no_grad_input(device):
    """An expanded (stride-0) batch converts like its contiguous copy; a grad for
    cam_params is returned only when it is asked for."""
    one = make_params(13, "generic", 1, False, 5).to(device)
    expanded = one.expand(4, -1)
    torch.testing.assert_close(
        native_packed(expanded, False, True, False, 0.0),
        native_packed(expanded.contiguous(), False, True, False, 0.0),
        rtol=0,
        atol=0,
    )
    packed = native_packed(one, False, False, False, 0.0)
    assert not packed.requires_grad


# ---------------------------------------------------------------------------- errors
def _args(cams: torch.Tensor) -> "_native.CameraParamsArgs":
    args = _native.CameraParamsArgs()
    args.dtype = _native.DType.float64
    args.batch_size, args.length = cams.shape
    args.width, args.height = WIDTH, HEIGHT
    args.min_depth, args.max_depth = 0.0, MAX_DEPTH
    args.params = cams.data_ptr()
    return args


@pytest.mark.parametrize(
    "field,value,name",
    [
        ("length", 9, "length"),
        ("batch_size", 0, "batch_size"),
        ("width", 0, "width"),
        ("height", -1, "height"),
        ("params", 0, "params"),
    ],
)
def test_bad_native_arguments(field, value, name):
    cams = make_params(8, "generic", 2, False, 1)
    args = _args(cams)
    setattr(args, field, value)
    out = torch.empty(2, 15, dtype=F64)
    with pytest.raises(ValueError, match=f"^{name}: expected .*got {value}" if field != "params" else "^params:"):
        _native.camera_params_to_packed(args, out.data_ptr())
    with pytest.raises(ValueError, match=f"^{name}:"):
        _native.camera_params_backward(args, out.data_ptr(), cams.data_ptr())


def test_null_outputs_named():
    cams = make_params(8, "generic", 2, False, 1)
    out = torch.empty(2, 15, dtype=F64)
    with pytest.raises(ValueError, match="^packed: .*got null"):
        _native.camera_params_to_packed(_args(cams), 0)
    with pytest.raises(ValueError, match="^grad_packed: .*got null"):
        _native.camera_params_backward(_args(cams), 0, cams.data_ptr())
    with pytest.raises(ValueError, match="^grad_params: .*got null"):
        _native.camera_params_backward(_args(cams), out.data_ptr(), 0)


@pytest.mark.skipif("cuda" in pulsar_py.build_info()["backends"], reason="this build has a CUDA backend")
def test_cuda_without_backend_named():
    cams = make_params(8, "generic", 1, False, 1)
    args = _args(cams)
    args.device = _native.DeviceKind.cuda
    with pytest.raises(ValueError, match="^device: CUDA requested"):
        _native.camera_params_to_packed(args, torch.empty(1, 15, dtype=F64).data_ptr())


def test_bad_tensor_named():
    with pytest.raises(ValueError, match="^camera_vectors: expected a tensor of shape"):
        native_packed(torch.zeros(8, dtype=F64), False, False, False, 0.0)
    with pytest.raises(TypeError, match="^camera_vectors: expected dtype"):
        native_packed(torch.zeros(1, 8, dtype=torch.float16), False, False, False, 0.0)
    with pytest.raises(ValueError, match="^length: expected 8, 10, 11 or 13 .*got 9"):
        native_packed(torch.zeros(1, 9, dtype=F64), False, False, False, 0.0)


# ---------------------------------------------------------------------------- renderer
def _scene(device, batch=None, n=40, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (n,) if batch is None else (batch, n)
    pos = torch.randn(shape + (3,), generator=gen, dtype=F64) * torch.tensor([1.5, 1.0, 0.5], dtype=F64)
    pos[..., 2] += 6.0
    col = torch.rand(shape + (3,), generator=gen, dtype=F64)
    rad = 0.2 + 0.3 * torch.rand(shape, generator=gen, dtype=F64)
    return pos.to(device), col.to(device), rad.to(device)


def _cams(device, batch, length=10):
    gen = torch.Generator().manual_seed(42)
    cams = torch.tensor([0.1, -0.2, 0.3, 0.02, -0.03, 0.01, 2.0, 2.0, 0.7, -0.4][:length], dtype=F64)
    cams = cams.expand(batch, -1) + 0.02 * torch.randn(batch, length, generator=gen, dtype=F64)
    return cams.to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("min_depth", [0.0, 2.5])
@pytest.mark.parametrize("check_values", [True, False])
def test_render_operator_conversion_matches_packed_cameras(device, min_depth, check_values):
    """Renderer.forward with number depths hands the camera vectors to the render
    operator, which converts them natively; with a depth that requires grad the vectors
    are packed first (pulsar::pack_cameras, torch near/far). Same images and gradients."""
    renderer = Renderer(WIDTH, HEIGHT, right_handed_system=True).to(device)
    renderer.check_values = check_values
    pos, col, rad = _scene(device)
    pos = pos * torch.tensor([1.0, 1.0, -1.0], dtype=F64, device=device)  # in front of a right-handed camera
    cams = _cams(device, 2)

    def run(max_depth):
        c = cams.clone().requires_grad_(True)
        p = pos.clone().requires_grad_(True)
        image = renderer(p, col, rad, c, 0.1, max_depth, min_depth)
        weights = torch.linspace(0.5, 1.5, image.numel(), dtype=F64, device=device).reshape(image.shape)
        (image * weights).sum().backward()
        return image.detach(), c.grad, p.grad

    far = torch.tensor(30.0, dtype=F64, device=device, requires_grad=True)
    packed_path = run(far)
    vector_path = run(30.0)
    assert float(vector_path[1].abs().max()) > 0  # the camera gradient is not trivially equal
    for got, want in zip(vector_path, packed_path):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("device", DEVICES)
def test_hot_path_backward_after_forwards_of_other_cameras(device):
    """Without value checks the renderer converts camera vectors into a buffer of its own,
    which its next call rewrites (and grows, for more cameras). Forwards of other cameras
    between a forward and its backward leave that backward's gradients as they are when
    it follows its forward directly: the backward converts its own vectors again."""
    renderer = Renderer(WIDTH, HEIGHT).to(device)
    renderer.check_values = False
    pos, col, rad = _scene(device)
    first = _cams(device, 1)[0]  # [L]: one camera
    others = [
        _cams(device, 3) + torch.tensor([0.3, -0.2, 0.4] + [0.0] * 7, dtype=F64, device=device),
        _cams(device, 2) * 1.1,
    ]

    def run(between):
        c = first.clone().requires_grad_(True)
        p, r = pos.clone().requires_grad_(True), rad.clone().requires_grad_(True)
        image = renderer(p, col, r, c, 0.1, 30.0)
        with torch.no_grad():
            for cams in between:
                renderer(pos, col, rad, cams, 0.1, 30.0)
        weights = torch.linspace(0.5, 1.5, image.numel(), dtype=F64, device=device).reshape(image.shape)
        (image * weights).sum().backward()
        return image.detach(), c.grad, p.grad, r.grad

    alone = run([])
    assert all(float(g.abs().max()) > 0 for g in alone[1:])
    for got, want in zip(run(others), alone):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_native_renderer_names_a_bad_camera_vector_length():
    """The native render call checks the camera-vector length it is told (0: packed), and
    the render operator before it."""
    pos, col, rad = _scene("cpu")
    cams = _cams("cpu", 1)
    settings = operator_settings(WIDTH, HEIGHT, n_track=5, camera_length=9, check_values=False)
    with pytest.raises(ValueError, match="camera_vectors.length: expected 0 .*got 9"):
        ops._render_forward(pos, col, rad, None, None, cams, None, settings)  # the native call, unchecked
    with pytest.raises(ValueError, match="camera_length: expected 0, 8, 10, 11 or 13, got 9"):
        ops.render(pos, col, rad, None, None, cams, None, settings.encode())  # the operator checks first


@pytest.mark.parametrize("device", DEVICES)
def test_renderer_render_hot_path_with_mask_and_sh(device):
    """render(): SH colours (eye), mask stand-ins (eye, optical axis), batch expansion and
    depth outputs (near/far) all read the native camera's views; same results and camera
    gradient as the torch path."""
    renderer = Renderer(WIDTH, HEIGHT).to(device)
    pos, _, rad = _scene(device, batch=3)
    sh = torch.randn(3, 40, 4, 3, generator=torch.Generator().manual_seed(1), dtype=F64).to(device) * 0.3
    mask = torch.ones(3, 40, dtype=torch.bool, device=device)
    mask[1, ::3] = False
    cams = _cams(device, 1, length=8)

    def run(max_depth):
        c = cams.clone().requires_grad_(True)
        result = renderer.render(pos, sh, rad, c, 0.1, max_depth, sh_degree=1, mask=mask)
        (result.image.sum() + result.depth.sum() + result.distortion.sum()).backward()
        return result.image.detach(), result.depth.detach(), c.grad

    for got, want in zip(run(30.0), run(torch.tensor(30.0, dtype=F64, device=device, requires_grad=True))):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-10)
