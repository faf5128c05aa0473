"""The root folder the UI serves, and the one check every path from a request goes through: it is
resolved (``..`` and links followed) and refused unless it lies inside the root. Also how the UI reads
a file it found in a folder listing (a regular file only: a FIFO would hang the page for good) and
how it says a write the disk refused."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import BinaryIO

from trainfit.errors import TrainfitError
from trainfit.files import DISK_ERRORS, file_kind

UI_FOLDER = ".trainfit-ui"
"""The UI's own records under the root: ``jobs/<id>/`` (each job's record and log), saved specs, its token."""

TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,128}")
"""A token as a URL carries it unescaped: 16 to 128 of the URL-safe base64 characters."""


class Refused(TrainfitError):
    """A request named a path the UI will not touch; ``status`` is the HTTP status to answer."""

    def __init__(self, message: str, hint: str | None = None, *, status: int = 403) -> None:
        super().__init__(message, hint)
        self.status = status


class Root:
    """The folder the UI works in: run folders, specs and the UI's jobs all live under it."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path).resolve()
        if not self.path.is_dir():
            raise TrainfitError(f"{path} is not a folder", "give --root a folder (default: the current folder)")

    @property
    def jobs(self) -> Path:
        """Where each job's folder is made."""
        return self.path / UI_FOLDER / "jobs"

    def inside(self, relative: str, *, must_exist: bool = True) -> Path:
        """``relative`` (a path from a request, relative to the root) resolved, or :class:`Refused`:
        403 outside the root (an absolute path, ``..``, a link out), 404 where nothing is there."""
        if not relative or "\x00" in relative:
            raise Refused("no path given", "pick a file or folder under the root", status=404)
        path = (self.path / relative).resolve()
        if not self.holds(path):
            raise Refused(f"{relative} is outside the UI's root {self.path}",
                          "only files and folders under the root can be opened; start `trainfit ui --root` higher up")
        hidden = [part for part in path.relative_to(self.path).parts if part.startswith(".")]
        if UI_FOLDER in hidden:  # at any depth: another root's UI records (its jobs' command lines) are as private
            raise Refused(f"{relative} lies in a {UI_FOLDER} folder: the UI's own records are not served",
                          "open a job from the list of jobs")
        if hidden:  # checked where the path leads: a link to .env is .env
            raise Refused(f"{relative} is a hidden file or lies in a hidden folder",
                          "the UI opens run folders and specs, not dot-files (.env, .git, .ssh)")
        if must_exist and not path.exists():
            raise Refused(f"{relative} does not exist under {self.path}", "pick one the page lists", status=404)
        return path

    def holds(self, path: Path) -> bool:
        """``path`` (resolved: links followed) is the root or lies under it."""
        return path == self.path or self.path in path.parents

    def why_not_opened(self, path: Path) -> str | None:
        """Why a file a folder listing found under the root is not opened (None: it is opened): a link
        that leads out of the root or to a hidden file, or no regular file (a FIFO would hang the reader)."""
        target = path.resolve()
        if not self.holds(target) or any(p.startswith(".") for p in target.relative_to(self.path).parts):
            return "a link that leads outside the root or to a hidden file: not opened"
        try:
            mode = target.stat().st_mode
        except OSError as err:
            return f"cannot be read: {err.strerror}"
        kind = file_kind(mode)
        return None if kind is None else f"not a regular file ({kind}): not opened"

    def relative(self, path: Path) -> str:
        """``path`` (under the root) as the root-relative text a URL carries."""
        return path.resolve().relative_to(self.path).as_posix()


class NotRegular(OSError):
    """A path a folder listing gave is a FIFO, a device or a socket: reading it could block for good."""


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading in binary, where it is a regular file (links followed), else
    :class:`NotRegular`. Opened without blocking first: opening a FIFO waits for a writer, forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise NotRegular(errno.EINVAL, f"not a regular file ({kind})", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path, limit: int = -1, *, errors: str = "replace") -> str:
    """The text of the regular file ``path`` (:func:`open_regular`), its first ``limit`` bytes where
    given; bytes that are no UTF-8 are replaced (``errors="strict"``: a UnicodeDecodeError)."""
    with open_regular(path) as f:
        return f.read(limit).decode(errors=errors)


def write_refused(err: OSError, path: Path) -> Refused:
    """A write the system refused, as the page says it: the cause in words and the file (``err``'s,
    else ``path``): 507 for a disk's refusal (a full disk), 500 for another."""
    named = err.filename or path
    if err.errno in DISK_ERRORS:
        return Refused(f"{DISK_ERRORS[err.errno]}: cannot write {named} ({err.strerror})",
                       "free some space on that disk, then try again", status=507)
    return Refused(f"cannot write {named}: {err.strerror or err}", "check the folder's permissions", status=500)


def prune_empty(folder: Path, *, up_to: Path) -> None:
    """Remove ``folder``, then each of its parents below ``up_to``, while empty (``rmdir``: a folder
    that holds anything is kept, and so are its parents): what a failed start made, undone."""
    while folder != up_to and up_to in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
