"""A dataset described by numbers alone, for a plan before there is data (guide 002's first run:
``optimize_for_dataset(num_samples=8000, avg_tokens_per_sample=500, ...)``): the sample count and the
lengths as a mean, or as percentiles, turned into the length analysis a plan reads
(:class:`~trainfit.data.stats.LengthStats`), marked as your figures."""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from trainfit.data.lengths import LengthTable
from trainfit.data.stats import LengthStats, summarize
from trainfit.errors import TrainfitError

GIVEN = "your figures"
"""The ``source`` of a length analysis made from numbers (no data was counted)."""
SAMPLE = 10_000
"""Lengths drawn from the given distribution (as a data analysis keeps a uniform sample of this many)."""
FORMS = "a mean (500), or percentiles (p50=400,p90=900,p99=1500,max=2048)"


def parse_lengths(text: str) -> dict[str, float]:
    """``--lengths``: a mean (``500``), or ``KEY=VALUE`` pairs whose keys are ``pNN`` percentiles,
    ``min`` and ``max``; a clear error otherwise."""
    text = text.strip()
    try:
        return {"mean": _positive("the mean", float(text))}
    except ValueError:
        pass
    points: dict[str, float] = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = pair.partition("=")
        key = key.strip().lower()
        if not (re.fullmatch(r"p\d+(\.\d+)?", key) and 0 < float(key[1:]) < 100) and key not in ("min", "max"):
            raise TrainfitError(f"--lengths {text!r}: {key!r} is neither a percentile (p50, p99.5) nor min or max",
                                f"give {FORMS}")
        try:
            points[key] = _positive(key, float(value))
        except ValueError:
            raise TrainfitError(f"--lengths {text!r}: {key}={value!r} is not a number", f"give {FORMS}") from None
    if not points:
        raise TrainfitError(f"--lengths {text!r} gives no length", f"give {FORMS}")
    return points


def _positive(name: str, value: float) -> float:
    if not (np.isfinite(value) and value >= 1):
        raise TrainfitError(f"--lengths: {name} {value:g} is no length (at least 1 token)", f"give {FORMS}")
    return value


def given_stats(samples: int, lengths: dict[str, float]) -> LengthStats:
    """The length analysis of ``samples`` samples whose lengths are ``lengths`` (:func:`parse_lengths`):
    with a mean alone every sample is that long; with percentiles the lengths run linearly between
    them (below the lowest given, at it; above the highest, at it), ``SAMPLE`` drawn evenly."""
    if "mean" in lengths:
        drawn = np.full(min(samples, SAMPLE), round(lengths["mean"]), dtype=np.int64)
        words = f"{lengths['mean']:g} tokens each (your mean: no spread known)"
    else:
        quantile = {0.0 if k == "min" else 100.0 if k == "max" else float(k[1:]): v for k, v in lengths.items()}
        at = sorted(quantile)
        values = [quantile[q] for q in at]
        if any(b < a for a, b in zip(values, values[1:])):
            raise TrainfitError("--lengths: a higher percentile is shorter than a lower one "
                                f"({', '.join(f'{k}={v:g}' for k, v in lengths.items())})", f"give {FORMS}")
        n = min(samples, SAMPLE)
        drawn = np.rint(np.interp((np.arange(n) + 0.5) / n * 100, at, values)).astype(np.int64)
        words = f"lengths from your percentiles ({', '.join(f'{k}={v:g}' for k, v in lengths.items())})"
    table = LengthTable(lengths=drawn, description=words, source=GIVEN, source_fingerprint=GIVEN)
    stats = summarize(table)
    return dataclasses.replace(stats, samples=samples, total=int(round(stats.mean * samples)))
