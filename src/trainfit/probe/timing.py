"""When to stop timing: the stated stability criterion and the summary of step times.

Timed steps run in cycles over the ``cycle`` timed shapes, one step each (one shape when padding
is fixed: every step then has the same shape; see probe/estimate.py). Criterion: after at least ``min_steps``
steps and two whole cycles, stop when the 95% confidence half-width (Student's t) of the mean
*cycle* time is at most ``target_rel_ci`` of that mean; otherwise stop at ``max_steps`` or
``max_seconds`` (and say the estimate is not stable). Comparing whole cycles separates machine
noise from the genuine cost differences between batches of different lengths.
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
    """95% CI half-width of the mean of ``times`` as a share of the mean (inf for < 2 values)."""
    if len(times) < 2:
        return math.inf
    mean = statistics.fmean(times)
    return t95(len(times) - 1) * statistics.stdev(times) / math.sqrt(len(times)) / mean


def cycle_times(times: Sequence[float], cycle: int) -> list[float]:
    """Total time of each complete cycle of ``cycle`` consecutive steps."""
    return [sum(times[i:i + cycle]) for i in range(0, len(times) - cycle + 1, cycle)]


@dataclass(frozen=True)
class StopRule:
    min_steps: int
    max_steps: int
    max_seconds: float
    target_rel_ci: float
    cycle: int = 1

    def done(self, times: Sequence[float]) -> tuple[bool, bool]:
        """(stop now?, stable?) after the steps timed so far."""
        n = len(times)
        cycles = cycle_times(times, self.cycle)
        stable = n >= self.min_steps and len(cycles) >= 2 and n % self.cycle == 0 \
            and relative_ci95(cycles) <= self.target_rel_ci
        if stable:
            return True, True
        return n >= self.max_steps or (n >= 2 and sum(times) >= self.max_seconds), False


@dataclass(frozen=True)
class StepTimes:
    median: float
    mean: float
    std: float
    ci95_rel: float
    """95% CI half-width of the mean, from whole cycles when there are two or more."""
    total: float
    n: int

    @classmethod
    def of(cls, times: Sequence[float], cycle: int = 1) -> StepTimes:
        cycles = cycle_times(times, cycle)
        return cls(median=statistics.median(times), mean=statistics.fmean(times),
                   std=statistics.stdev(times) if len(times) > 1 else 0.0,
                   ci95_rel=relative_ci95(cycles if len(cycles) >= 2 else times),
                   total=float(sum(times)), n=len(times))
