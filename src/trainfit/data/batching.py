"""The batches one training epoch really sees: their shapes, from the sample lengths alone.

A config's speed over an epoch is the sum of its step times over the epoch's batch shapes, and those
shapes come from the trainer's sampler and collator, not from the configured length. This module
simulates them with numpy, fast enough for a million samples (no Python loop per batch, none per
megabatch), so a cost model can be summed over the distinct ``(rows, padded length)`` shapes.

What is reproduced, read in transformers 5.24.0 and trl 1.16.0 (the versions installed here):

* Random order: ``Trainer._get_train_sampler`` returns a ``RandomSampler`` (transformers
  ``trainer.py`` l. 1144-1145) and the ``DataLoader`` cuts its order into consecutive batches of
  ``per_device_train_batch_size``, dropping the short last one under ``dataloader_drop_last``
  (l. 1045). Here the permutation is numpy's, seeded, not torch's: the figures represent the
  distribution of shapes, they do not replay a run's order.
* Length grouping: ``train_sampling_strategy="group_by_length"`` (``training_args.py`` l. 1380; the
  4.x ``group_by_length=True`` argument is refused by 5.24 with a ``TypeError``) makes the Trainer
  build ``LengthGroupedSampler(train_batch_size * gradient_accumulation_steps, ...)`` (``trainer.py``
  l. 1088-1105): the sampler groups with the *accumulated* batch, the DataLoader still cuts batches
  of ``per_device_train_batch_size``. The sampler calls ``get_length_grouped_indices``
  (``trainer_pt_utils.py`` l. 484-516): ``mega_batch_mult = min(n // (batch_size * 4), 50)``, 1 if
  that is 0; a random permutation cut into megabatches of ``mega_batch_mult * batch_size``; each
  megabatch sorted by length, longest first (Python's ``sorted(..., reverse=True)``, stable: ties
  keep the permutation's order); then the first element of the megabatch holding the longest sample
  (``torch.argmax``: the first such megabatch) swaps places with the first element of megabatch 0,
  so the longest sample opens the epoch and an OOM shows at once. :func:`length_grouped_order` does
  exactly this on a given permutation (a test compares it with transformers' own function).
  The sampler groups by the lengths the dataset holds; trainers truncate while preparing the
  dataset (TRL: ``sft_trainer.py`` l. 1436-1456), so the lengths grouped here are the truncated ones.
* TRL's ``SFTTrainer`` has no sampler of its own: neither it nor ``_BaseTrainer`` overrides
  ``_get_train_sampler`` (only the GRPO/RLOO trainers and some experimental ones do), so
  ``group_by_length`` behaves as in the Trainer above. Its collator
  (``DataCollatorForLanguageModeling``, ``sft_trainer.py`` l. 168-228) pads each batch to its
  longest sample, rounded up to ``pad_to_multiple_of`` (``trl/trainer/utils.py`` ``pad``).
* Not simulated, by design: ``padding_free=True`` (``sft_trainer.py`` l. 916, 187-218) concatenates
  each batch into one row of ``sum(lengths)`` positions (rounded up to ``pad_to_multiple_of``) with
  per-sequence ``cu_seq_lens`` for the varlen attention kernels; a ``(1, sum)`` shape would misstate
  the attention cost, which stays per sequence. ``packing=True`` (``sft_trainer.py`` l. 1466-1480,
  ``trl/data_utils.py`` ``pack_dataset``: ``bfd`` best-fit decreasing, ``bfd_split``, ``wrapped``)
  rewrites the dataset into rows of at most ``max_length`` *before* sampling, and with ``bfd``
  turns padding-free on (l. 916): simulate packing by passing the packed rows' lengths, not the
  samples' (``data/packing.py`` does). Multi-GPU sharding of batches across ranks is not simulated either (one device).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Padding = Literal["longest", "max_length"]
PADDINGS: tuple[str, ...] = ("longest", "max_length")

MEGA_BATCH_MULT = 50
"""transformers' default cap on the megabatch size, in batches (``get_length_grouped_indices``)."""
MIN_MEGABATCHES = 4
"""transformers shrinks megabatches until there are at least this many (when the data allows)."""


