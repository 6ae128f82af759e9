"""Input validation, in one place, before any native code runs.

Every check raises ValueError or TypeError naming the argument, what was expected and
what was given. Value checks (NaN/Inf, ranges) read tensor contents; on CUDA that is a
device synchronisation, so they can be switched off per renderer with
``Renderer.check_values = False`` once a pipeline is known to be sound.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

FLOAT_DTYPES = (torch.float32, torch.float64)
MAX_IMAGE_SIDE = 16384
MAX_TRACK = 128


def check_int(name: str, value: object, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            value = int(value.item())
        else:
            raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    if value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name}: expected an integer {span}, got {value}")
    return int(value)


def check_float(name: str, value: object, low: float, high: float, *, low_open: bool = False,
                high_open: bool = False) -> float:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected a scalar, got a tensor of shape {tuple(value.shape)}")
        value = float(value.detach().item())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__} {value!r}")
    value = float(value)
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and (
        value < high if high_open else value <= high)
    if not ok:
        span = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name}: expected a finite value in {span}, got {value}")
    return value


def check_tensor(name: str, t: object, *, dims: Sequence[int], last: Optional[int] = None,
                 dtype: Optional[torch.dtype] = None, device: Optional[torch.device] = None) -> torch.Tensor:
    """Type, dtype, device and rank of one tensor argument."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float32 or float64, got {t.dtype}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(
            f"{name}: expected dtype {dtype} like vert_pos (mixed dtypes are not cast), got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the renderer's device), got {t.device}")
    if t.dim() not in dims:
        want = " or ".join(str(d) for d in dims)
        raise ValueError(f"{name}: expected {want} dimensions, got shape {tuple(t.shape)}")
    if last is not None and t.shape[-1] != last:
        raise ValueError(f"{name}: expected a last dimension of {last}, got shape {tuple(t.shape)}")
    return t


def check_finite(name: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = (~torch.isfinite(t)).nonzero()[0].tolist()
        raise ValueError(f"{name}: expected finite values, got {t[tuple(bad)].item()} at index {bad}")


def check_range(name: str, t: torch.Tensor, low: float, high: float, *, low_open: bool = False) -> None:
    bad = (t <= low if low_open else t < low) | (t > high)
    if bool(bad.any()):
        idx = bad.nonzero()[0].tolist()
        span = f"{'(' if low_open else '['}{low}, {high}]"
        raise ValueError(f"{name}: expected values in {span}, got {t[tuple(idx)].item()} at index {idx}")


def fail(message: str) -> None:
    raise ValueError(message)


class DeferredValueChecks:
    """Value checks whose verdicts are read from the device in one synchronisation.

    Each check adds a 0-dim boolean tensor that is True when the input is bad, and a
    function that raises the detailed error. ``run()`` stacks the verdicts and reads them
    once (one GPU sync for any number of checks); only a failing check pays for its
    detailed message.
    """

    def __init__(self) -> None:
        self._items: list = []

    def add(self, bad: torch.Tensor, raise_error) -> None:
        self._items.append((bad.reshape(()), raise_error))

    def finite(self, name: str, t: torch.Tensor) -> None:
        self.add(~torch.isfinite(t).all(), lambda: check_finite(name, t))

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
