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
