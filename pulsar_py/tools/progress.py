"""A one-line text progress bar for long loops (no tqdm dependency).

On a terminal the line is redrawn in place (carriage return); otherwise (a log file, a
pipe) a full line is printed at every tenth of the run, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class ProgressLine:
    """``ProgressLine(total, label)``; call ``update(done, text)`` as work proceeds and
    ``close()`` at the end. Writes to ``stream`` (default: sys.stderr)."""

    def __init__(self, total: int, label: str = "", stream: Optional[TextIO] = None, width: int = 24,
                 enabled: bool = True) -> None:
        self.total = max(1, int(total))
        self.label = label
        self.stream = sys.stderr if stream is None else stream
        self.width = width
        self.enabled = enabled
        self.start = time.perf_counter()
        isatty = getattr(self.stream, "isatty", None)
        self.interactive = bool(isatty and isatty())
        self._last_tenth = -1
        self._last_draw = 0.0
        self._open_line = False

    def update(self, done: int, text: str = "") -> None:
        """Report ``done`` of ``total`` units finished, with a short status ``text``."""
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.interactive:
            # Redrawing costs terminal time: at most 20 times a second, and at the end.
            if now - self._last_draw < 0.05 and done < self.total:
                return
            self._last_draw = now
            self.stream.write("\r" + self._line(done, text, now) + "\x1b[K")
            self._open_line = True
        else:
            tenth = (10 * done) // self.total
            if tenth == self._last_tenth:
                return
            self._last_tenth = tenth
            self.stream.write(self._line(done, text, now) + "\n")
        self.stream.flush()

    def _line(self, done: int, text: str, now: float) -> str:
        fraction = min(1.0, done / self.total)
        filled = int(round(fraction * self.width))
        bar = "#" * filled + "." * (self.width - filled)
        elapsed = now - self.start
        eta = elapsed / fraction - elapsed if fraction > 0 else float("nan")
        eta_text = f" eta {eta:5.1f} s" if done < self.total and fraction > 0 else ""
        prefix = f"{self.label} " if self.label else ""
        return f"{prefix}[{bar}] {done}/{self.total} {text} {elapsed:5.1f} s{eta_text}"

    def close(self) -> None:
        """End the progress line (a newline after an in-place line)."""
        if self.enabled and self._open_line:
            self.stream.write("\n")
            self.stream.flush()
            self._open_line = False
