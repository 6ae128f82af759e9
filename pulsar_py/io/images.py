"""Images and animations as files, through imageio.

``write_image`` and ``read_image`` handle single images; the file format follows the
extension (``.png``, ``.jpg``/``.jpeg``, ``.bmp``, ``.tif``, ``.webp``: whatever imageio's
installed plugins write). ``write_animation`` and ``read_animation`` handle frame
sequences: ``.gif`` through Pillow (always there with imageio), ``.mp4`` where imageio's
ffmpeg or PyAV plugin is installed (``pip install "imageio[ffmpeg]"``).

Tensors in, tensors out: images are ``[H, W]`` or ``[H, W, C]`` (C = 1, 2, 3 or 4), float
in [0, 1] (clamped, rounded to 8 bits) or uint8; what is read comes back as uint8
``[H, W, C]`` on the CPU. imageio is imported when a file is read or written, so importing
this module costs nothing.
"""

from __future__ import annotations

import os
from typing import Any, List, Sequence, Union

import numpy as np
import torch

from ._deps import require

PathLike = Union[str, "os.PathLike[str]"]

#: Extensions written as JPEG (lossy; no alpha channel).
JPEG_EXTENSIONS = (".jpg", ".jpeg")
#: Quality of JPEG files (Pillow's scale, 1..95; its own default of 75 blurs renders).
JPEG_QUALITY = 95
#: Extensions of animations: GIF (Pillow) and MP4 (imageio's ffmpeg or PyAV plugin).
ANIMATION_EXTENSIONS = (".gif", ".mp4")


def _imageio() -> Any:
    return require("imageio.v3", "to read and write images", package="imageio")


def to_uint8(image: torch.Tensor) -> torch.Tensor:
    """An image as uint8 [H, W, C] on the CPU.

    Args:
        image: [H, W] or [H, W, C] with C in 1..4; uint8 is taken as is, a floating
            tensor is clamped to [0, 1] and scaled to 0..255 (rounded).
    """
    if not isinstance(image, torch.Tensor):
        raise TypeError(f"image: expected a torch.Tensor, got {type(image).__name__}")
    img = image.detach().cpu()
    if img.dim() == 2:
        img = img[:, :, None]
    if img.dim() != 3 or not 1 <= img.shape[-1] <= 4:
        raise ValueError(f"image: expected shape [H, W] or [H, W, C] with C in 1..4, got {tuple(image.shape)}")
    if img.shape[0] < 1 or img.shape[1] < 1:
        raise ValueError(f"image: expected at least one pixel, got shape {tuple(image.shape)}")
    if img.dtype == torch.uint8:
        return img.contiguous()
    if not img.is_floating_point():
        raise TypeError(f"image: expected uint8 or a floating dtype, got {img.dtype}")
    if not bool(torch.isfinite(img).all()):
        raise ValueError("image: expected finite values, got NaN or Inf")
    return (img.float().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).contiguous()


def _pixels(image: torch.Tensor) -> np.ndarray:
    """uint8 numpy [H, W] (one channel: imageio writes grey from 2-D arrays) or [H, W, C]."""
    pixels = to_uint8(image).numpy()
    return pixels[:, :, 0] if pixels.shape[2] == 1 else pixels


def _extension(path: PathLike, allowed: Sequence[str] = ()) -> str:
    extension = os.path.splitext(os.fspath(path))[1].lower()
    if not extension:
        raise ValueError(
            f"{os.fspath(path)!r}: expected a file name with an extension that names the format (.png, .jpg, ...)"
        )
    if allowed and extension not in allowed:
        raise ValueError(f"{os.fspath(path)!r}: expected one of the extensions {', '.join(allowed)}, got {extension!r}")
    return extension


def _make_folder(path: PathLike) -> None:
    folder = os.path.dirname(os.fspath(path))
    if folder:
        os.makedirs(folder, exist_ok=True)


def _as_value_error(path: PathLike, exc: Exception) -> ValueError:
    """imageio's "no plugin for this extension" (an OSError) as a ValueError naming the file."""
    return ValueError(f"{os.fspath(path)!r}: imageio cannot write this format: {exc}")


def _check_known(path: PathLike, extension: str) -> None:
    """A ValueError for an extension that no imageio plugin claims (before imageio tries them all)."""
    from imageio.config import known_extensions

    if extension not in known_extensions:
        raise ValueError(
            f"{os.fspath(path)!r}: imageio cannot write this format: {extension!r} is no image "
            f"format it knows (.png, .jpg, .bmp, .tif, .webp, ...)"
        )


