"""Length statistics that drive memory (the longest batch) and time (all batches).

``LengthStats`` is the JSON contract between ``trainfit analyze`` and the probe, search and
planner: it carries the longest samples (for the worst-case batch) and a uniform sample of
lengths (for typical batches) besides the summary figures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from trainfit.data.lengths import LengthTable
from trainfit.data.row_length import BAD
from trainfit.json_record import check_schema

SCHEMA_VERSION = 1
PERCENTILES = (50.0, 90.0, 95.0, 99.0, 99.5, 99.9)
_SAMPLE_SIZE = 10_000
_LONGEST_KEPT = 64


def round_up(value: float, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= value (at least one multiple)."""
    return max(multiple, int(math.ceil(value / multiple) * multiple))


def padding_waste(lengths: np.ndarray, batch_size: int, pad_to: int | None, seed: int = 0) -> float:
    """Share of positions that are padding when random batches of ``batch_size`` are padded.

    ``pad_to=None`` pads each batch to its longest sample; an int pads (and truncates) every sample
    to that length.
    """
    if pad_to is not None:
        real = np.minimum(lengths, pad_to).sum()
        return float(1.0 - real / (len(lengths) * pad_to))
    order = np.random.default_rng(seed).permutation(len(lengths))
    shuffled = lengths[order]
    n_full = len(shuffled) // batch_size * batch_size
    padded = shuffled[:n_full].reshape(-1, batch_size).max(axis=1).sum() * batch_size
    if n_full < len(shuffled):
        tail = shuffled[n_full:]
        padded += tail.max() * len(tail)
    return float(1.0 - shuffled.sum() / padded)


def packing_waste(lengths: np.ndarray, pack_to: int) -> float:
    """Share of padding when all samples are concatenated into rows of ``pack_to`` positions."""
    total = int(lengths.sum())
    return float(1.0 - total / (math.ceil(total / pack_to) * pack_to))


@dataclass(frozen=True, kw_only=True)
class LengthStats:
    """Summary of a dataset's sample lengths, in positions (tokens or scaled length units)."""

    source: str
    source_fingerprint: str
    description: str
    samples: int
    bad_rows: int
    total: int
    min: int
    mean: float
    max: int
    percentiles: dict[str, float]
    longest: list[dict[str, int]]
    """The longest samples, longest first: ``{"row": index, "length": n}``."""
    recommended_max_length: int
    recommended_rule: str
    truncated_share: float
    """Share of samples longer than ``recommended_max_length``."""
    batch_size: int
    waste: dict[str, float]
    """Padding share at ``batch_size``: pad to longest in batch, to the fixed length, packing."""
    histogram: dict[str, list[float]]
    length_sample: list[int]
    """Up to 10,000 lengths drawn uniformly (seeded) for typical batches."""
    approximate: bool = False
    """Counted without a tokenizer (regex word pieces): not the lengths training will see."""
    over_max_positions: int | None = None
    max_positions: int | None = None
    bad_examples: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    parts: dict[str, dict[str, float]] = field(default_factory=dict)
    """Text and audio both: each part's ``p50``, ``p99`` and ``max`` over the samples (the lengths
    above are made of them, ``LengthRecipe.length_by``)."""
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LengthStats:
        check_schema(d, SCHEMA_VERSION, "the length analysis", "re-run `trainfit analyze` with this version")
        return cls(**d)

    def headline(self) -> str:
        """One line: how many samples, how long, and how the lengths were counted."""
        return (f"{self.samples:,} samples, lengths {self.min:,}-{self.max:,} (median {self.percentiles['p50']:,.0f}, "
                f"p99 {self.percentiles['p99']:,.0f}): {self.description}")

    def truncation_length(self, max_length: int | None) -> int:
        """The length samples are cut to: ``max_length`` (None: the longest sample), never past the
        model's positions. What the probe measures and the training command is told."""
        length = self.max if max_length is None else max_length
        return min(length, self.max_positions) if self.max_positions else length

    def padding_share(self, batch_size: int, max_length: int | None) -> float:
        """Share of positions that are padding in random batches of ``batch_size``, each padded to its
        longest sample, the samples cut at :meth:`truncation_length` (from :attr:`length_sample`)."""
        cut = self.truncation_length(max_length)
        return padding_waste(np.minimum(np.asarray(self.length_sample or [self.max]), cut), batch_size, None)

    def longest_lengths(self, n: int) -> list[int]:
        """The ``n`` longest lengths (the longest repeated when the dataset is smaller than ``n``)."""
        kept = [x["length"] for x in self.longest] or [self.max]
        return [kept[i] if i < len(kept) else kept[0] for i in range(n)]


