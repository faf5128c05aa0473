"""The order a training loop reads a dataset in: shuffled, reproducible, memory-bounded, resumable.

Rows stream from disk through a shuffle buffer of ``buffer`` rows (as webdataset and
``datasets``' streaming shuffle do): the next row out is a random one of the buffer, drawn by a
generator seeded with ``(seed, epoch)``. Memory holds ``buffer`` rows whatever the file's size,
each epoch has its own order, and the same seed and epoch give the same order, so a resumed run
reads on from sample ``skip`` with nothing repeated or skipped.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainfit.data.lengths import bad_row_error
from trainfit.data.readers import BadRow, iter_rows

BUFFER = 8192


def file_rows(path: str, *, fmt: str = "auto", on_bad_row: str = "stop") -> Iterator[dict[str, Any]]:
    """The rows of ``path`` in file order (as an evaluation pass reads them). A bad row is an
    error naming it (``on_bad_row: stop``) or left out (``skip``)."""
    for index, row in iter_rows(path, fmt):
        if isinstance(row, BadRow):
            if on_bad_row == "stop":
                raise bad_row_error(Path(path), {"row": index, "line": row.line, "reason": row.reason})
            continue
        yield row


def epoch_rows(path: str, *, seed: int, epoch: int, fmt: str = "auto", skip: int = 0, buffer: int = BUFFER,
               on_bad_row: str = "stop") -> Iterator[dict[str, Any]]:
    """The rows of ``path`` in epoch ``epoch``'s order, from its sample ``skip`` on. A bad row is
    an error naming it (``on_bad_row: stop``) or left out (``skip``)."""
    rng = random.Random(f"{seed}:{epoch}")
    pool: list[dict[str, Any]] = []
    produced = 0

    def out(row: dict[str, Any]) -> Iterator[dict[str, Any]]:
        nonlocal produced
        produced += 1
        if produced > skip:
            yield row

    for row in file_rows(path, fmt=fmt, on_bad_row=on_bad_row):
        if len(pool) < buffer:
            pool.append(row)
            continue
        i = rng.randrange(len(pool))
        chosen, pool[i] = pool[i], row
        yield from out(chosen)
    rng.shuffle(pool)
    for row in pool:
        yield from out(row)
