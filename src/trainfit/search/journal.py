"""A study's journal file (Optuna's ``JournalFileBackend``): where its damage is found, how it is
mended (a cut last entry dropped; damage further in refused, with the way on), and the storage
that names the file in its errors."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.search.journal_file import tolerant_backend


@dataclass(frozen=True, kw_only=True)
class JournalDamage:
    """The first line of a study journal that is not a complete entry."""

    line: int
    """Its number, from 1."""
    lines: int
    """Lines in the file, a last one without its newline included."""
    reason: str
    """What is wrong with it, in words."""
    good_bytes: int
    """Length of the lines before it: what dropping it (and all after it) keeps."""
    tail: bool
    """No complete entry follows it: dropping it and the rest loses no entry."""


def _entry_problem(line: bytes) -> str | None:
    """Why ``line`` (with its newline) is not an entry Optuna's journal can replay, or None."""
    if not line.endswith(b"\n"):
        return "no line end: a write cut off"
    try:
        entry = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as err:
        return f"not UTF-8 text: byte {err.start + 1}"
    except json.JSONDecodeError as err:
        return f"not JSON: {err.msg} at column {err.colno}"
    return None if isinstance(entry, dict) and "op_code" in entry else "not a journal entry"


def journal_damage(journal: Path) -> JournalDamage | None:
    """The first bad line of ``journal``, or None. Read whole before Optuna reads or writes a byte:
    its reader raises a bare JSONDecodeError or UnicodeDecodeError on a bad line that has others
    after it, and appends after a bad last line, which makes it a bad line with others after it."""
    data = journal.read_bytes()
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]  # what follows the last newline: nothing, or a line cut off
    if not lines[-1]:
        lines.pop()
    good_bytes = 0
    for number, line in enumerate(lines, start=1):
        reason = _entry_problem(line)
        if reason is not None:
            tail = all(_entry_problem(rest) is not None for rest in lines[number:])
            return JournalDamage(line=number, lines=len(lines), reason=reason, good_bytes=good_bytes, tail=tail)
        good_bytes += len(line)
    return None


def _backup_path(journal: Path) -> Path:
    """``study.journal.bak-YYYYmmdd-HHMMSS`` beside it, numbered on if that one exists."""
    base = journal.with_name(f"{journal.name}.bak-{time.strftime('%Y%m%d-%H%M%S')}")
    path, n = base, 1
    while path.exists():
        n += 1
        path = base.with_name(f"{base.name}-{n}")
    return path


def mend_journal(journal: Path, resume: bool) -> dict[str, Any] | None:
    """Make the output folder's journal safe to load and append to, or refuse, leaving it as it is.

    On ``--resume``, a damaged tail (a write cut off by a crash, junk appended after the last
    entry) is dropped after a byte-for-byte backup: it holds no complete entry, and a trial whose
    last entry it was is retried. A bad line with entries after it is refused with the command that
    keeps the lines before it (what follows them is lost, so the user decides). Without
    ``--resume`` the folder holds a study and is refused as such. Returns the repair made (for the
    run to report) or None."""
    damage = journal_damage(journal)
    if damage is None:
        return None
    where = f"{journal} is damaged at line {damage.line} of {damage.lines} ({damage.reason})"
    if not resume:
        raise TrainfitError(f"{journal.parent} already holds a tuning study, and {where}",
                            "pass --resume to continue it (a damaged tail is dropped, with a backup), or "
                            "--output NEW_FOLDER to start afresh")
    backup = _backup_path(journal)
    if not damage.tail:
        import shlex

        keep, src, bak = damage.line - 1, shlex.quote(str(journal)), shlex.quote(str(backup))
        raise TrainfitError(f"{where}, with good entries after it, so the study cannot be loaded; the file is left "
                            "as it is", f"keep the {keep} lines before it and --resume (trials recorded after it are "
                            f"lost): cp {src} {bak} && head -n {keep} {bak} > {src}; "
                            "or use --output NEW_FOLDER to start afresh")
    shutil.copy2(journal, backup)
    # all at once: a crash leaves the old file or the repaired one
    write_atomically(journal, journal.read_bytes()[:damage.good_bytes])
    return {"journal": str(journal), "line": damage.line, "lines": damage.lines, "reason": damage.reason,
            "backup": str(backup)}


def journal_storage(journal: Path) -> Any:
    """The Optuna storage of a journal file (:func:`~trainfit.search.journal_file.tolerant_backend`),
    replayed once: an entry it cannot replay (well-formed but inconsistent) is a clear error before
    anything is appended. A path that is no regular file (a folder, ``/dev/null``) is named as such."""
    from optuna.storages import JournalStorage

    if journal.exists() and not journal.is_file():
        raise TrainfitError(f"the journal {journal} is {'a folder' if journal.is_dir() else 'no regular file'}",
                            "give a journal file's path (PATH.journal): one that exists, or none yet")
    try:
        return JournalStorage(tolerant_backend(journal))
    except OSError:
        raise
    except Exception as err:  # noqa: BLE001 - any replay failure: the file is left as it is
        raise TrainfitError(f"{journal} cannot be replayed ({type(err).__name__}: {err}); the file is left as it is",
                            "start afresh elsewhere: tune with --output NEW_FOLDER (or another --storage)") from None
