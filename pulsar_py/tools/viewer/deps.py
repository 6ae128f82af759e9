"""viser, the viewer's optional dependency: imported when a viewer starts."""

from __future__ import annotations

import contextlib
import io
from types import ModuleType
from typing import Iterator

from ...io._deps import MissingDependency

#: What to run where viser is missing.
INSTALL = 'pip install "pulsar_py[viewer]"'


def require_viser() -> ModuleType:
    """``import viser``; where it is missing, MissingDependency (an ImportError) whose
    one-line message says how to install it."""
    try:
        import viser
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "viser":
            raise  # a package viser itself imports is missing: its own error says more
        raise MissingDependency(f"the viewer needs the package viser: {INSTALL}", name="viser") from None
    return viser


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Swallow what is printed to stdout inside the block.

    viser prints a banner when its server starts and a line when it stops, whatever its
    ``verbose`` flag says; the viewer prints its own one-line address instead, and the
    benchmark's stdout is one JSON line.
    """
    with contextlib.redirect_stdout(io.StringIO()):
        yield
