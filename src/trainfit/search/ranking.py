"""Which measured configs are best: the order every output and the search's own stop rules read."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from trainfit.probe.measurement import Measurement
from trainfit.search.strategies import Trial, config_key, jsonable

Repeats = Mapping[str, Sequence[Measurement]]
"""Confirmation measurements by config key (see ``tune.confirm_rounds``)."""


def pooled(t: Trial, repeats: Repeats, objective: str) -> float:
    """The trial's objective, or with confirmation repeats the median over all its measurements."""
    again = [getattr(m, objective) for m in repeats.get(config_key(t.values), ()) if m.fits]
    return statistics.median([t.measured_objective, *again]) if again else t.measured_objective


def ranked(trials: Sequence[Trial], repeats: Repeats | None = None, objective: str = "samples_per_second"
           ) -> list[Trial]:
    """Feasible trials, fastest first (ties: less memory first); confirmed configs by their median."""
    ok = [t for t in trials if t.feasible and t.objective is not None]
    return sorted(ok, key=lambda t: (-pooled(t, repeats or {}, objective), t.measurement.peak_memory_bytes or 0))


def within_noise(order: Sequence[Trial]) -> list[dict[str, Any]]:
    """Runners-up the probes cannot tell apart from the best: the runner-up's step is no longer
    than the two probes' 95% confidence half-widths of the step time together allow. Both are
    reported as fractions of the best's objective: ``gap`` how much slower the runner-up
    measured, ``noise`` how much slower the intervals let it measure while being as fast."""
    if not order or order[0].measured_objective <= 0:
        return []
    best = order[0]
    out = []
    for t in order[1:6]:
        gap = 1 - t.measured_objective / best.measured_objective
        step_ci = (best.measurement.step_time_ci95_rel or 0.0) + (t.measurement.step_time_ci95_rel or 0.0)
        noise = 1 - 1 / (1 + step_ci)
        if gap <= noise:
            out.append({"trial": t.number, "searched": jsonable(t.values),
                        "samples_per_second": t.measurement.samples_per_second, "gap": gap, "noise": noise})
    return out
