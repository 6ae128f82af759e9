"""pulsar_py.io.images: images and animations through imageio, the format from the extension."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("imageio")

from pulsar_py.io.images import read_animation, read_image, to_uint8, write_animation, write_image  # noqa: E402


def _smooth_rgb(height=24, width=32) -> torch.Tensor:
    """A colour ramp in [0, 1] (JPEG keeps smooth images close)."""
    y, x = torch.meshgrid(torch.linspace(0, 1, height), torch.linspace(0, 1, width), indexing="ij")
    return torch.stack([x, y, 0.5 * (1 - x)], dim=-1)


@pytest.mark.parametrize("channels", [1, 2, 3, 4])
def test_png_round_trip_is_exact(tmp_path, channels):
    gen = torch.Generator().manual_seed(channels)
    image = torch.randint(0, 256, (13, 17, channels), generator=gen, dtype=torch.uint8)
    path = tmp_path / "sub" / "a.png"
    write_image(path, image)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back = read_image(path)
    assert back.dtype == torch.uint8 and back.shape == (13, 17, channels)
    assert torch.equal(back, image)


def test_float_images_are_clamped_and_rounded(tmp_path):
    image = torch.tensor([[[-0.5, 0.0, 0.2], [0.5, 1.0, 7.0]]])
    write_image(tmp_path / "f.png", image)
    assert read_image(tmp_path / "f.png").tolist() == [[[0, 0, 51], [128, 255, 255]]]
    grey = torch.full((3, 4), 0.25)
    write_image(tmp_path / "g.png", grey)
    assert read_image(tmp_path / "g.png").shape == (3, 4, 1)


@pytest.mark.parametrize("name", ["a.jpg", "a.JPEG"])
def test_jpeg_by_extension(tmp_path, name):
    image = _smooth_rgb()
    path = tmp_path / name
    write_image(path, image)
    data = path.read_bytes()
    assert data[:3] == b"\xff\xd8\xff" and not data.startswith(b"\x89PNG")  # JPEG's start-of-image marker
    back = read_image(path)
    assert back.shape == (24, 32, 3)
    assert float((back.float() / 255 - image).abs().mean()) < 0.01


def test_other_extensions_and_errors(tmp_path):
    image = _smooth_rgb()
    write_image(tmp_path / "a.bmp", image)
    assert (tmp_path / "a.bmp").read_bytes()[:2] == b"BM"
    assert torch.equal(read_image(tmp_path / "a.bmp"), to_uint8(image))
    with pytest.raises(ValueError, match="extension"):
        write_image(tmp_path / "noextension", image)
    with pytest.raises(ValueError, match="imageio cannot write"):
        write_image(tmp_path / "a.unknownformat", image)
    with pytest.raises(ValueError, match="alpha"):
        write_image(tmp_path / "a.jpg", torch.zeros(4, 4, 4))
    with pytest.raises(ValueError, match="C in 1..4"):
        write_image(tmp_path / "a.png", torch.zeros(4, 4, 5))
    with pytest.raises(ValueError, match="finite"):
        write_image(tmp_path / "a.png", torch.full((2, 2, 3), float("nan")))
    with pytest.raises(TypeError, match="uint8 or a floating"):
        write_image(tmp_path / "a.png", torch.zeros(2, 2, 3, dtype=torch.int32))


def test_gif_round_trip(tmp_path):
    gen = torch.Generator().manual_seed(1)
    palette = torch.randint(0, 256, (9, 3), generator=gen, dtype=torch.uint8)
    frames = [palette[torch.randint(0, 9, (17, 23), generator=gen)] for _ in range(3)]
    path = tmp_path / "a.gif"
    write_animation(path, frames, frame_ms=50)
    assert path.read_bytes()[:6] == b"GIF89a"
    back = read_animation(path)
    assert len(back) == 3
    for got, want in zip(back, frames):
        # Nine colours fit a GIF's palette exactly.
        assert got.shape == (17, 23, 3) and torch.equal(got, want)
    assert torch.equal(read_image(path), frames[0])
    # One display time per frame: the last held.
    write_animation(path, frames, frame_ms=[50, 50, 2000])
    iio = pytest.importorskip("imageio.v3")
    assert [iio.immeta(path, index=k)["duration"] for k in range(3)] == [50, 50, 2000]
    assert all(torch.equal(got, want) for got, want in zip(read_animation(path), frames))


def test_gif_of_smooth_images_is_close(tmp_path):
    frames = [_smooth_rgb(40, 60) * (1 - t / 8) for t in range(4)]
    write_animation(tmp_path / "s.gif", frames)
    for got, want in zip(read_animation(tmp_path / "s.gif"), frames):
        assert float((got.float() / 255 - want).abs().mean()) < 0.02


def test_animation_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="frames"):
        write_animation(tmp_path / "a.gif", [])
    with pytest.raises(ValueError, match=r"frames\[1\]"):
        write_animation(tmp_path / "a.gif", [torch.zeros(4, 4, 3), torch.zeros(4, 5, 3)])
    with pytest.raises(ValueError, match=r"frames\[0\]: expected RGB"):
        write_animation(tmp_path / "a.gif", [torch.zeros(4, 4)])
    with pytest.raises(ValueError, match=".gif, .mp4"):
        write_animation(tmp_path / "a.png", [torch.zeros(4, 4, 3)])
    with pytest.raises(ValueError, match="frame_ms"):
        write_animation(tmp_path / "a.gif", [torch.zeros(4, 4, 3)], frame_ms=0)
    with pytest.raises(ValueError, match=r"frame_ms: expected one duration per frame \(1\), got 2"):
        write_animation(tmp_path / "a.gif", [torch.zeros(4, 4, 3)], frame_ms=[100, 100])
    assert not (tmp_path / "a.gif").exists()
