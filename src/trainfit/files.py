"""Writing a file whole or not at all, holding a run folder, naming the file a disk refused: what
every output, cache, repaired journal and run folder needs."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Union

from trainfit.errors import TrainfitError

Content = Union[str, bytes, Callable[[IO[bytes]], object]]

DISK_ERRORS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EFBIG: "file too large",
               errno.EROFS: "read-only file system", errno.EIO: "disk error"}
"""The errors of a write the disk refused, in words: the ones :func:`naming` pins on a file."""
_DISK = set(DISK_ERRORS)


@contextlib.contextmanager
def naming(path: Path) -> Iterator[None]:
    """A disk error of a write that names no file (ENOSPC is raised by write/flush) re-raised
    naming ``path``. Any other error is left as it is: a process or pipe the block starts (EMFILE,
    ENOMEM) is no fault of ``path``'s, and pinning it there sends the user to the wrong place."""
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.errno not in _DISK:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err


_FLAGS = {"r+b": os.O_RDWR, "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
          "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND, "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
          "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND, "xb": os.O_WRONLY | os.O_CREAT | os.O_EXCL}


def open_own(path: Path, mode: str) -> IO[Any]:
    """``path`` opened for writing (``mode``: w, wb, a, ab, a+, r+b, xb) as a file of trainfit's own: never through
    a symbolic link, whose target it would overwrite (a ``.lock`` linked to a user's file was wiped), and
    only a regular file (a FIFO would hang the write, a device take it). Anything else at ``path`` is a
    :class:`~trainfit.errors.TrainfitError` naming it and the way on. Other errors (a full disk, no
    permission) are raised as they are."""
    try:
        fd = os.open(path, _FLAGS[mode] | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError as err:
        if err.errno == errno.ELOOP and os.path.islink(path):
            raise TrainfitError(f"{path} is a symbolic link: trainfit writes its own files only, never through a "
                                "link (that would overwrite the file it points to)",
                                f"remove the link (rm {path}) or use another folder") from None
        if err.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO no process reads, a socket; a folder
            raise _not_regular(path, file_kind(os.stat(path).st_mode) or "not a regular file") from None
        raise
    try:
        kind = file_kind(os.fstat(fd).st_mode)
        if kind is not None:
            raise _not_regular(path, kind)
        os.set_blocking(fd, True)
        return os.fdopen(fd, mode.replace("x", "w"))
    except BaseException:
        os.close(fd)
        raise


def file_kind(mode: int) -> str | None:
    """What a file of ``st_mode`` ``mode`` is, in words, where it is no regular file (None for one):
    "a pipe (FIFO)", "a character device", "a folder"..."""
    import stat

    kinds = ((stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))
    if stat.S_ISREG(mode):
        return None
    return next((word for test, word in kinds if test(mode)), "not a regular file")


def _not_regular(path: Path, kind: str) -> TrainfitError:
    return TrainfitError(f"{path} is {kind}, not a regular file: trainfit writes its own files there",
                         f"remove it (rm {path}) or use another folder")


def refused_write(err: BaseException, where: Path) -> OSError | None:
    """The disk's refusal inside another library's error, as the OSError it was, naming ``where``; None
    where ``err`` is no such refusal. safetensors' SafetensorError and tokenizers' Exception say it as
    Rust does ("No space left on device (os error 28)"); torch.save's RuntimeError names no cause
    ("PytorchStreamWriter failed writing file ...: file write failed")."""
    if isinstance(err, OSError):
        return err if err.errno in _DISK else None
    text = str(err)
    # EIO left out: a read can fail so too (a dataset's flaky mount), and the save is not the one to blame
    code = next((code for code in _DISK - {errno.EIO} if f"(os error {code})" in text or os.strerror(code) in text),
                None)
    if code is not None:
        return OSError(code, os.strerror(code), str(where))
    if "PytorchStreamWriter failed writing" in text:
        return OSError(errno.EIO, "a write the disk refused (torch.save: file write failed; a full disk?)", str(where))
    return None


def write_atomically(target: Path, content: Content) -> None:
    """Write ``target`` (text, bytes, or a function that writes into the open file) so that a
    reader, or a crash, never sees half of it. Each process fills a temporary file of its own
    beside the target, flushes it to disk and renames it over the target, so two processes
    writing one file leave one whole version. A disk's refusal names the temporary file (a full
    disk's names none)."""
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        tmp.unlink(missing_ok=True)  # a stale one of this pid's, or a link planted there: the link, not its target
        with naming(tmp), open_own(tmp, "xb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode() if isinstance(content, str) else content)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def set_aside(path: Path) -> Path:
    """Move the damaged file ``path`` to ``NAME.damaged`` beside it (an older one is replaced), so
    that the file rebuilt in its place does not lose what it held; returns where it went."""
    aside = path.with_name(f"{path.name}.damaged")
    path.replace(aside)
    return aside


class FolderBusy(Exception):
    """Another live process holds the folder's lock; ``holder`` says which, as it wrote itself."""

    def __init__(self, folder: Path, holder: str) -> None:
        super().__init__(f"{folder} is held by {holder}")
        self.folder = folder
        self.holder = holder


def lock_folder(folder: Path) -> IO[str]:
    """Hold ``folder/.lock`` for this process until the returned file is closed, or raise
    :class:`FolderBusy`. The lock is an ``flock``: the kernel drops it when the process dies, even
    by ``kill -9``, so a crashed run never leaves a folder locked. The file says who holds it. A
    file system that keeps no locks is a :class:`~trainfit.errors.TrainfitError`: there, two runs
    into one folder could not be kept apart."""
    import socket

    f = open_own(folder / ".lock", "a+")
    try:
        _flock(f, folder)
        f.truncate(0)
        f.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
    except BaseException:  # busy, no locks, or a full disk: the file is not kept open
        f.close()
        raise
    return f


def _flock(f: IO[str], folder: Path) -> None:
    import fcntl

    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # held: EWOULDBLOCK, the one answer that means another process
        f.seek(0)
        raise FolderBusy(folder, f.read().strip() or "another process") from None
    except OSError as err:  # ENOLCK, EOPNOTSUPP: a file system without locks (an NFS without its lock service)
        raise TrainfitError(f"{folder / '.lock'} cannot be locked ({err.strerror}): its file system keeps no "
                            f"locks, so a second run into {folder} could not be refused",
                            "use an --output on a file system with locks (a local disk)") from None


def folder_holder(folder: Path) -> str | None:
    """Who holds ``folder/.lock`` now (as :func:`lock_folder` wrote it), or None when no live
    process does. Takes nothing: a free lock is released again at once."""
    try:
        held = lock_folder(folder)
    except FolderBusy as busy:
        return busy.holder
    except (OSError, TrainfitError):
        return None  # no folder, one we cannot write, or no locks there: nobody holds it through us
    held.close()
    return None


@contextlib.contextmanager
def held_folder(folder: Path, refusal: Callable[[str], Exception]) -> Iterator[IO[str]]:
    """Make ``folder`` and hold its lock (:func:`lock_folder`) for the block, the lock's file
    given to it; where a live process holds it, ``refusal(holder)`` is raised before anything is
    touched: a second run into a running one's folder (a ``--resume`` while it lives, say) would
    delete its work. A folder this call made is removed again if nothing but the lock was written
    into it (refused input leaves no empty folder behind)."""
    made = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        lock = lock_folder(folder)
    except FolderBusy as busy:
        raise refusal(busy.holder) from None  # its folder, as it is
    except TrainfitError:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    with lock:  # closing the file releases the lock
        try:
            yield lock
        finally:
            if made and {p.name for p in folder.iterdir()} <= {".lock"}:
                shutil.rmtree(folder, ignore_errors=True)
