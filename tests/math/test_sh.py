"""View-dependent colour from spherical harmonics (pulsar_py.sh).

* The basis: orthonormal over the sphere (exact quadrature), bands rotation-invariant
  (addition theorem), degree 0 constant; the 3DGS colour rule (+0.5, clamp at 0).
* render(sh_degree=...) equals rendering the colours computed per camera by hand, for
  batched cameras (batched features), orthographic cameras and masks.
* Gradients to coefficients, positions and camera: against central finite differences
  (float64), non-zero.
"""

from __future__ import annotations

import math

import pytest
import torch
from camera_scenes import (
    assert_nonzero,
    fixed_weights,
    gradient_setup,
    place_spheres,
    random_camera,
    random_rotation,
    sphere_attributes,
    uniform,
)
from helpers import DEVICES

from pulsar_py import Camera, Renderer, rgb_to_sh_dc, sh_to_color
from pulsar_py.sh import SH_C0, sh_basis, sh_n_coefficients

F64 = torch.float64


def _sphere_quadrature(n_z: int = 10, n_phi: int = 24):
    """Directions [P, 3] and weights [P] integrating polynomials of degree < 2 n_z
    exactly over the unit sphere (Gauss-Legendre in z, uniform in the azimuth)."""
    import numpy as np

    z, w = np.polynomial.legendre.leggauss(n_z)
    z, w = torch.tensor(z, dtype=F64), torch.tensor(w, dtype=F64)
    phi = torch.arange(n_phi, dtype=F64) * (2 * math.pi / n_phi)
    s = (1 - z * z).sqrt()
    dirs = torch.stack([s[:, None] * phi.cos(), s[:, None] * phi.sin(), z[:, None].expand(-1, n_phi)], -1)
    weights = (w[:, None] * (2 * math.pi / n_phi)).expand(-1, n_phi)
    return dirs.reshape(-1, 3), weights.reshape(-1)


def test_basis_is_orthonormal():
    dirs, weights = _sphere_quadrature()
    basis = sh_basis(dirs, 3)  # [P, 16]
    gram = basis.T @ (basis * weights[:, None])
    torch.testing.assert_close(gram, torch.eye(16, dtype=F64), rtol=0, atol=1e-12)


def test_bands_are_rotation_invariant():
    """Addition theorem: sum_m Y_lm(d)^2 = (2l + 1) / (4 pi) for every direction, and each
    band maps onto itself under rotations (its span is rotation invariant)."""
    gen = torch.Generator().manual_seed(0)
    dirs = torch.nn.functional.normalize(uniform(gen, -1, 1, (50, 3)), dim=-1)
    basis = sh_basis(dirs, 3)
    rotated = sh_basis(dirs @ random_rotation(gen, 2.0).T, 3)
    for band in range(4):
        lo, hi = band * band, (band + 1) ** 2
        torch.testing.assert_close(
            (basis[:, lo:hi] ** 2).sum(-1), torch.full((50,), (2 * band + 1) / (4 * math.pi), dtype=F64)
        )
        # The rotated band is a linear combination of the same band: least squares is exact.
        solution = torch.linalg.lstsq(basis[:, lo:hi], rotated[:, lo:hi]).solution
        torch.testing.assert_close(basis[:, lo:hi] @ solution, rotated[:, lo:hi], rtol=0, atol=1e-12)


def test_colour_rule():
    gen = torch.Generator().manual_seed(1)
    colour = uniform(gen, 0.1, 0.9, (5, 3))
    dirs = uniform(gen, -1, 1, (5, 3))
    for degree in range(4):
        coeffs = torch.zeros(5, sh_n_coefficients(degree), 3, dtype=F64)
        coeffs[:, 0] = rgb_to_sh_dc(colour)
        torch.testing.assert_close(sh_to_color(coeffs, dirs, degree), colour)  # view independent
    torch.testing.assert_close(rgb_to_sh_dc(torch.tensor([0.5 + SH_C0], dtype=F64)), torch.tensor([1.0], dtype=F64))
    # Directions are normalised; negative results clamp to 0.
    coeffs = uniform(gen, -1, 1, (5, 16, 3))
    torch.testing.assert_close(sh_to_color(coeffs, dirs * 3.0, 3), sh_to_color(coeffs, dirs, 3))
    coeffs[:, 0] = -10.0
    assert bool((sh_to_color(coeffs, dirs, 3) == 0).all())
    with pytest.raises(ValueError, match="sh_degree"):
        sh_to_color(coeffs, dirs, 4)
    with pytest.raises(ValueError, match="coefficients"):
        sh_to_color(coeffs[:, :9], dirs, 3)


