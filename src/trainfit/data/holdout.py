"""A held-out split of a dataset, for a comparison given no eval set of its own: ``n`` rows drawn
by a seed become the eval set, the rest the training data, each written as JSONL (the rows as
read, in file order). The same data, ``n`` and seed give the same split, so a resumed comparison
evaluates on the same rows."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import IO

from trainfit.data.order import file_rows
from trainfit.errors import TrainfitError
from trainfit.files import write_atomically


def hold_out(path: str, n: int, *, seed: int, folder: Path, fmt: str = "auto",
             on_bad_row: str = "stop") -> tuple[Path, Path]:
    """Split the data at ``path`` into ``folder/train.jsonl`` and ``folder/heldout.jsonl`` (``n``
    rows drawn with ``seed``); returns their paths (train, held out). Two passes over the data;
    memory holds the held-out rows, not the training data. Raises :class:`TrainfitError` when
    ``n`` leaves no row to train on."""
    total = sum(1 for _ in file_rows(path, fmt=fmt, on_bad_row=on_bad_row))
    if not 0 < n < total:
        raise TrainfitError(f"--holdout {n}: the data has {total:,} rows, and at least one must stay to train on",
                            f"hold out between 1 and {total - 1:,} rows (e.g. {max(1, total // 20):,}, 5%)")
    chosen = set(random.Random(f"holdout:{seed}").sample(range(total), n))
    folder.mkdir(parents=True, exist_ok=True)
    train, held = folder / "train.jsonl", folder / "heldout.jsonl"
    held_lines: list[bytes] = []  # n rows: an eval set's size

    def write_train(f: IO[bytes]) -> None:
        for index, row in enumerate(file_rows(path, fmt=fmt, on_bad_row=on_bad_row)):
            line = (json.dumps(row, ensure_ascii=False, default=str) + "\n").encode()
            if index in chosen:
                held_lines.append(line)
            else:
                f.write(line)

    write_atomically(train, write_train)
    write_atomically(held, b"".join(held_lines))
    return train, held
