"""What a Hugging Face trainer prints, read: its progress bar's steps (stamped as they arrive), its
``train_runtime``, and the batches ``trainfit train --record-batches`` wrote (each epoch marked)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from trainfit.probe.timing import relative_ci95

_TRAIN_RUNTIME = re.compile(r"'train_runtime': '?([0-9.]+(?:[eE][+-]?[0-9]+)?)")
"""transformers' final metrics, printed by its progress callback as ``{'train_runtime': '44.17', ...}``:
each float formatted ``.4g``, so a run past 9,999 s reads ``'1.235e+04'``."""


_BAR = re.compile(r"^\s*\d+%\|[^|]*\|\s*(\d+)/(\d+) \[")
"""The trainer's own progress bar (tqdm, no description: the data-preparation bars have one)."""


EPOCH_MARK = "epoch"
"""The line ``trainfit train --record-batches`` writes where an epoch begins (``train.callbacks.BatchRecord``)."""


def parse_train_runtime(text: str) -> float | None:
    """TRL's ``train_runtime`` (s) in a run's output; None when it printed none (the last one wins)."""
    found = _TRAIN_RUNTIME.findall(text)
    return float(found[-1]) if found else None


def bar_step(segment: str, total: int) -> int | None:
    """The step a progress-bar ``segment`` (text between carriage returns) shows, if it is the
    trainer's bar for ``total`` steps."""
    shown = bar_position(segment)
    return shown[0] if shown is not None and shown[1] == total else None


def bar_position(segment: str) -> tuple[int, int] | None:
    """``(step, total)`` of a progress-bar ``segment`` without a description (the trainer's), else None."""
    match = _BAR.match(segment)
    return (int(match.group(1)), int(match.group(2))) if match else None


def shown_steps(arrivals: Mapping[int, float], after: int) -> list[tuple[int, float]]:
    """The (step, arrival) pairs the bar showed from step ``after`` on, in step order."""
    return sorted((n, t) for n, t in arrivals.items() if n >= after)


def bar_seconds_per_step(arrivals: Mapping[int, float], after: int) -> float | None:
    """Seconds per step from the progress bar's first shown step at or after ``after`` to its last
    shown (``arrivals``: ``{step: seconds}``); None with fewer than two shown. A step whose update
    tqdm skipped (under its 0.1 s refresh) shows with the next one; the last at the latest when the
    bar closes, as the trainer ends, a few milliseconds after the step."""
    shown = shown_steps(arrivals, after)
    if len(shown) < 2:
        return None
    (n0, t0), (n1, t1) = shown[0], shown[-1]
    return (t1 - t0) / (n1 - n0)


def step_spread(long: Mapping[int, float], short: Mapping[int, float], short_steps: int) -> float:
    """``Calibration.spread_rel`` from the two runs' step arrivals (``{step: seconds}``; see there)."""
    def per_step(arrivals: Mapping[int, float], after: int) -> list[float]:
        return [(t1 - t0) / (n1 - n0) for (n0, t0), (n1, t1) in itertools.pairwise(shown_steps(arrivals, after))]

    samples = per_step(long, short_steps)
    if len(samples) < 2:
        samples = per_step(long, 1) + per_step(short, 1)
    return relative_ci95(samples)


def recorded_steps(text: str, accumulation: int) -> list[list[int]]:
    """Each optimizer step's micro-batch lengths, in order, from a ``trainfit train
    --record-batches`` file: within an epoch ``accumulation`` a step, its last step the rest (as
    transformers' loop takes them). The batch accelerate collated ahead of the run's end makes a
    step past the last, never one before it."""
    steps: list[list[int]] = []
    for epoch in re.split(rf"^{EPOCH_MARK}$", text, flags=re.MULTILINE):
        lengths = [int(n) for n in epoch.split()]
        steps += [lengths[i:i + accumulation] for i in range(0, len(lengths), accumulation)]
    return steps

