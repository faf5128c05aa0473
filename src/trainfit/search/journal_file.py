"""Optuna's journal file, read so that one torn record stops nothing: the backend every journal of
trainfit's goes through (a shared ``--storage PATH.journal``, and an output folder's ``study.journal``,
which :func:`~trainfit.search.journal.mend_journal` checks first on ``--resume``: a run's own journal
has no other writer, so its damage is a crash's, mended or refused with the way on).

The format is Optuna's own (one JSON record a line, appended under ``JournalFileSymlinkLock``, the
lock Optuna's ``JournalFileBackend`` takes), so Optuna's backend and this one can share a file. What
differs is a torn record: the partial line a writer killed mid-append (or cut off by a full disk)
leaves. Optuna's reader raises on it, for good, in every process sharing the file, and the next
writer's record lands after the torn bytes, on the same line. Here:

- an append first ends a torn record with a line end (under the lock, where no writer is mid-line),
  so the records after it stand on lines of their own;
- a line that holds no record is read as a record that changes nothing, with a warning naming the
  line; where a whole record follows the torn bytes on one line (the next writer's, before this
  fix), that record is read.

Each line still counts as one record, as Optuna's storage counts them (its replay numbers the
records it has read)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainfit.files import naming

RECORD_START = b'{"op_code":'
"""How every record Optuna writes begins (``json.dumps(log, separators=(",", ":"))``, op_code first)."""
NOTHING = {"op_code": 2, "worker_id": "trainfit-torn-record", "study_id": -1, "user_attr": {}}
"""A record that changes nothing: a study user attribute (op 2) of a study no journal has, from a
worker no process is, which Optuna's replay passes over."""


def tolerant_backend(journal: Path) -> Any:
    """The backend of ``journal`` (created where there is none): see the module's docstring."""
    from optuna.storages.journal import BaseJournalBackend, JournalFileSymlinkLock

    class TolerantJournalFile(BaseJournalBackend):
        def __init__(self) -> None:
            self._lock = JournalFileSymlinkLock(str(journal))
            if not journal.exists():  # made where there is none; one that exists is only read until a run appends
                with naming(journal):
                    journal.open("ab").close()
            self._offsets = {0: 0}  # a record's number -> where its line starts
            self._warned: set[int] = set()

        def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
            number = log_number_from if log_number_from in self._offsets else \
                max(n for n in self._offsets if n <= log_number_from)
            with journal.open("rb") as f:
                f.seek(self._offsets[number])
                data = f.read()
            start = 0
            # A last line without its end is left for the next read: it is being written, or torn
            # (then the next append ends it).
            while (end := data.find(b"\n", start)) >= 0:
                line, start = data[start:end], end + 1
                self._offsets[number + 1] = self._offsets[number] + len(line) + 1
                if number >= log_number_from:
                    yield self._record(line, number + 1)
                number += 1

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs)
            with naming(journal):
                self._lock.acquire()
                try:
                    with journal.open("ab+") as f:
                        torn = f.seek(0, os.SEEK_END) > 0 and f.seek(-1, os.SEEK_END) >= 0 and f.read(1) != b"\n"
                        f.write(b"\n" * torn + text.encode())
                        f.flush()
                        os.fsync(f.fileno())
                finally:
                    self._lock.release()

        def _record(self, line: bytes, line_number: int) -> dict[str, Any]:
            record = _decoded(line)
            if record is not None:
                return record
            whole = next((r for at in _starts(line) if (r := _decoded(line[at:])) is not None), None)
            if line_number not in self._warned:
                self._warned.add(line_number)
                kept = "the whole record after it is read" if whole else "it is passed over"
                print(f"warning: {journal} line {line_number} holds a torn record (a writer stopped mid-line): {kept}",
                      file=sys.stderr)
            return whole or NOTHING

    return TolerantJournalFile()


def _decoded(line: bytes) -> dict[str, Any] | None:
    """The record ``line`` holds, or None for none (not JSON, not UTF-8, not a record)."""
    try:
        record = json.loads(line)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both
        return None
    return record if isinstance(record, dict) and "op_code" in record else None


def _starts(line: bytes) -> Iterator[int]:
    """Where a record may begin in ``line`` after its start."""
    at = line.find(RECORD_START, 1)
    while at > 0:
        yield at
        at = line.find(RECORD_START, at + 1)
