"""The batches of a packed epoch (``packing: true``), from the sample lengths alone.

What is reproduced, read in trl 1.16.0 (the version installed here): ``packing=True`` with the
default ``packing_strategy="bfd"`` (``sft_trainer.py`` l. 1466-1480) rewrites the tokenized dataset
before any sampling: ``pack_dataset`` (``trl/data_utils.py`` ``_pack_bfd``) drops empty samples,
truncates each to ``max_length``, sorts them longest first and puts each into the bin whose free
space fits it most tightly (best fit decreasing; among bins with the same free space, the one that
reached it first), opening a bin where none has room. It packs through ``datasets``' ``map(...,
batched=True)``, whose default batch is 1,000 rows: each run of 1,000 consecutive samples is packed
on its own (:data:`TRL_CHUNK`), which leaves a part-filled row per chunk. The bins are the dataset's rows from then on:
the Trainer's ``RandomSampler`` (or its length-grouped sampler, by the rows' lengths) orders them
and the DataLoader cuts batches of ``per_device_train_batch_size`` rows. ``bfd`` turns
``padding_free`` on (l. 916): the collator concatenates a batch's rows into one row of all their
positions, each sample's ``position_ids`` restarting at 0, padded only up to
``pad_to_multiple_of`` (l. 187-218), so a micro-batch is a ``(1, total)`` tensor.
:func:`pack_bfd` is checked against TRL's own ``pack_dataset`` in the tests.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque

import numpy as np

from trainfit.data.batching import EpochBatches, length_grouped_order

TRL_CHUNK = 1000
"""The samples ``pack_dataset`` packs at a time: ``datasets``' default ``map`` batch size."""


def pack_bfd(lengths: np.ndarray, max_length: int, chunk: int | None = TRL_CHUNK) -> list[list[int]]:
    """TRL's best-fit-decreasing packing of samples this long (truncated to ``max_length``) into rows
    of at most ``max_length`` positions, ``chunk`` consecutive samples at a time (None: all at once):
    each row as the indices of its samples, rows in the order they were opened. Empty samples are
    left out, as TRL drops them."""
    cut = np.minimum(np.asarray(lengths, dtype=np.int64), max_length)
    if chunk is not None and cut.size > chunk:
        return [[start + i for i in row] for start in range(0, cut.size, chunk)
                for row in pack_bfd(cut[start:start + chunk], max_length, None)]
    rows: list[list[int]] = []
    spaces: list[int] = []  # the distinct free spaces (below max_length) some row has, ascending
    with_space: dict[int, deque[int]] = defaultdict(deque)  # free space -> rows with it, first reached first
    for index in np.argsort(-cut, kind="stable").tolist():
        n = int(cut[index])
        if n == 0:
            continue
        at = bisect.bisect_left(spaces, n)
        if at < len(spaces):  # the tightest row it fits
            space = spaces[at]
            row = with_space[space].popleft()
            if not with_space[space]:
                del spaces[at]
        else:
            space, row = max_length, len(rows)
            rows.append([])
        rows[row].append(index)
        left = space - n
        if left > 0:
            if not with_space[left]:
                bisect.insort(spaces, left)
            with_space[left].append(row)
    return rows


def packed_epoch(lengths: np.ndarray, batch_size: int, *, max_length: int, seed: int = 0,
                 group_by_length: bool = False, gradient_accumulation_steps: int = 1,
                 multiple: int | None = None, drop_last: bool = False) -> EpochBatches:
    """The batches one epoch of packed rows yields: :func:`pack_bfd`'s rows in a seeded random
    order (or length-grouped by the rows' lengths, as transformers' sampler groups them), cut into
    batches of ``batch_size`` rows, each one padding-free row of its samples' positions rounded up
    to ``multiple`` (``pad_to_multiple_of``; None: none). ``rows`` counts each batch's samples,
    ``packed_rows`` its packed rows, ``padded_length`` its one row's positions."""
    if batch_size < 1 or max_length < 1 or (multiple is not None and multiple < 1):
        raise ValueError(f"batch_size, max_length and multiple must be >= 1, got {batch_size}, {max_length}, "
                         f"{multiple}")
    cut = np.minimum(np.asarray(lengths, dtype=np.int64), max_length)
    rows = pack_bfd(cut, max_length)
    if not rows:
        raise ValueError("no sample to pack: every length is 0")
    row_lengths = np.array([int(cut[r].sum()) for r in rows], dtype=np.int64)
    permutation = np.random.default_rng(seed).permutation(len(rows))
    order = (length_grouped_order(row_lengths, permutation, batch_size * gradient_accumulation_steps)
             if group_by_length else permutation)
    kept = len(order) // batch_size * batch_size if drop_last else len(order)
    if kept == 0:
        raise ValueError(f"drop_last with {len(order)} packed rows and batch_size {batch_size} leaves no batch")
    batches = [order[i:min(i + batch_size, kept)] for i in range(0, kept, batch_size)]
    samples = np.array([sum(len(rows[r]) for r in b) for b in batches], dtype=np.int64)
    real = np.array([int(row_lengths[b].sum()) for b in batches], dtype=np.int64)
    padded = real if multiple is None else -(-real // multiple) * multiple
    visited = np.array([i for b in batches for r in b for i in rows[r]], dtype=np.int64)
    return EpochBatches(rows=samples, padded_length=padded, real_tokens=real, order=visited,
                        packed_rows=np.array([len(b) for b in batches], dtype=np.int64))
