"""Argument checks of one value at a time, below every other module of the package:
integers, floats and flags given by users, one tensor's type, layout, dtype, device and
rank, and value checks read back together (``DeferredValueChecks``). ``_checks.py`` builds
the renderer's rules from them, and ``cameras/`` uses them without importing the renderer's
checks. Every check raises ValueError (bad value, shape, device) or TypeError (bad type or
dtype) naming the argument, what was expected and what was given.
"""

from __future__ import annotations

import math
import numbers
from typing import Callable, Optional, Sequence

import numpy as np
import torch

FLOAT_DTYPES = (torch.float32, torch.float64)
MAX_IMAGE_SIDE = 16384  # pixels per side (include/pulsar/renderer.h kMaxImageSide)


def check_int(name: str, value: object, low: int, high: Optional[int] = None) -> int:
    """An integer (Python, NumPy or a one-element integer tensor) in [low, high]."""
    if type(value) is int and value >= low and (high is None or value <= high):
        return value  # the common case, without the ABC checks below
    if (
        isinstance(value, torch.Tensor)
        and check_readable(name, value).numel() == 1
        and not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
    ):
        value = int(value.item())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {short_repr(value)}")
    value = int(value)
    if value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name}: expected an integer {span}, got {value}")
    return value


def in_interval(value: float, low: float, high: float, low_open: bool, high_open: bool) -> bool:
    return (value > low if low_open else value >= low) and (value < high if high_open else value <= high)


def check_float(
    name: str, value: object, low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> float:
    """A finite real number in the given interval, as a Python float.

    A one-element floating tensor is read (a synchronisation on CUDA) at every call, so a
    tensor changed in place takes effect. Its graph is not followed: the renderer takes
    such a setting as a plain number (callers warn when it requires grad).
    """
    if type(value) is float and in_interval(value, low, high, low_open, high_open):
        return value  # the common case (NaN fails the comparisons), without the checks below
    if isinstance(value, torch.Tensor):
        if check_readable(name, value).numel() != 1:
            raise ValueError(
                f"{name}: expected a number or a one-element tensor, got a tensor of shape {tuple(value.shape)}"
            )
        if not value.is_floating_point():
            raise TypeError(f"{name}: expected a float, got a tensor of dtype {value.dtype}")
        value = float(value.detach().reshape(()).item())
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__} {short_repr(value)}")
    value = float(value)
    if not (math.isfinite(value) and in_interval(value, low, high, low_open, high_open)):
        span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise ValueError(f"{name}: expected a finite value in {span}, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    """A flag: bool or numpy.bool_ (1, "yes", None or tensors are rejected, not guessed)."""
    if value is True or value is False:
        return value
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool (True or False), got {type(value).__name__} {short_repr(value)}")
    return bool(value)


def check_tensor(
    name: str,
    t: object,
    *,
    dims: Sequence[int],
    last: Optional[int] = None,
    dtype: Optional[torch.dtype] = None,
    device: Optional[torch.device] = None,
    like: str = "vert_pos",
    device_of: str = "the renderer's device; move the renderer with .to(device)",
) -> torch.Tensor:
    """Type, layout, dtype, device and rank of one tensor argument. ``like``: the argument
    whose dtype every other takes; ``device_of``: what the device is, for messages."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    check_readable(name, t)
    if t.layout != torch.strided:
        raise TypeError(
            f"{name}: expected a dense (strided) tensor, got layout {t.layout}; convert it with .to_dense()"
        )
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float32 or float64, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} like {like} (mixed dtypes are not cast), got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} ({device_of}), got {t.device}")
    if t.dim() not in dims:
        want = " or ".join(str(d) for d in dims)
        raise ValueError(f"{name}: expected {want} dimension{'' if dims == (1,) else 's'}, got shape {tuple(t.shape)}")
    if last is not None and t.shape[-1] != last:
        raise ValueError(f"{name}: expected a last dimension of {last}, got shape {tuple(t.shape)}")
    return t


def check_readable(name: str, t: torch.Tensor) -> torch.Tensor:
    """A tensor whose values can be read: TypeError for a nested tensor, ValueError for
    one on the meta device (shape and dtype only, no values to render)."""
    if t.is_nested:
        raise TypeError(f"{name}: expected a dense (strided) tensor, got a nested tensor")
    if t.is_meta:
        raise ValueError(
            f"{name}: expected a tensor with values (on the CPU or a CUDA device), got a tensor on "
            f"the meta device, which holds none"
        )
    return t


def check_finite(name: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise ValueError(f"{name}: expected finite values, got {t[tuple(bad)].item()} at index {bad}")


def check_bounded(name: str, t: torch.Tensor, limit: float) -> None:
    check_finite(name, t)
    if bool((t.abs() > limit).any()):
        bad = (t.abs() > limit).nonzero()[0].tolist()
        raise ValueError(
            f"{name}: expected |values| <= {limit:.3g} for {t.dtype} (squared distances must "
            f"not overflow), got {t[tuple(bad)].item()} at index {bad}"
        )


def check_range(name: str, t: torch.Tensor, low: float, high: float, *, low_open: bool = False) -> None:
    bad = (t <= low if low_open else t < low) | (t > high)
    if bool(bad.any()):
        idx = bad.nonzero()[0].tolist()
        span = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name}: expected values in {span}, got {t[tuple(idx)].item()} at index {idx}")


def fail(message: str) -> None:
    raise ValueError(message)


class DeferredValueChecks:
    """Value checks whose verdicts are read from the device in one synchronisation.

    Each check adds a 0-dim boolean tensor that is True when the input is bad, and a
    function that raises the detailed error. ``run()`` stacks the verdicts and reads them
    once (one GPU sync for any number of checks); only a failing check pays for its
    detailed message. Empty tensors pass every check.
    """

    def __init__(self) -> None:
        self._items: list = []

    def add(self, bad: torch.Tensor, raise_error: Callable[[], None]) -> None:
        self._items.append((bad.reshape(()), raise_error))

    def finite(self, name: str, t: torch.Tensor) -> None:
        self.add(~torch.isfinite(t).all(), lambda: check_finite(name, t))

    def bounded(self, name: str, t: torch.Tensor, limit: float) -> None:
        """Finite and |t| <= limit, in one reduction (NaN fails the comparison)."""
        self.add(~(t.abs() <= limit).all(), lambda: check_bounded(name, t, limit))

    def in_range(self, name: str, t: torch.Tensor, low: float, high: float, *, low_open: bool = False) -> None:
        bad = ((t <= low) if low_open else (t < low)) | (t > high)
        self.add(bad.any(), lambda: check_range(name, t, low, high, low_open=low_open))

    def run(self) -> None:
        if not self._items:
            return
        verdicts = torch.stack([bad for bad, _ in self._items]).tolist()
        for verdict, (_, raise_error) in zip(verdicts, self._items):
            if verdict:
                raise_error()
        self._items.clear()


def short_repr(value: object, limit: int = 60) -> str:
    """repr of a value for a message, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
