"""When the run takes under half its window: what the time left over could buy, each with its own
ETA. Guide 002's rule: a run of under 6 hours in a 12-hour window could train more epochs, a longer
``max_length``, or the quality priority's config. Each is an option as a run that does not fit gets
(:class:`~trainfit.plan.options.Option`), which ``plan --apply N`` writes into the plan."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from trainfit.plan.choose import choose
from trainfit.plan.eta import Eta
from trainfit.plan.inputs import Candidate, Rebuilt, TuneRun
from trainfit.plan.options import Option, at_max_length, at_quantiles, basis_of, most_that_fit, options_to_fit

ROOM_SHARE = 0.5
"""A run whose ETA (its interval's high end) takes at most this share of the window has room to spare."""
LONGER_QUANTILES = (0.99, 1.0)
"""The longer ``max_length`` options: these quantiles of the data's lengths, rounded up to 64."""
MOST_EPOCHS = 1_000_000
"""Past any run (as :data:`trainfit.plan.MAX_EPOCHS`)."""


def most_epochs_offered(epochs: float) -> int:
    """The most epochs the more-epochs option offers: twice the asked, or 5 (guide 002: a small
    dataset trains 4-5 epochs), whichever is more."""
    return max(math.floor(2 * epochs), 5)


def plan_options(run: TuneRun, rebuilt: Rebuilt | None, chosen: Candidate, samples: int, epochs: float, total: int,
                 window_s: float, eta: Callable[..., Eta]) -> list[Option]:
    """The plan's options: what would make a run that does not fit fit
    (:func:`~trainfit.plan.options.options_to_fit`), what a run with room to spare could buy
    (:func:`room_options`), else none."""
    run_eta = eta(chosen)
    if not run_eta.fits(window_s):
        return options_to_fit(run, rebuilt, chosen, samples, epochs, total, window_s, eta)
    return room_options(run, rebuilt, chosen, samples, epochs, total, window_s, eta) if has_room(run_eta, window_s) else []


def has_room(run: Eta, window_s: float) -> bool:
    """Does the run take at most :data:`ROOM_SHARE` of the window, at its interval's high end?"""
    return run.high_s <= window_s * ROOM_SHARE


def room_options(run: TuneRun, rebuilt: Rebuilt | None, chosen: Candidate, samples: int, epochs: float, total: int,
                 window_s: float, eta: Callable[..., Eta]) -> list[Option]:
    """What a run with room to spare could train instead, each still within the window: the quality
    priority's config, a longer ``max_length``, more epochs."""
    longer: list[Option] = []
    if rebuilt is not None and rebuilt.stats is not None:
        longer = longer_max_length(chosen, rebuilt, total, window_s, eta)
    quality = choose("quality", run.candidates, eta, window_s)
    return [o for o in (quality_config(chosen, quality, total, window_s, eta), *longer,
                        more_epochs(chosen, samples, epochs, window_s, eta)) if o is not None]


def quality_config(c: Candidate, pick: Candidate, total: int, window_s: float,
                   eta: Callable[[Candidate, int], Eta]) -> Option | None:
    """The quality priority's pick (the highest capacity whose run fits), where it is another config."""
    if pick.trial == c.trial or not (run := eta(pick, total)).fits(window_s):
        return None
    changed = ", ".join(f"{k}={v}" for k, v in pick.searched.items() if c.searched.get(k) != v)
    return Option(kind="quality_config", change=f"use {changed} (the quality priority's pick: the highest capacity "
                                                "whose run fits)",
                  cost=f"{run.total_s / eta(c, total).total_s:.2f}x the time; changes what is learned; peak "
                       f"{pick.peak_gb:.2f} GiB against {c.peak_gb:.2f} (trial {pick.trial})",
                  basis="its own probe", eta=run, trial=pick.trial, sets={"trial": pick.trial})


def longer_max_length(c: Candidate, rebuilt: Rebuilt, total: int, window_s: float,
                      eta: Callable[[Candidate, int], Eta]) -> list[Option]:
    """Longer ``max_length`` values (the data's 99th percentile and its longest, rounded up to 64)
    whose run fits, where ``max_length`` truncates samples today. Priced by the step cost fitted
    through the config's timed shapes, past the longest one timed; the memory of a longer worst case
    was not measured, so the option says to probe it first (``plan --apply`` refuses it)."""
    assert rebuilt.stats is not None
    lengths = np.asarray(rebuilt.stats.length_sample)
    spec = rebuilt.spec
    now = float(np.mean(lengths > c.max_length)) if len(lengths) else 0.0
    if not now:
        return []  # nothing is cut today: a longer max_length buys nothing
    options = []
    for q, length in at_quantiles(lengths, LONGER_QUANTILES):
        scaled = at_max_length(c, spec.params, lengths, spec.probe.seed, length, rebuilt.stats.samples) \
            if length > c.max_length else None
        if scaled is not None and scaled.step_time_s < c.step_time_s:  # a fit through noisy shapes, extrapolated:
            scaled = dataclasses.replace(scaled, step_time_s=c.step_time_s,  # longer is never faster
                                         samples_per_second=c.samples_per_second)
        if scaled is None or not (run := eta(scaled, total)).fits(window_s):
            continue
        cut = float(np.mean(lengths > length))
        options.append(Option(
            kind="longer_max_length", change=f"max_length {length} instead of {c.max_length}",
            cost=f"truncates {cut:.1%} of the samples instead of {now:.1%} (the {q:.0%} quantile of their lengths); "
                 f"its peak memory was not measured past {c.max_length} positions: probe it first "
                 f"(trainfit tune SPEC --set max_length={length})",
            basis="the chosen config's step cost fitted through its timed shapes, extrapolated past the longest one "
                  "timed (not probed)", eta=run, trial=c.trial, flags=f"--max_length {length}",
            sets={"max_length": length}))
    return options


def more_epochs(c: Candidate, samples: int, epochs: float, window_s: float,
                eta: Callable[[Candidate, int], Eta]) -> Option | None:
    """The most whole epochs past ``epochs`` whose run fits, up to :func:`most_epochs_offered` (a window
    far longer than the run would otherwise ask for thousands of passes, which overfit)."""
    low = math.floor(epochs) + 1
    high = max(low, min(MOST_EPOCHS, most_epochs_offered(epochs)))
    most = most_that_fit(lambda e: eta(c, samples * e).fits(window_s), low, high)
    if most is None:
        return None
    return Option(kind="more_epochs", change=f"train {most} epoch{'s' * (most != 1)} instead of {epochs:g}",
                  cost=f"{most / epochs:.2g}x the passes over the data (watch the eval loss: more passes can overfit)",
                  basis=basis_of(c), eta=eta(c, samples * most), trial=c.trial, flags=f"--num_train_epochs {most}",
                  sets={"epochs": most})
