"""Which measured configs are best: the order every output and the search's own stop rules read."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainfit.probe.measurement import Measurement
from trainfit.probe.request import Bar
from trainfit.search.trials import Trial, config_key, jsonable
from trainfit.space import EFFECTIVE_BATCH, SearchSpace, learning_key, learning_knobs

Repeats = Mapping[str, Sequence[Measurement]]
"""Confirmation measurements by config key (see ``tune.confirm_rounds``)."""

TrainerS = float | Callable[[Mapping[str, Any]], float]
"""The trainer's own cost per micro-batch (``tune --calibrate``): one for every config, or a config's
own by its whole config (``TrainerCost.per_micro_batch_for``)."""


def micro_batches(config: Mapping[str, Any]) -> int:
    """A config's micro-batches per optimizer step."""
    return int(config.get("gradient_accumulation_steps") or 1)


def with_trainer_cost(speed: float, m: Measurement, objective: str, trainer_s: TrainerS) -> float:
    """``speed`` (in ``objective``'s units: samples or tokens a second) of the config ``m``
    measured, once each of its optimizer steps also pays the trainer's own ``trainer_s`` seconds
    per micro-batch (``tune --calibrate``): a step's work over its time plus that cost."""
    trainer_s = trainer_s(m.config) if callable(trainer_s) else trainer_s
    measured = getattr(m, objective)
    if not trainer_s or not measured or not m.expected_step_time_s or speed <= 0:
        return speed
    work = measured * m.expected_step_time_s  # samples (or tokens) a step
    return work / (work / speed + trainer_s * micro_batches(m.config))


def pooled(t: Trial, repeats: Repeats, objective: str, trainer_s: TrainerS = 0.0) -> float:
    """The trial's objective, or with confirmation repeats the median over all its measurements;
    with the trainer's cost per micro-batch ``trainer_s`` added to its steps (see :func:`with_trainer_cost`)."""
    return with_trainer_cost(_median(t, repeats, objective, t.measured_objective), t.measurement, objective, trainer_s)


def probe_samples_per_second(t: Trial, repeats: Repeats) -> float:
    """The probe's own samples/s of the trial's config (the model's step alone): the median over
    its measurements when confirmed."""
    return _median(t, repeats, "samples_per_second", t.measurement.samples_per_second or 0.0)


def _median(t: Trial, repeats: Repeats, name: str, first: float) -> float:
    """``first`` (the trial's own ``name``), or the median of it and its confirmation repeats'."""
    again = [getattr(m, name) for m in repeats.get(config_key(t.values), ()) if m.fits]
    return statistics.median([first, *again]) if again else first


def ranked(trials: Sequence[Trial], repeats: Repeats | None = None, objective: str = "samples_per_second",
           trainer_s: TrainerS = 0.0) -> list[Trial]:
    """Feasible trials, fastest first (ties: less memory first); confirmed configs by their median;
    each step with the trainer's cost per micro-batch ``trainer_s`` added (``tune --calibrate``)."""
    ok = [t for t in trials if t.feasible and t.objective is not None]
    return sorted(ok, key=lambda t: (-pooled(t, repeats or {}, objective, trainer_s),
                                     t.measurement.peak_memory_bytes or 0))


def within_noise(order: Sequence[Trial], objective: str = "samples_per_second", trainer_s: TrainerS = 0.0
                 ) -> list[dict[str, Any]]:
    """Runners-up the probes cannot tell apart from the best: the runner-up's step is no longer
    than the two probes' 95% confidence half-widths of the step time together allow. Both are
    reported as fractions of the best's objective: ``gap`` how much slower the runner-up
    measured, ``noise`` how much slower the intervals let it measure while being as fast. The
    speeds are the trainer's where ``trainer_s`` (see :func:`ranked`) is given; a probe's interval is
    then a share of the longer step (the probe timed the model's step, not the trainer's cost)."""
    def speed(t: Trial, name: str = objective) -> float:
        value = t.measured_objective if name == objective else getattr(t.measurement, name) or 0.0
        return with_trainer_cost(value, t.measurement, name, trainer_s)

    def ci(t: Trial) -> float:
        share = speed(t) / t.measured_objective if t.measured_objective else 1.0
        return (t.measurement.step_time_ci95_rel or 0.0) * share

    if not order or speed(order[0]) <= 0:
        return []
    best = order[0]
    out = []
    for t in order[1:6]:
        gap = 1 - speed(t) / speed(best)
        step_ci = ci(best) + ci(t)
        noise = 1 - 1 / (1 + step_ci)
        if gap <= noise:
            out.append({"trial": t.number, "searched": jsonable(t.values),
                        "samples_per_second": speed(t, "samples_per_second"), "gap": gap, "noise": noise})
    return out


NOISY_SPREAD = 0.10
"""A median 95% CI (of the step time) of the unstable probes above this is worth a warning; below
it, the ranking's own 'as fast within measurement noise' list says what the noise blurs."""


def noise_warning(trials: Sequence[Trial]) -> str | None:
    """A line when most probes stopped at their cap, far from stable (a busy or throttled machine):
    the console's and the report page's."""
    ok = [t.measurement for t in trials if t.measurement.status == "ok" and t.measurement.slower_than is None]
    unstable = [m for m in ok if not m.stable]  # one cut short at a bar (slower_than) is ranked, not noisy
    if not ok or len(unstable) <= len(ok) / 2:
        return None
    spread = statistics.median(m.step_time_ci95_rel or 0.0 for m in unstable)
    if spread <= NOISY_SPREAD:
        return None
    return (f"noisy: {len(unstable)} of {len(ok)} probes reached probe.max_seconds or max_steps before their "
            f"estimate was stable (median ±{spread:.0%}, above probe.target_rel_ci): the machine is busy or its "
            "speed varies; raise probe.max_seconds, or use --confirm N to re-probe the leaders interleaved")


def bar_for(space: SearchSpace, history: Sequence[Trial], values: Mapping[str, Any], objective: str) -> Bar | None:
    """The bar a probe of ``values`` is timed against (:class:`~trainfit.probe.request.Bar`): the
    fastest feasible config measured with the same values of the knobs that change what is learned
    (:func:`~trainfit.space.learning_knobs`), so that a probe cut short at it could not have been the
    fastest config, nor the fastest of its value of such a knob. The effective batch is not one of
    them here: it is what a search over batch sizes without a target moves, the pick is the fastest
    of every batch, and a config cut short is still ranked, by its speed within its wider interval.
    None where no such config was measured, or its interval was not (a single step)."""
    knobs = [k for k in learning_knobs(space) if k != EFFECTIVE_BATCH]
    key = learning_key(space, values, knobs)
    rivals = [t for t in history if t.feasible and t.objective is not None and t.measurement.slower_than is None
              and t.measurement.step_time_ci95_rel is not None and learning_key(space, t.values, knobs) == key]
    if not rivals:
        return None
    best = max(rivals, key=lambda t: t.measured_objective)
    return Bar(trial=best.number, objective=objective, value=best.measured_objective,
               ci95_rel=best.measurement.step_time_ci95_rel or 0.0)
