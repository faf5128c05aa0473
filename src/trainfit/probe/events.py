"""The worker's progress lines: ``@@trainfit {json}`` on a pipe of their own, the event channel.

The worker writes them with :func:`emit` to the channel's descriptor (:func:`open_channel`); the
parent reads each back as a typed event with :func:`parse_event`. Not on stdout or stderr: the
model's code prints there (``print``, logging, a C library writing to fd 1 or 2), and a line it
printed must never end a probe or steer the display, however it looks. The parent keeps all of
that output as the probe's log."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Union

PREFIX = "@@trainfit "


@dataclass(frozen=True)
class Phase:
    """The probe entered a phase: ``build``, ``memory``, ``burn_in`` or ``timed``."""

    phase: str


@dataclass(frozen=True)
class Step:
    """The ``n``-th timed step took ``seconds``."""

    n: int
    seconds: float


@dataclass(frozen=True)
class Result:
    """The measurement is written at ``path``: the probe is over."""

    path: str


ProbeEvent = Union[Phase, Step, Result]
_KINDS: dict[str, type[ProbeEvent]] = {"phase": Phase, "step": Step, "result": Result}


_channel: int | None = None
"""The write end of the event channel in this process (the worker); None until opened."""


def open_channel(fd: int) -> None:
    """Send this process's events to ``fd``, the channel's write end the runner handed over.

    Not inherited by a program the workload starts (it is closed on ``exec``): only this process
    writes events, and a helper left running does not hold the channel open."""
    global _channel
    os.set_inheritable(fd, False)
    _channel = fd


def emit(event: str, **fields: Any) -> None:
    """Send one event; a line well under ``PIPE_BUF``, so it arrives whole."""
    assert _channel is not None, "open_channel() first: events go to their own pipe"
    os.write(_channel, (PREFIX + json.dumps({"event": event, **fields}) + "\n").encode())


def parse_event(line: str) -> ProbeEvent | None:
    """The event a line carries; None for a line of the log (or a garbled event line)."""
    if not line.startswith(PREFIX):
        return None
    try:
        fields = json.loads(line[len(PREFIX):])
        return _KINDS[fields.pop("event")](**fields)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
