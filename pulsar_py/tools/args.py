"""Argument types shared by the command-line entry points."""

from __future__ import annotations

import argparse
from typing import Optional

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