def summarize(
    table: LengthTable,
    *,
    percentile: float = 99.5,
    multiple: int = 256,
    batch_size: int = 8,
    top: int = 10,
    max_positions: int | None = None,
    bins: int = 20,
    seed: int = 0,
) -> LengthStats:
    """Statistics of ``table``'s valid lengths (see :class:`LengthStats`)."""
    rows = np.arange(len(table.lengths))
    ok = table.lengths != BAD
    lengths = table.lengths[ok].astype(np.int64)
    rows = rows[ok]
    pct = {f"p{p:g}": float(np.percentile(lengths, p, method="linear")) for p in PERCENTILES}
    recommended = round_up(float(np.percentile(lengths, percentile, method="linear")), multiple)
    capped = False
    if max_positions is not None and recommended > max_positions:
        recommended, capped = max_positions, True
    # Longest first; ties broken by row index so the result is deterministic.
    order = np.lexsort((rows, -lengths))[: max(top, _LONGEST_KEPT)]
    longest = [{"row": int(rows[i]), "length": int(lengths[i])} for i in order]
    hi = max(float(pct["p99.9"]), float(lengths.min()) + 1)
    counts, edges = np.histogram(np.minimum(lengths, hi), bins=bins, range=(float(lengths.min()), hi))
    rng = np.random.default_rng(seed)
    sample = lengths if len(lengths) <= _SAMPLE_SIZE else rng.choice(lengths, _SAMPLE_SIZE, replace=False)
    return LengthStats(
        source=table.source,
        source_fingerprint=table.source_fingerprint,
        description=table.description,
        approximate=table.approximate,
        samples=int(len(lengths)),
        bad_rows=table.bad_rows,
        total=int(lengths.sum()),
        min=int(lengths.min()),
        mean=float(lengths.mean()),
        max=int(lengths.max()),
        percentiles=pct,
        longest=longest,
        recommended_max_length=recommended,
        recommended_rule=f"p{percentile:g} rounded up to a multiple of {multiple}"
        + (f", capped at the model's {max_positions} positions" if capped else ""),
        truncated_share=float((lengths > recommended).mean()),
        batch_size=batch_size,
        waste={
            "pad_to_longest_in_batch": padding_waste(lengths, batch_size, None, seed),
            "pad_to_fixed_length": padding_waste(lengths, batch_size, recommended),
            "packing": packing_waste(lengths, recommended),
        },
        histogram={"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]},
        length_sample=[int(x) for x in sample],
        over_max_positions=int((lengths > max_positions).sum()) if max_positions is not None else None,
        max_positions=max_positions,
        bad_examples=table.bad_examples,
        notes=list(table.notes),
        parts={name: {"p50": float(np.percentile(part[ok], 50)), "p99": float(np.percentile(part[ok], 99)),
                      "max": float(part[ok].max())} for name, part in table.parts.items()},
    )


def count_longer_than(stats: LengthStats, limit: int) -> tuple[int, bool]:
    """(number of samples longer than ``limit``, exact?). Estimated from the length sample when
    the dataset is larger than the sample and more than the kept longest exceed the limit."""
    over_kept = sum(1 for x in stats.longest if x["length"] > limit)
    if over_kept < len(stats.longest) or stats.samples <= len(stats.longest):
        return over_kept, True
    if stats.samples <= len(stats.length_sample):
        return sum(1 for n in stats.length_sample if n > limit), True
    share = sum(1 for n in stats.length_sample if n > limit) / len(stats.length_sample)
    return max(over_kept, round(share * stats.samples)), False
