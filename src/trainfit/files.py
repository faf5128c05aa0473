"""Writing a file whole or not at all: what every output, cache and repaired journal needs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Union

Content = Union[str, bytes, Callable[[IO[bytes]], object]]


def write_atomically(target: Path, content: Content) -> None:
    """Write ``target`` (text, bytes, or a function that writes into the open file) so that a
    reader, or a crash, never sees half of it. Each process fills a temporary file of its own
    beside the target, flushes it to disk and renames it over the target, so two processes
    writing one file leave one whole version. An error names the file (a full disk's does not)."""
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(target)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise OSError(err.errno, err.strerror, err.filename or str(tmp)) from err
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class FolderBusy(Exception):
    """Another live process holds the folder's lock; ``holder`` says which, as it wrote itself."""

    def __init__(self, folder: Path, holder: str) -> None:
        super().__init__(f"{folder} is held by {holder}")
        self.folder = folder
        self.holder = holder


def lock_folder(folder: Path) -> IO[str]:
    """Hold ``folder/.lock`` for this process until the returned file is closed, or raise
    :class:`FolderBusy`. The lock is an ``flock``: the kernel drops it when the process dies, even
    by ``kill -9``, so a crashed run never leaves a folder locked. The file says who holds it."""
    import fcntl
    import socket

    f = (folder / ".lock").open("a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise FolderBusy(folder, holder) from None
    f.truncate(0)
    f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    f.flush()
    return f


def folder_holder(folder: Path) -> str | None:
    """Who holds ``folder/.lock`` now (as :func:`lock_folder` wrote it), or None when no live
    process does. Takes nothing: a free lock is released again at once."""
    try:
        held = lock_folder(folder)
    except FolderBusy as busy:
        return busy.holder
    except OSError:
        return None  # no folder, or one we cannot write: nobody holds it through us
    held.close()
    return None