@dataclass(frozen=True, kw_only=True, eq=False)
class EpochBatches:
    """The batches of one epoch, in the order the trainer yields them; one entry per batch.

    The arrays are read-only: the record is as frozen as its fields.
    """

    rows: np.ndarray
    """Samples in each batch (int64): the batch size, smaller for a short last batch."""
    padded_length: np.ndarray
    """Positions each row of the batch is padded to (int64): the batch's sequence dimension."""
    real_tokens: np.ndarray
    """Real (non-padding) positions in each batch (int64), after truncation to ``max_length``."""
    order: np.ndarray
    """The samples the epoch trains on, as indices into the lengths, in the order it visits them
    (int64, ``samples`` long): batch ``i`` is the next ``rows[i]`` of them."""
    packed_rows: np.ndarray | None = None
    """Under packing (``data.packing.packed_epoch``): the packed rows in each batch (int64), which
    the collator flattens into one padding-free row of ``padded_length`` positions; None: each
    batch is ``rows`` rows of ``padded_length``."""

    def __post_init__(self) -> None:
        for name in ("rows", "padded_length", "real_tokens", "order", *(("packed_rows",) if self.packed_rows is not None
                                                                           else ())):
            # An int64 copy made read-only: the caller's own arrays stay writable and unshared.
            array = np.array(getattr(self, name), dtype=np.int64)
            array.setflags(write=False)
            object.__setattr__(self, name, array)
        shapes = {self.rows.shape, self.padded_length.shape, self.real_tokens.shape}
        if len(shapes) != 1 or self.rows.ndim != 1:
            raise ValueError(f"rows, padded_length and real_tokens must be 1-D and equally long, got {shapes}")
        if self.order.shape != (int(self.rows.sum()),):
            raise ValueError(f"order must list the {int(self.rows.sum())} samples of the batches, got shape "
                             f"{self.order.shape}")

    @property
    def batches(self) -> int:
        """Number of batches (optimizer micro-steps) in the epoch."""
        return int(self.rows.size)

    @property
    def samples(self) -> int:
        """Samples the epoch trains on (fewer than the dataset under ``drop_last``)."""
        return int(self.rows.sum())

    @property
    def padded_positions(self) -> np.ndarray:
        """Positions each batch computes on, padding included: rows x padded length (int64); a packed
        batch's one row."""
        return self.padded_length.copy() if self.packed_rows is not None else self.rows * self.padded_length

    @property
    def total_real_tokens(self) -> int:
        """Real positions over the epoch."""
        return int(self.real_tokens.sum())

    @property
    def total_padded_positions(self) -> int:
        """Positions computed over the epoch, padding included."""
        return int(self.padded_positions.sum())

    @property
    def padding_share(self) -> float:
        """Share of the computed positions that are padding (0 when nothing is computed)."""
        padded = self.total_padded_positions
        return 0.0 if padded == 0 else 1.0 - self.total_real_tokens / padded

    def shape_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """The distinct batch shapes and how many batches have each.

        Returns ``(shapes, counts)``: ``shapes`` is an ``(k, 2)`` int64 array of ``(rows, padded
        length)`` pairs (a packed batch: 1 row) in ascending order, ``counts[i]`` the batches of shape ``shapes[i]``; a cost
        model priced per shape sums ``cost(shape) * count`` over ``k`` shapes instead of every batch.
        """
        # One int64 key per batch, rows major: np.unique on a 1-D key is several times faster than on pairs.
        stride = int(self.padded_length.max(initial=0)) + 1
        rows = np.ones_like(self.rows) if self.packed_rows is not None else self.rows  # a packed batch is one row
        keys, counts = np.unique(rows * stride + self.padded_length, return_counts=True)
        shapes = np.stack([keys // stride, keys % stride], axis=1)
        return shapes.astype(np.int64), counts.astype(np.int64)


def simulate_epoch(lengths: Sequence[int] | np.ndarray, batch_size: int, *, padding: Padding,
                   max_length: int | None, group_by_length: bool = False, seed: int = 0,
                   drop_last: bool = False, gradient_accumulation_steps: int = 1,
                   pad_to_multiple_of: int | None = None, shuffle: bool = True) -> EpochBatches:
    """The batches one epoch yields for these sample lengths under the Trainer's batching.

    Args:
        lengths: Each sample's length in positions (tokens), before truncation; 1-D, whole numbers >= 0.
        batch_size: Samples per batch on the device (``per_device_train_batch_size``).
        padding: ``"longest"`` pads each batch to its longest sample (the collators' default);
            ``"max_length"`` pads every batch to ``max_length``.
        max_length: Samples longer than this are truncated to it; None: no truncation (then
            ``padding`` must be ``"longest"``).
        group_by_length: Order samples as transformers' ``LengthGroupedSampler`` does (see the
            module docstring) instead of a plain random permutation.
        seed: Seed of numpy's permutation; the same seed gives the same permutation in both orders.
        drop_last: Drop the short last batch (``dataloader_drop_last``).
        gradient_accumulation_steps: Micro-batches per optimizer step. It changes nothing in random
            order; under ``group_by_length`` the Trainer groups with megabatches counted in
            ``batch_size * gradient_accumulation_steps`` samples.
        pad_to_multiple_of: Round every padded length up to a multiple of this (the collators'
            ``pad_to_multiple_of``); None: no rounding.
        shuffle: False: the samples in file order, as an evaluation pass reads them (the
            trainers' sequential sampler); ``group_by_length`` and ``seed`` then play no part.

    Raises:
        ValueError: on empty or non-integer lengths, a negative length, ``batch_size``,
            ``gradient_accumulation_steps``, ``max_length`` or ``pad_to_multiple_of`` below 1, an
            unknown ``padding``, ``"max_length"`` padding without ``max_length``, or ``drop_last``
            with fewer samples than one batch.
    """
    array = _checked_lengths(lengths)
    _check_batching(batch_size, padding, max_length, gradient_accumulation_steps, pad_to_multiple_of)
    if drop_last and array.size < batch_size:
        raise ValueError(f"drop_last with {array.size} samples and batch_size {batch_size} leaves no batch")
    if max_length is not None:
        array = np.minimum(array, max_length)
    permutation = np.random.default_rng(seed).permutation(array.size) if shuffle else np.arange(array.size)
    if group_by_length and shuffle:
        order = length_grouped_order(array, permutation, batch_size * gradient_accumulation_steps)
    else:
        order = permutation
    rows, longest, real_tokens = _per_batch(array[order], batch_size, drop_last)
    visited = order[:int(rows.sum())]  # drop_last leaves the short last batch's samples out
    if padding == "max_length" and max_length is not None:  # _check_batching refused it without max_length
        padded_length = np.full_like(rows, max_length)
    else:
        padded_length = longest
    if pad_to_multiple_of is not None:  # Params.padded_length's rule, over every batch at once
        padded_length = -(-padded_length // pad_to_multiple_of) * pad_to_multiple_of
    return EpochBatches(rows=rows, padded_length=padded_length, real_tokens=real_tokens, order=visited)


def length_grouped_order(lengths: np.ndarray, permutation: np.ndarray, batch_size: int,
                         mega_batch_mult: int | None = None) -> np.ndarray:
    """Sample indices in transformers' length-grouped order, from a given permutation.

    ``get_length_grouped_indices`` (transformers ``trainer_pt_utils.py``) with its
    ``torch.randperm`` replaced by ``permutation``: megabatches of ``mega_batch_mult * batch_size``
    consecutive entries of the permutation, each sorted by ``lengths`` longest first (ties in
    permutation order), then the longest sample swapped into first place. ``batch_size`` is the
    sampler's (the Trainer passes ``train_batch_size * gradient_accumulation_steps``);
    ``mega_batch_mult`` None: ``min(n // (batch_size * 4), 50)``, at least 1, as transformers.
    Returns an int64 array of indices into ``lengths``.
    """
    n = int(permutation.size)
    if mega_batch_mult is None:
        mega_batch_mult = max(1, min(n // (batch_size * MIN_MEGABATCHES), MEGA_BATCH_MULT))
    megabatch = mega_batch_mult * batch_size
    permuted = np.asarray(permutation, dtype=np.int64)
    keys = -np.asarray(lengths, dtype=np.int64)[permuted]  # ascending stable sort on -length = longest first
    full = n // megabatch * megabatch
    # Whole megabatches sort as the rows of one matrix; the short last one on its own.
    head = np.argsort(keys[:full].reshape(-1, megabatch), axis=1, kind="stable")
    head += np.arange(0, full, megabatch)[:, None]
    tail = full + np.argsort(keys[full:], kind="stable")
    order = permuted[np.concatenate([head.ravel(), tail])]
    # Each megabatch now opens with its longest sample; move the overall longest to the very front.
    starts = np.arange(0, n, megabatch)
    longest_megabatch = int(np.argmax(-keys[np.concatenate([head[:, 0], tail[:1]])]))
    first, other = 0, int(starts[longest_megabatch])
    order[first], order[other] = order[other], order[first]
    return order


def _per_batch(ordered: np.ndarray, batch_size: int, drop_last: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows, longest length and summed length of each consecutive batch of ``ordered`` lengths."""
    full = ordered.size // batch_size * batch_size
    grid = ordered[:full].reshape(-1, batch_size)
    rows = np.full(grid.shape[0], batch_size, dtype=np.int64)
    longest = grid.max(axis=1, initial=0)
    real = grid.sum(axis=1)
    tail = ordered[full:]
    if tail.size and not drop_last:
        rows = np.append(rows, tail.size)
        longest = np.append(longest, tail.max())
        real = np.append(real, tail.sum())
    return rows, longest.astype(np.int64), real.astype(np.int64)


def _checked_lengths(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    array = np.asarray(lengths)
    if array.ndim != 1:
        raise ValueError(f"lengths must be 1-D (one length per sample), got shape {array.shape}")
    if array.size == 0:
        raise ValueError("lengths is empty: an epoch needs at least one sample")
    if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.floor(array)):
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu":
        raise ValueError(f"lengths must be whole numbers of positions, got dtype {array.dtype}")
    if array.min() < 0:
        raise ValueError(f"lengths must be >= 0, got {array.min()}")
    return array.astype(np.int64, copy=False)


def _check_batching(batch_size: int, padding: str, max_length: int | None, gradient_accumulation_steps: int,
                    pad_to_multiple_of: int | None) -> None:
    """All the problems with the batching arguments, reported together."""
    problems = []
    if batch_size < 1:
        problems.append(f"batch_size must be >= 1, got {batch_size}")
    if gradient_accumulation_steps < 1:
        problems.append(f"gradient_accumulation_steps must be >= 1, got {gradient_accumulation_steps}")
    if max_length is not None and max_length < 1:
        problems.append(f"max_length must be >= 1 or None, got {max_length}")
    if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
        problems.append(f"pad_to_multiple_of must be >= 1 or None, got {pad_to_multiple_of}")
    if padding not in PADDINGS:
        problems.append(f"padding must be one of {PADDINGS}, got {padding!r}")
    elif padding == "max_length" and max_length is None:
        problems.append("padding='max_length' needs max_length (the length every batch is padded to)")
    if problems:
        raise ValueError("; ".join(problems))
