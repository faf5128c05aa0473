"""The dataset's own rows for a probe's timed micro-batches (``probe.data: real``).

The timed batches keep the shapes the parent picked from the epoch's lengths (probe/estimate.py), so
a real probe times the same shapes as a synthetic one; each sample of those batches is a row of the
dataset with that (truncated) length, the first such row in the file, so a probe reads no further
into a large file than it must and every probe of a tune gets the same rows for the same lengths.
For a Hugging Face model the rows are tokenized here, once, as TRL tokenizes its dataset before
training; the worker's loader only pads them into batches. A factory gets the rows as read, for
its own ``collate`` (which may decode audio: that is the input pipeline measured).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainfit.data.analyze import recipe_for_spec
from trainfit.data.lengths import count_lengths
from trainfit.data.readers import BadRow, fingerprint, iter_rows
from trainfit.data.row_length import BAD, LengthRecipe, Tokenizer, row_text
from trainfit.errors import TrainfitError
from trainfit.probe.loader import synthetic_instead
from trainfit.spec import Spec

Rows = tuple[tuple[Any, ...], ...]


def timing_rows(spec: Spec, timing_batches: Sequence[Sequence[int]], max_length: int,
                notes: list[str]) -> Rows | None:
    """The rows of each timed micro-batch under ``probe.data: real`` (or ``auto`` where the data
    allows), else None: synthetic inputs, with a note saying why under ``auto``. An explicit
    ``real`` that cannot be honoured is an error naming the reason."""
    mode = spec.probe.data
    if mode == "synthetic" or spec.data is None:
        return None
    recipe = recipe_for_spec(spec)
    why_not = _why_not_real(spec, recipe)
    if why_not is not None:
        synthetic_instead(mode, why_not, "fix that", notes)
        return None
    assert spec.data is not None
    table = count_lengths(spec.data.path, recipe, fmt=spec.data.format, on_bad_row=spec.data.on_bad_row,
                          progress=False)
    picked = pick_rows(table.lengths, timing_batches, max_length)
    rows = _read_rows(spec.data.path, spec.data.format, {i for batch in picked for i in batch})
    if spec.model.factory is not None:
        made = tuple(tuple(rows[i] for i in batch) for batch in picked)
        try:
            json.dumps(made)  # they travel to the worker in its request
        except (TypeError, ValueError):
            synthetic_instead(mode, "the dataset's rows hold values JSON cannot carry to the probe's process "
                                    "(bytes, timestamps)", "keep such values out of the data file", notes)
            return None
        return made
    tokenizer = Tokenizer(recipe.tokenizer, need_chat=bool(recipe.messages_field))
    add_special = tokenizer.adds_special_tokens(recipe)
    return tuple(tuple({"input_ids": ids[:max_length]}
                       for ids in tokenizer.encode([row_text(rows[i], recipe, tokenizer) for i in batch], add_special))
                 for batch in picked)


def _why_not_real(spec: Spec, recipe: LengthRecipe) -> str | None:
    """Why the timed steps cannot run on the dataset's rows (None: they can)."""
    if spec.model.factory is not None:
        return None  # the worker checks the factory has a collate
    if recipe.counted or recipe.combined:
        return "a Hugging Face model needs text to tokenize, and the data's lengths are read from a field"
    if recipe.tokenizer is None:
        return "no tokenizer to make token ids of the rows (give `tokenizer:`)"
    return None


def pick_rows(lengths: np.ndarray, timing_batches: Sequence[Sequence[int]], max_length: int) -> list[list[int]]:
    """For each sample length of each batch, the index of a row that long once truncated at
    ``max_length``: the first in the file not yet taken, or, where none is left, the nearest in
    length, a shorter one before a longer (unreadable rows, ``BAD``, are never taken)."""
    cut = np.where(lengths == BAD, -(10**9), np.minimum(lengths, max_length))
    exact: dict[int, list[int]] = {}  # per length, its rows not yet taken, last in the file first
    taken: set[int] = set()
    picked: list[list[int]] = []
    for batch in timing_batches:
        chosen = []
        for length in batch:
            left = exact.setdefault(length, np.flatnonzero(cut == length)[::-1].tolist())
            while left and left[-1] in taken:
                left.pop()
            if left:
                index = left.pop()
            else:  # rare: no row of this length is left; the nearest, a shorter one first (a slow pass, once)
                order = [int(i) for i in np.lexsort((np.abs(cut - length), cut > length)) if lengths[i] != BAD]
                index = next((i for i in order if i not in taken), order[0])
            taken.add(index)
            chosen.append(index)
        picked.append(chosen)
    return picked


_READ: dict[tuple[str, str, str], dict[int, Any]] = {}
"""The rows read so far, per data file (its fingerprint: changed, it is read again): a tune's
probes want mostly the same rows, each read once."""


def _read_rows(path: str, fmt: str, wanted: set[int]) -> dict[int, Any]:
    """The rows at ``wanted`` indices: those not read before, in one pass that stops at the last of them."""
    rows = _READ.setdefault((path, fmt, fingerprint(path)), {})
    missing = wanted - rows.keys()
    last = max(missing, default=-1)
    for index, row in iter_rows(path, fmt) if missing else ():
        if index in missing and not isinstance(row, BadRow):
            rows[index] = row
        if index >= last:
            break
    missing = wanted - rows.keys()
    if missing:
        raise TrainfitError(f"{path}: rows {sorted(missing)[:5]} could not be read back for the probe",
                            "the data changed since it was analyzed: run `trainfit analyze` again (--no-cache)")
    return rows
