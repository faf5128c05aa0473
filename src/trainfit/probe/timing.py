"""When to stop timing: the stated stability criterion and the summary of step times.

Timed steps run in cycles over the ``cycle`` timed shapes, one step each (one shape when padding
is fixed: every step then has the same shape; see probe/estimate.py). Criterion: after at least ``min_steps``
steps and two whole cycles, stop when the 95% confidence half-width (Student's t) of the mean
*cycle* time is at most ``target_rel_ci`` of that mean; otherwise stop at ``max_steps`` or
``max_seconds`` (and say the estimate is not stable). Comparing whole cycles separates machine
noise from the genuine cost differences between batches of different lengths; with fewer than two
whole cycles, the repeats of each shape do (:func:`shape_repeats_ci95`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Two-sided 95% Student t quantiles for 1..30 degrees of freedom; 1.96 beyond.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042)


def t95(dof: int) -> float:
    return _T95[dof - 1] if 1 <= dof <= len(_T95) else 1.96


def relative_ci95(times: Sequence[float]) -> float:
    """95% CI half-width of the mean of ``times`` as a share of the mean (inf for < 2 values, or a
    mean of 0: times that all arrived at once, which say nothing of their spread)."""
    if len(times) < 2:
        return math.inf
    mean = statistics.fmean(times)
    if mean <= 0:
        return math.inf
    return t95(len(times) - 1) * statistics.stdev(times) / math.sqrt(len(times)) / mean


def cycle_times(times: Sequence[float], cycle: int) -> list[float]:
    """Total time of each complete cycle of ``cycle`` consecutive steps."""
    return [sum(times[i:i + cycle]) for i in range(0, len(times) - cycle + 1, cycle)]


def shape_repeats_ci95(times: Sequence[float], cycle: int) -> float:
    """95% CI half-width of a cycle's time (the sum of its shapes' mean step times) as a share of it,
    from the repeats of each shape alone (step ``i`` is of shape ``i % cycle``): the spread of a
    shape's repeats around their mean, pooled over the shapes (relative, Student's t on the pooled
    degrees of freedom), carried to the sum of the shapes' means. A cycle's steps differ by design
    (a batch of 1,024 positions is slower than one of 76), which the spread of all steps would call
    noise (+-127% where each shape's repeats agreed within 3%: +-3.3% by them). inf where no shape was timed twice."""
    groups = [list(times[shape::cycle]) for shape in range(cycle)]
    repeated = [g for g in groups if len(g) >= 2]
    dof = sum(len(g) - 1 for g in repeated)
    if dof == 0:
        return math.inf
    pooled = math.sqrt(sum((t / statistics.fmean(g) - 1) ** 2 for g in repeated for t in g) / dof)
    means = [(statistics.fmean(g), len(g)) for g in groups if g]
    spread = math.sqrt(sum(mean**2 / n for mean, n in means))  # the sum of means' std, per unit of relative noise
    return t95(dof) * pooled * spread / sum(mean for mean, _ in means)


@dataclass(frozen=True)
class StopRule:
    min_steps: int
    max_steps: int
    max_seconds: float
    target_rel_ci: float
    cycle: int = 1

    def done(self, times: Sequence[float], waits: Sequence[float] = ()) -> tuple[bool, bool]:
        """(stop now?, stable?) after the steps timed so far; ``max_seconds`` bounds their time and
        their ``waits`` for data together (a loader-bound probe waits as long as it steps)."""
        n = len(times)
        cycles = cycle_times(times, self.cycle)
        stable = n >= self.min_steps and len(cycles) >= 2 and n % self.cycle == 0 \
            and relative_ci95(cycles) <= self.target_rel_ci
        if stable:
            return True, True
        return n >= self.max_steps or (n >= 2 and sum(times) + sum(waits) >= self.max_seconds), False


@dataclass(frozen=True)
class StepTimes:
    median: float
    mean: float
    std: float
    ci95_rel: float
    """95% CI half-width of the mean, from whole cycles when there are two or more, else from the
    repeats of each shape (:func:`shape_repeats_ci95`), else (no shape timed twice) the spread of
    every step, shapes and all: an upper bound, not a figure of the noise."""
    total: float
    n: int
    basis: str = "cycles"
    """What ``ci95_rel`` comes from: ``cycles``, ``repeats`` or ``steps`` (see :func:`_ci95`)."""

    @classmethod
    def of(cls, times: Sequence[float], cycle: int = 1) -> StepTimes:
        ci, basis = _ci95(times, cycle, cycle_times(times, cycle))
        return cls(median=statistics.median(times), mean=statistics.fmean(times),
                   std=statistics.stdev(times) if len(times) > 1 else 0.0, ci95_rel=ci,
                   total=float(sum(times)), n=len(times), basis=basis)


def _ci95(times: Sequence[float], cycle: int, cycles: Sequence[float]) -> tuple[float, str]:
    """:attr:`StepTimes.ci95_rel` of ``times``, whose whole cycles are ``cycles``, and its basis."""
    if len(cycles) >= 2:
        return relative_ci95(cycles), "cycles"
    repeats = shape_repeats_ci95(times, cycle)
    return (repeats, "repeats") if math.isfinite(repeats) else (relative_ci95(times), "steps")
