"""The worker's progress lines: ``@@trainfit {json}`` on its stderr, among whatever else the
libraries print there. The worker writes them with :func:`emit`; the parent reads each back as a
typed event with :func:`parse_event` and keeps every other line as the probe's log."""

from __future__ import annotations

import json
import sys
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


def emit(event: str, **fields: Any) -> None:
    sys.stderr.write(PREFIX + json.dumps({"event": event, **fields}) + "\n")
    sys.stderr.flush()


def parse_event(line: str) -> ProbeEvent | None:
    """The event a line carries; None for a line of the log (or a garbled event line)."""
    if not line.startswith(PREFIX):
        return None
    try:
        fields = json.loads(line[len(PREFIX):])
        return _KINDS[fields.pop("event")](**fields)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