def _sh_scene(seed: int, degree: int, n: int = 8, orthographic: bool = False):
    """A camera, spheres it sees, and SH coefficients giving colours well inside (0, 1)
    (no clamping anywhere near)."""
    camera = random_camera(seed, 20, 15, orthographic=orthographic)
    gen = torch.Generator().manual_seed(seed + 100)
    pos, rad = place_spheres(camera, gen, n)
    coeffs = uniform(gen, -0.1, 0.1, (n, sh_n_coefficients(degree), 3))
    coeffs[:, 0] = rgb_to_sh_dc(uniform(gen, 0.3, 0.7, (n, 3)))
    _, opacity = sphere_attributes(gen, n)
    return camera, pos, rad, coeffs, opacity


SETTINGS = dict(gamma=0.2, max_depth=10.0, min_depth=0.5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("degree", [0, 1, 2, 3])
@pytest.mark.parametrize("orthographic", [False, True], ids=["perspective", "orthographic"])
def test_sh_render_equals_per_camera_colours(degree, orthographic, device):
    camera, pos, rad, coeffs, opacity = _sh_scene(degree, degree, orthographic=orthographic)
    # Three cameras: the first and two moved ones; spheres shared.
    offsets = torch.tensor([[0.0, 0.0, 0.0], [0.2, -0.1, 0.0], [-0.15, 0.1, 0.1]], dtype=F64)
    cameras = Camera(
        camera.rotation.expand(3, 3, 3),
        camera.translation + offsets,
        camera.fx,
        camera.fy,
        camera.cx,
        camera.cy,
        camera.image_size,
        orthographic=orthographic,
    )
    renderer = Renderer(20, 15).to(device)
    to = lambda t: t.to(device)  # noqa: E731
    result = renderer.render(
        to(pos), to(coeffs), to(rad), cameras.to(device), opacity=to(opacity), sh_degree=degree, **SETTINGS
    )
    assert result.image.shape == (3, 15, 20, 3)
    native = cameras.native(20, 15)
    seen = []
    for b in range(3):
        if orthographic:
            directions = native.optical_axis()[b].expand(pos.shape[0], 3)
        else:
            directions = pos - native.eye[b]
        colours = sh_to_color(coeffs, directions, degree)
        assert float(colours.min()) > 0
        seen.append(colours)
        expected = renderer.render(
            to(pos), to(colours), to(rad), cameras[b].to(device), opacity=to(opacity), **SETTINGS
        )
        torch.testing.assert_close(result.image[b], expected.image, rtol=0, atol=1e-13)
        torch.testing.assert_close(result.depth[b], expected.depth, rtol=0, atol=1e-13)
    # Colours depend on the view for degree > 0 with perspective cameras (whose directions
    # differ per camera); orthographic cameras of one rotation share their direction.
    differs = float((seen[0] - seen[1]).abs().max()) > 1e-3
    assert differs == (degree > 0 and not orthographic)
    # Unbatched camera, unbatched spheres: unbatched output, equal to item 0.
    single = renderer.render(
        to(pos), to(coeffs), to(rad), cameras[0].to(device), opacity=to(opacity), sh_degree=degree, **SETTINGS
    )
    assert single.image.shape == (15, 20, 3)
    torch.testing.assert_close(single.image, result.image[0], rtol=0, atol=1e-13)


@pytest.mark.parametrize("device", DEVICES)
def test_sh_with_batched_spheres_and_mask(device):
    camera, pos, rad, coeffs, opacity = _sh_scene(7, 2, n=6)
    other = _sh_scene(8, 2, n=6)
    pos_b, rad_b = torch.stack([pos, other[1]]), torch.stack([rad, other[2]])
    coeffs_b, opacity_b = torch.stack([coeffs, other[3]]), torch.stack([opacity, other[4]])
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 2:4] = False
    coeffs_b[1, 2:4] = float("nan")  # padding may hold anything
    renderer = Renderer(20, 15).to(device)
    to = lambda t: t.to(device)  # noqa: E731
    coeff_leaf = to(coeffs_b).requires_grad_(True)
    pos_leaf = to(pos_b).requires_grad_(True)
    result = renderer.render(
        pos_leaf,
        coeff_leaf,
        to(rad_b),
        camera.to(device),
        opacity=to(opacity_b),
        sh_degree=2,
        mask=to(mask),
        **SETTINGS,
    )
    for b in range(2):
        keep = mask[b]
        one = renderer.render(
            to(pos_b[b][keep]),
            to(coeffs_b[b][keep]),
            to(rad_b[b][keep]),
            camera.to(device),
            opacity=to(opacity_b[b][keep]),
            sh_degree=2,
            **SETTINGS,
        )
        torch.testing.assert_close(result.image[b], one.image, rtol=0, atol=1e-13)
    grads = torch.autograd.grad(
        (result.image * fixed_weights(result.image.shape, device=device)).sum(), [coeff_leaf, pos_leaf]
    )
    for g in grads:
        assert bool(torch.isfinite(g).all())
        assert bool((g[1, 2:4] == 0).all())
        assert float(g.abs().max()) > 0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("degree", [1, 3])
