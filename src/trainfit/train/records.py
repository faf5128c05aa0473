"""The JSON state files ``trainfit train`` reads (``plan.json``, ``train.json``,
``train_result.json``), read as their records or refused in one line naming the file.

A file of valid JSON can still be damaged: an edit by hand, a bad merge, another tool's output
(``"command": 12``). :meth:`trainfit.summary.Record.from_json` checks the values' types and says
which key is wrong (:class:`trainfit.summary.Malformed`); :func:`load_record` adds the file and the
fix, and marks the file :class:`Damaged`, which a resume can rebuild (:mod:`trainfit.train.rebuild`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from trainfit.errors import TrainfitError
from trainfit.summary import Malformed, Record

R = TypeVar("R", bound=Record)


class Damaged(TrainfitError):
    """A state file that is not what trainfit wrote: not JSON, not an object, or a value of the
    wrong type (a file of another schema version is not damaged: it is refused as such)."""


def read_object(path: Path, what: str, fix: str) -> dict[str, Any]:
    """The JSON object in ``path`` (``what`` names it in the error; ``fix`` is the error's fix)."""
    try:
        text = path.read_bytes()
    except OSError as err:
        raise TrainfitError(f"cannot read {what} {path}: {err}", fix) from None
    try:
        raw = json.loads(text)
    except ValueError as err:  # UnicodeDecodeError is one
        raise Damaged(f"cannot read {what} {path}: {err}", fix) from None
    if not isinstance(raw, dict):
        raise Damaged(f"{what} {path} is not a JSON object", fix)
    return raw


def load_record(cls: type[R], path: Path, what: str, fix: str) -> R:
    """``path`` read as a ``cls`` record; :class:`Damaged`, naming the file and the key, where a
    value is missing or of the wrong type."""
    try:
        return cls.from_json(read_object(path, what, fix))
    except Malformed as err:
        raise Damaged(f"{what} {path} is damaged: {err}", fix) from None
