"""The worker's progress lines: ``@@trainfit {json}`` on its stderr, among whatever else the
libraries print there. The worker writes them with :func:`emit`; the parent picks them out of the
stream with :func:`parse_event` and keeps every other line as the probe's log."""

from __future__ import annotations

import json
import sys
from typing import Any

PREFIX = "@@trainfit "


def emit(event: str, **fields: Any) -> None:
    sys.stderr.write(PREFIX + json.dumps({"event": event, **fields}) + "\n")
    sys.stderr.flush()


def parse_event(line: str) -> dict[str, Any] | None:
    """The event a line carries; None for a line of the log (or a garbled event line)."""
    if not line.startswith(PREFIX):
        return None
    try:
        event = json.loads(line[len(PREFIX):])
    except ValueError:
        return None
    return event if isinstance(event, dict) else None