def test_sh_gradients_match_finite_differences(degree, device):
    """Coefficients, positions (geometry and view direction) and camera pose."""
    camera, pos, rad, _, opacity = gradient_setup("perspective", "axis_angle", seed=41)
    gen = torch.Generator().manual_seed(degree)
    n = pos.shape[0]
    coeffs = uniform(gen, -0.2, 0.2, (n, sh_n_coefficients(degree), 3))
    coeffs[:, 0] = rgb_to_sh_dc(uniform(gen, 0.3, 0.7, (n, 3)))
    renderer = Renderer(camera.width, camera.height).to(device)
    weights = fixed_weights((camera.height, camera.width, 3), device=device)
    to = lambda t: t.to(device)  # noqa: E731

    def loss(coeffs, pos, rotation, translation):
        cam = Camera(
            rotation,
            translation,
            to(camera.fx),
            to(camera.fy),
            to(camera.cx),
            to(camera.cy),
            camera.image_size,
            rotation_repr="axis_angle",
        )
        image = renderer.render(pos, coeffs, to(rad), cam, opacity=to(opacity), sh_degree=degree, **SETTINGS).image
        return (image * weights).sum()

    inputs = [
        to(t).detach().clone().requires_grad_(True) for t in (coeffs, pos, camera.rotation[0], camera.translation[0])
    ]
    grads = torch.autograd.grad(loss(*inputs), inputs)
    assert_nonzero(dict(zip(("coefficients", "positions", "rotation", "translation"), grads)))
    # The view direction contributes to the position gradient: it differs from the one
    # with the colours frozen at their current values.
    with torch.no_grad():
        colours = sh_to_color(inputs[0], inputs[1] - to(camera.centre()[0]), degree)
    frozen_pos = inputs[1].detach().clone().requires_grad_(True)
    image = renderer.render(frozen_pos, colours, to(rad), camera.to(device), opacity=to(opacity), **SETTINGS).image
    (frozen,) = torch.autograd.grad((image * weights).sum(), frozen_pos)
    assert float((frozen - grads[1]).abs().max()) > 1e-6 * float(grads[1].abs().max())
    assert torch.autograd.gradcheck(loss, inputs, eps=1e-6, atol=1e-6, rtol=1e-4)
