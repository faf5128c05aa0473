"""A progress line for long work: done/total, rate, ETA. Quiet enough for CI logs.

On a terminal the line is redrawn in place a few times a second; elsewhere a line is printed
every ``log_every_s`` seconds so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def format_duration(seconds: float | None) -> str:
    """``83`` -> ``1m23s``; None -> ``?``."""
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    """Report progress of ``total`` units (None when unknown) under ``label``."""

    def __init__(self, label: str, total: int | None = None, unit: str = "rows", *,
                 stream: TextIO | None = None, enabled: bool = True, log_every_s: float = 10.0,
                 done: int = 0) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = 0.25 if self.tty else log_every_s
        self.start = time.perf_counter()
        self.start_done = done
        self.done = done
        self._last = self.start

    def update(self, done: int, note: str = "") -> None:
        self.done = done
        now = time.perf_counter()
        if self.enabled and now - self._last >= self.interval:
            self._last = now
            self._draw(note)

    def line(self, note: str = "") -> str:
        elapsed = time.perf_counter() - self.start
        rate = (self.done - self.start_done) / elapsed if elapsed > 0 else 0.0
        parts = [self.label]
        if self.total:
            pct = 100.0 * self.done / self.total
            eta = (self.total - self.done) / rate if rate > 0 else None
            parts.append(f"{self.done:,}/{self.total:,} {self.unit} ({pct:.0f}%)")
            parts.append(f"{rate:,.0f} {self.unit}/s, ETA {format_duration(eta)}")
        else:
            parts.append(f"{self.done:,} {self.unit}, {rate:,.0f} {self.unit}/s")
        parts.append(f"elapsed {format_duration(elapsed)}")
        if note:
            parts.append(note)
        return " | ".join(parts)

    def _draw(self, note: str) -> None:
        text = self.line(note)
        if self.tty:
            self.stream.write("\r\033[K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self, note: str = "") -> None:
        if not self.enabled:
            return
        text = self.line(note)
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.stream.flush()