def write_image(path: PathLike, image: torch.Tensor) -> None:
    """Write ``image`` to ``path`` in the format of its extension (.png, .jpg, ...).

    ``image``: see ``to_uint8``. JPEG has no alpha channel: an alpha channel is an error
    there. Parent folders are created as needed.
    """
    extension = _extension(path)
    pixels = _pixels(image)
    options = {}
    if extension in JPEG_EXTENSIONS:
        if pixels.ndim == 3 and pixels.shape[2] in (2, 4):
            raise ValueError(
                f"{os.fspath(path)!r}: JPEG has no alpha channel; got an image with "
                f"{pixels.shape[2]} channels (write .png instead)"
            )
        options["quality"] = JPEG_QUALITY
    iio = _imageio()
    _check_known(path, extension)
    _make_folder(path)
    try:
        iio.imwrite(path, pixels, extension=extension, **options)
    except OSError as exc:
        if "Could not find a backend" in str(exc):
            raise _as_value_error(path, exc) from None
        raise


def _as_tensor(pixels: np.ndarray) -> torch.Tensor:
    if pixels.dtype != np.uint8:
        raise ValueError(f"expected 8-bit images, got pixels of type {pixels.dtype}")
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return torch.from_numpy(np.ascontiguousarray(pixels))


def read_image(path: PathLike) -> torch.Tensor:
    """Read an 8-bit image file to uint8 [H, W, C] (the first frame of an animation)."""
    iio = _imageio()
    return _as_tensor(iio.imread(path, index=0) if _extension(path) in ANIMATION_EXTENSIONS else iio.imread(path))


def write_animation(
    path: PathLike, frames: Sequence[torch.Tensor], frame_ms: Union[float, Sequence[float]] = 100.0, loop: int = 0
) -> None:
    """Write RGB ``frames`` (each [H, W, 3], see ``to_uint8``; all of one size) as an
    animation: ``.gif`` (a 256-colour palette per frame, ``loop`` 0 repeats forever) or
    ``.mp4`` (needs imageio's ffmpeg or PyAV plugin). ``frame_ms``: display time of every
    frame, or one per frame (a GIF shows each for its own time, e.g. a last frame held
    longer; an MP4 has one frame rate, the first frame's).
    """
    extension = _extension(path, ANIMATION_EXTENSIONS)
    if len(frames) == 0:
        raise ValueError("frames: expected at least one frame, got none")
    durations = (
        [float(frame_ms)] * len(frames) if isinstance(frame_ms, (int, float)) else [float(ms) for ms in frame_ms]
    )
    if len(durations) != len(frames):
        raise ValueError(f"frame_ms: expected one duration per frame ({len(frames)}), got {len(durations)}")
    if not all(ms > 0 for ms in durations):
        raise ValueError(f"frame_ms: expected durations > 0, got {frame_ms}")
    pixels: List[np.ndarray] = []
    for k, frame in enumerate(frames):
        rgb = to_uint8(frame).numpy()
        if rgb.shape[2] != 3:
            raise ValueError(f"frames[{k}]: expected RGB [H, W, 3], got shape {tuple(frame.shape)}")
        if pixels and rgb.shape != pixels[0].shape:
            raise ValueError(f"frames[{k}]: expected the shape of frames[0], {pixels[0].shape}, got {rgb.shape}")
        pixels.append(rgb)
    iio = _imageio()
    _make_folder(path)
    stack = np.stack(pixels)
    try:
        if extension == ".gif":
            iio.imwrite(path, stack, extension=".gif", duration=durations, loop=int(loop))
        else:
            iio.imwrite(path, stack, extension=".mp4", fps=1000.0 / durations[0])
    except OSError as exc:
        if "Could not find a backend" in str(exc):
            raise _as_value_error(path, exc) from None
        raise


def read_animation(path: PathLike) -> List[torch.Tensor]:
    """Every frame of an animation (or the one image of a still image) as uint8 [H, W, C]."""
    iio = _imageio()
    stack = iio.imread(path, index=None) if _extension(path) in ANIMATION_EXTENSIONS else iio.imread(path)[None]
    return [_as_tensor(frame) for frame in stack]
