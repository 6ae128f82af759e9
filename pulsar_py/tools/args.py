"""Argument types shared by the command-line entry points."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # torch loads when a command resolves its device, not at import
    import torch

#: The installed script's name: the program name of a command's help and usage lines
#: when the command line did not say how it was invoked.
SCRIPT = "pulsar-py"


def command_prog(command: str, prog: Optional[str] = None) -> str:
    """Program name for ``command``'s parser: ``prog`` (how the command line was invoked,
    e.g. "python -m pulsar_py demo") or "pulsar-py <command>"."""
    return prog if prog else f"{SCRIPT} {command}"


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1, with a message that names the value."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def command_device(name: str) -> "torch.device":
    """A command's ``--device`` value as the torch.device it renders on: "cpu", "cuda" or
    "cuda:N". Raises ValueError, its message naming --device, the expectation and the value,
    for another name, and for CUDA where this build has no CUDA backend or torch sees no
    CUDA device."""
    import torch

    from .. import build_info

    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device: expected cpu or cuda, got {name!r}") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: expected cpu or cuda, got {name!r}")
    if device.type == "cuda":
        if "cuda" not in build_info()["backends"]:
            raise ValueError(
                f"--device {name}: this build of pulsar_py has no CUDA backend "
                "(rebuild on a machine with nvcc; README.md, 'GPU build')"
            )
        if not torch.cuda.is_available():
            raise ValueError(
                f"--device {name}: torch sees no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda})"
            )
    return device
