"""A progress line for long work: done/total, rate, ETA. Quiet enough for CI logs.

Drawn by tqdm. On a terminal the line is redrawn in place a few times a second, with a bar when
the total is known; elsewhere (a CI log, a file) each redraw is a line of its own, at most one
every ``log_every_s`` seconds, so logs stay short. Either way the words are the same::

    counting d.jsonl | 1,200/5,000 rows (24%) | 400 rows/s, ETA 10s | elapsed 3s
"""

from __future__ import annotations

import functools
import sys
from typing import Any, TextIO

from trainfit.format import fmt_num, format_duration


def progress_words(done: int, total: int | None, unit: str, rate: float, elapsed_s: float, note: str = "") -> str:
    """What follows the label: ``1,200/5,000 rows (24%) | 400 rows/s, ETA 10s | elapsed 3s | note``.
    ``rate`` in units per second; a ``total`` that ``done`` has passed (an estimate) is left out."""
    if total and done <= total:
        eta = (total - done) / rate if rate > 0 else None
        parts = [f"{done:,}/{total:,} {unit} ({100.0 * done / total:.0f}%)",
                 f"{fmt_num(rate, 2)} {unit}/s, ETA {format_duration(eta)}"]
    else:
        parts = [f"{done:,} {unit}, {fmt_num(rate, 2)} {unit}/s"]
    parts.append(f"elapsed {format_duration(elapsed_s)}")
    if note:
        parts.append(note)
    return " | ".join(parts)


@functools.cache
def _bar_class() -> type:
    """tqdm with our words as the ``{words}`` field of its ``bar_format`` (tqdm's documented way to
    add a field: extend ``format_dict``). Made at the first count: tqdm loads logging, email and
    more, which a command that counts nothing (``trainfit --help``) does without."""
    from tqdm import tqdm  # type: ignore[import-untyped]

    class Bar(tqdm):
        monitor_interval = 0  # no monitor thread: it only forces redraws for ``miniters``, which is 0 here

        @property
        def format_dict(self) -> dict[str, Any]:
            d = super().format_dict
            rate = d["rate"]  # smoothed over recent redraws; None before the first and at close
            if rate is None:  # the average since the start (a resumed count's earlier rows left out)
                rate = (d["n"] - d["initial"]) / d["elapsed"] if d["elapsed"] > 0 else 0.0
            d["words"] = progress_words(d["n"], d["total"], d["unit"], rate, d["elapsed"], d["postfix"] or "")
            return d

    return Bar


class _LogLines:
    """The stream tqdm draws on off a terminal: each redraw (``\\r``, the line, spaces over a
    longer previous one) becomes a line of its own; tqdm's closing newline adds none."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        for line in text.split("\r"):
            if line := line.rstrip():
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


class Progress:
    """Report progress of ``total`` units (None when unknown) under ``label``.

    ``done``: units already done when it starts (a resumed count), left out of the rate.
    ``enabled=False`` prints nothing at all.
    """

    def __init__(self, label: str, total: int | None = None, unit: str = "rows", *,
                 stream: TextIO | None = None, enabled: bool = True, log_every_s: float = 10.0,
                 done: int = 0) -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done = done
        stream = stream or sys.stderr
        tty = hasattr(stream, "isatty") and stream.isatty()
        self._bar = None if not enabled else _bar_class()(
            desc=label, total=total, initial=done, unit=unit,
            file=stream if tty else _LogLines(stream),
            bar_format="{desc} |{bar}| {words}" if tty and total else "{desc} | {words}",
            dynamic_ncols=tty,  # fit the terminal as it is resized; a log line is never cut
            mininterval=0.25 if tty else log_every_s,
            delay=0 if tty else log_every_s,  # a log's first line comes after an interval, like the others
            miniters=0,  # time alone decides when to redraw
            leave=False)  # a count cut short by an error leaves no line; close() prints the last one

    def update(self, done: int, note: str = "") -> None:
        """``done`` units so far (a total, not an increment); redrawn when the interval has passed."""
        self.done = done
        if self._bar is not None:
            self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(done - self._bar.n)

    def close(self, note: str = "") -> None:
        """The final line, with the average rate, left in place."""
        if self._bar is None:
            return
        self._bar.set_postfix_str(note, refresh=False)
        self._bar.leave = True
        self._bar.delay = 0  # work shorter than the first interval ends with its line too
        self._bar.close()
