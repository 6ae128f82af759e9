"""How large the randomised sweeps and the slowest checks run.

``PULSAR_PY_SWEEP=small`` (the default) sizes them so that the whole suite takes a few minutes
on 2 CPU cores; ``PULSAR_PY_SWEEP=full`` runs each at its full size (README.md says how long
that takes). A small sweep keeps every check of the full one; it draws fewer random scenes,
parameters and repetitions.
"""

from __future__ import annotations

import os

MODES = ("small", "full")
MODE = os.environ.get("PULSAR_PY_SWEEP", "").strip().lower() or "small"
if MODE not in MODES:
    raise ValueError(f"PULSAR_PY_SWEEP: expected one of {', '.join(MODES)}, got {os.environ['PULSAR_PY_SWEEP']!r}")
FULL = MODE == "full"


def size(small: int, full: int) -> int:
    """``full`` under PULSAR_PY_SWEEP=full, else ``small``."""
    return full if FULL else small
