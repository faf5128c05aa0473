"""Timed trainer steps priced against the probe's fitted step cost: the trainer's own time a step
(the calibration's figure), and whether its steps changed pace while it was timed."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from trainfit.probe.timing import relative_ci95
from trainfit.trainer.trainer_output import shown_steps

SEPARABLE_CV = 0.15
"""How much the expected time of a step must vary over the steps timed (coefficient of variation
across the bar's intervals) for :func:`own_step_time` to tell the trainer's own time from the
machine's drift: random-order and length-grouped batches of long-tailed data vary far more; fixed
padding not at all."""


MIN_INTERVALS = 8
"""The fewest progress-bar intervals :func:`own_step_time` fits two unknowns over: a 4-step
calibration on a loaded machine (seen while this was built) fitted -0.55 s where its steps took
0.94 s against a price of 0.24 s."""


@dataclass(frozen=True)
class Priced:
    """What the probe expected of the steps a calibration timed (see :func:`priced_steps`)."""

    model_step_s: float
    """The probe's expected time of those steps, per step."""
    spread_rel: float
    """The 95% relative half-width of each bar interval's time against its expected time."""
    own_step_s: float | None = None
    """The trainer's own time per step, told from the machine's drift (see :func:`own_step_time`);
    None where the steps' expected times vary too little to tell them apart."""
    pace_change_rel: float | None = None
    """The change of pace from the earlier half of the timed steps to the later (:func:`pace_change`)."""


def priced_steps(steps: Sequence[Sequence[int]], accumulation: int, arrivals: Mapping[int, float], after: int,
                 cost: Callable[[float], float], first_sight: float = 0.0) -> Priced | None:
    """The probe's expected time of the optimizer steps the progress bar timed (those of
    :func:`~trainfit.trainer.trainer_output.bar_seconds_per_step`: the first shown at or after ``after`` to the last shown), per step,
    the 95% relative half-width of the ratio of each bar interval's time to its expected time
    (``inf`` with fewer than two intervals), and the trainer's own time per step fitted over the
    intervals (:func:`own_step_time`). ``steps``: the padded lengths of the micro-batches each
    step trained (:func:`~trainfit.trainer.trainer_output.recorded_steps`; step ``n`` is ``steps[n - 1]``); ``cost``: an optimizer
    step's seconds at ``accumulation`` micro-batches of a padded length; ``first_sight``: what a
    padded length costs beyond that the first time the run meets it (``Measurement.first_sight_s``),
    added to the step that meets it (the run's steps before the timed ones count as met). None when
    fewer than two steps are shown or ``steps`` stops short of the last."""
    shown = shown_steps(arrivals, after)
    if len(shown) < 2 or len(steps) < shown[-1][0]:
        return None
    first = shown[0][0]
    seen = {length for step in steps[:first] for length in step}
    expected = []
    for k in range(first, shown[-1][0]):  # steps first+1 .. last
        new = set(steps[k]) - seen
        seen |= new
        expected.append(sum(cost(float(length)) for length in steps[k]) / accumulation + first_sight * len(new))
    intervals = [(t1 - t0, sum(expected[n0 - first:n1 - first]), n1 - n0)
                 for (n0, t0), (n1, t1) in itertools.pairwise(shown)]
    return Priced(sum(expected) / len(expected), relative_ci95([t / e for t, e, _ in intervals]),
                  own_step_time(intervals), pace_change([(t, e) for t, e, _ in intervals]))


PACE_CHANGE = 0.10
"""The least change of pace between the earlier and the later half of the timed steps that
:func:`pace_change` reports: on the test CPU the machine's drift moved a whole run's steps by 4-5%;
on an H200 a fresh process's steps 1-25 ran at 0.28 s and its steps 30-150 at 0.22 (docs/benchmarks.md)."""


def pace_change(intervals: Sequence[tuple[float, float]]) -> float | None:
    """How much slower (above 0) or faster (below 0) the later half of the progress bar's intervals
    ran than the earlier half, each half's seconds against the work it did (``intervals``, in order:
    ``(seconds, work)``, the work the probe's expected seconds of their batches, or their step count
    where unpriced). None with fewer than :data:`MIN_INTERVALS` intervals, or where the change is
    under :data:`PACE_CHANGE` or within the noise of the halves (the 95% half-widths of their
    intervals' seconds per unit of work, combined): the pace held as far as the steps can tell."""
    if len(intervals) < MIN_INTERVALS or any(work <= 0 for _, work in intervals):
        return None
    half = len(intervals) // 2
    early, late = intervals[:half], intervals[half:]

    def pace(part: Sequence[tuple[float, float]]) -> float:
        return sum(t for t, _ in part) / sum(w for _, w in part)

    if pace(early) <= 0:  # bar updates read in one chunk share a stamp: an early half of 0 s says nothing
        return None
    change = pace(late) / pace(early) - 1
    noise = math.hypot(relative_ci95([t / w for t, w in early]), relative_ci95([t / w for t, w in late]))
    return change if abs(change) >= PACE_CHANGE and abs(change) > noise else None


def own_step_time(intervals: Sequence[tuple[float, float, int]]) -> float | None:
    """The trainer's own seconds per step, from the bar's intervals (``(seconds, the probe's
    expected seconds of their steps, steps)``), fitted by least squares as ``seconds = drift x
    expected + own x steps``. A machine running slower (or faster) than when it was probed scales
    each step's time with its cost (``drift``); the trainer's own work costs the same each step
    (``own``). The difference of the totals alone reads drift as trainer cost: on the test VM the
    same config's steps ran up to 9% over their probe's cost minutes later, which the trainer's
    work on an 18M model (4.4-7.3 ms a step, fitted this way) does not explain
    (docs/benchmarks.md). None with fewer than :data:`MIN_INTERVALS` intervals, or where the
    expected time of a step varies less than :data:`SEPARABLE_CV` across them (fixed padding:
    every step costs the same, and drift and the trainer's time cannot be told apart)."""
    if len(intervals) < MIN_INTERVALS:
        return None
    per_step = [e / k for _, e, k in intervals]
    mean = sum(per_step) / len(per_step)
    spread = (sum((x - mean) ** 2 for x in per_step) / (len(per_step) - 1)) ** 0.5
    if mean <= 0 or spread / mean < SEPARABLE_CV:
        return None
    # Normal equations of t = d e + o k.
    see = sum(e * e for _, e, _ in intervals)
    sek = sum(e * k for _, e, k in intervals)
    skk = sum(k * k for _, _, k in intervals)
    ste = sum(t * e for t, e, _ in intervals)
    stk = sum(t * k for t, _, k in intervals)
    det = see * skk - sek * sek
    return None if det <= 0 else (see * stk - sek * ste) / det

