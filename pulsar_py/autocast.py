"""The renderer under ``torch.autocast``: it runs in float32, as torch's precision-sensitive
operators do (softmax, norms, losses).

Inside an autocast region for the renderer's device type, a call's float16 and bfloat16
tensor arguments (sphere tensors, camera vectors, background, one-element settings) are
cast to float32 and the call runs with autocast off for that device type: its outputs are
float32, and the casts pass the gradients back to the low-precision producers (a network
predicting colours in bfloat16, say) in their own dtype. float32 and float64 arguments
are left as they are (autocast does not lower float64). Outside autocast nothing changes:
a float16 or bfloat16 argument stays a TypeError naming it (the renderer computes in
float32 or float64 only).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import torch

LOW_PRECISION = (torch.float16, torch.bfloat16)

F = TypeVar("F", bound=Callable[..., Any])


def _to_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in LOW_PRECISION:
        return value.float()
    return value


def float32_under_autocast(method: F) -> F:
    """Decorates a Renderer method (``self.device`` names its device): under autocast for
    that device type, its low-precision tensor arguments become float32 and it runs with
    autocast off."""

    @functools.wraps(method)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        device_type = self.device.type
        if device_type not in ("cpu", "cuda") or not torch.is_autocast_enabled(device_type):
            return method(self, *args, **kwargs)
        args = tuple(_to_float32(a) for a in args)
        kwargs = {k: _to_float32(v) for k, v in kwargs.items()}
        with torch.autocast(device_type=device_type, enabled=False):
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]
