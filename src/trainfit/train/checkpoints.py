"""Checkpoint folders a crash cannot spoil: ``checkpoint-STEP`` folders, each usable only once it
holds the completion mark written last, and the older ones removed only after a newer one is complete.

The trainer writes a checkpoint's files one by one (weights, optimizer, scheduler, RNG states,
trainer state); a crash, a full disk or a SIGKILL part-way leaves a folder that looks like a
checkpoint and is not. So a save ends with :func:`mark_complete`: every file flushed to disk, then
the mark written atomically. :func:`latest_complete` never returns an unmarked folder, and
:func:`rotate` deletes old checkpoints only once a newer one is marked, so the last complete
checkpoint survives whatever happens during the next save.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from pathlib import Path

from trainfit.errors import TrainfitError
from trainfit.files import write_atomically

MARK = "trainfit-complete.json"
_NAME = re.compile(r"^checkpoint-(\d+)$")


def step_of(folder: Path) -> int | None:
    """The optimizer step a ``checkpoint-STEP`` folder was saved at; None for any other name."""
    match = _NAME.match(folder.name)
    return int(match.group(1)) if match else None


def checkpoints(run: Path) -> list[Path]:
    """The ``checkpoint-STEP`` folders in ``run``, oldest step first, complete or not."""
    found = [p for p in run.glob("checkpoint-*") if p.is_dir() and step_of(p) is not None]
    return sorted(found, key=lambda p: step_of(p) or 0)


def is_complete(folder: Path) -> bool:
    """Whether ``folder`` holds the mark :func:`mark_complete` writes after its last file."""
    try:
        return json.loads((folder / MARK).read_text()).get("step") == step_of(folder)
    except (OSError, ValueError, AttributeError):
        return False


def latest_complete(run: Path) -> Path | None:
    """The newest complete checkpoint in ``run``; None when there is none."""
    return next((p for p in reversed(checkpoints(run)) if is_complete(p)), None)


def incomplete(run: Path) -> list[Path]:
    """Checkpoint folders a save did not finish (no mark): of no use to a resume."""
    return [p for p in checkpoints(run) if not is_complete(p)]


def mark_complete(folder: Path) -> None:
    """Flush every file of the checkpoint ``folder`` to disk, then write its mark (atomically)."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    write_atomically(folder / MARK, json.dumps({"step": step_of(folder), "files": len(files),
                                                "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
    _fsync_dir(folder)


def rotate(run: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` complete checkpoints of ``run``, and every unfinished one
    older than the newest complete one. Returns what was deleted."""
    found = checkpoints(run)
    complete = {p: is_complete(p) for p in found}
    done = [p for p in found if complete[p]]
    if not done:
        return []
    newest = step_of(done[-1]) or 0
    doomed = done[:-keep] if keep > 0 else []
    doomed += [p for p in found if not complete[p] and (step_of(p) or 0) < newest]
    for path in doomed:
        (path / MARK).unlink(missing_ok=True)  # first: a removal cut short (a second Ctrl-C) leaves no "complete" wreck
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unloadable(folder: Path, err: BaseException) -> TrainfitError:
    """The error for a complete checkpoint a resume could not load (a file damaged after its save)."""
    return TrainfitError(f"could not resume from {folder}: {type(err).__name__}: {err}",
                         f"if that checkpoint is damaged, remove it (rm -r {shlex.quote(str(folder))}) and resume "
                         "again: the one before it is used, or step 0 when there is none")
