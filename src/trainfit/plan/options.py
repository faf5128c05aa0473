"""When the run does not fit its window: what would, each with its own ETA."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from trainfit.json_record import Record
from trainfit.params import KNOBS, Params
from trainfit.plan.eta import Eta, run_speed
from trainfit.plan.inputs import Candidate, Rebuilt, TuneRun
from trainfit.probe.estimate import epoch_speed, typical_mix
from trainfit.probe.measurement import first_sights_of

SHORTER_QUANTILES = (0.99, 0.95, 0.9)
"""The shorter ``max_length`` options: these quantiles of the data's lengths, rounded up to 64."""


@dataclass(frozen=True, kw_only=True)
class Option(Record):
    """One way to fit the window, with the ETA it would take and what it gives up."""

    kind: str
    """``fewer_epochs``, ``shorter_max_length``, ``subset`` or ``faster_config``."""
    change: str
    """What to change, in words a user acts on."""
    cost: str
    """What it gives up."""
    basis: str
    """What its ETA rests on."""
    eta: Eta
    trial: int | None
    """The measured config it starts from (None: a plan from the user's figure)."""
    flags: str = ""
    """The flags of the written ``trl sft`` command that make the change (empty: another config,
    whose own command applies)."""
    sets: dict[str, Any] = field(default_factory=dict)
    """What ``plan --apply`` changes in the plan: ``epochs``, ``max_length``, ``max_steps`` or
    ``trial`` (:mod:`trainfit.plan.apply`); empty in a plan written before it."""


def basis_of(c: Candidate) -> str:
    """What an option that keeps the chosen config rests on, in words: its probe, or the user's figure."""
    return "the chosen config's probe" if c.trial is not None else "your --throughput figure (nothing was probed)"


def fewer_epochs(c: Candidate, samples: int, epochs: float, window_s: float,
                 eta: Callable[[Candidate, int], Eta]) -> Option | None:
    """The most whole epochs whose run fits, when at least one does."""
    most = most_that_fit(lambda e: eta(c, samples * e).fits(window_s), 1, math.ceil(epochs) - 1)
    if most is None:
        return None
    return Option(kind="fewer_epochs", change=f"train {most} epoch{'s' * (most > 1)} instead of {epochs:g}",
                  cost=f"{1 - most / epochs:.0%} fewer passes over the data", basis=basis_of(c),
                  eta=eta(c, samples * most), trial=c.trial, flags=f"--num_train_epochs {most}", sets={"epochs": most})


def most_that_fit(fits: Callable[[int], bool], low: int, high: int) -> int | None:
    """The largest whole ``n`` from ``low`` to ``high`` for which ``fits(n)``, where it holds up to some
    ``n`` and not past it (a run's ETA grows with its length); None when ``fits(low)`` does not hold.
    A bisection: a few dozen prices however many epochs are asked (one price each took 18 s for a
    million)."""
    if high < low or not fits(low):
        return None
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if fits(mid) else (low, mid - 1)
    return low


def subset(c: Candidate, samples: int, epochs: float, window_s: float,
           eta: Callable[[Candidate, int], Eta]) -> Option | None:
    """The largest share of the dataset whose run of ``epochs`` fits (halving the gap, on the ETA's
    high end)."""
    low, high = 0, samples
    while high - low > max(1, samples // 1000):
        mid = (low + high) // 2
        low, high = (mid, high) if eta(c, int(mid * epochs)).fits(window_s) else (low, mid)
    if low == 0:
        return None
    return Option(kind="subset", change=f"train on {low:,} of the {samples:,} samples ({low / samples:.0%}), "
                                        f"{epochs:g} epoch{'s' * (epochs != 1)}",
                  cost=f"{1 - low / samples:.0%} of the data left out", basis=basis_of(c),
                  eta=(run := eta(c, int(low * epochs))), trial=c.trial, flags=f"--max_steps {run.steps}",
                  sets={"max_steps": run.steps})


def faster_config(c: Candidate, fastest: Candidate, total: int, window_s: float,
                  eta: Callable[[Candidate, int], Eta]) -> Option | None:
    """The fastest measured config, when it is not the chosen one and its run fits."""
    run = eta(fastest, total)
    if fastest.trial == c.trial or not run.fits(window_s):
        return None
    changed = {k: v for k, v in fastest.searched.items() if c.searched.get(k) != v}
    learned = [k for k in changed if k not in KNOBS or KNOBS[k].changes_learning]  # custom keys: cannot tell
    return Option(kind="faster_config", change="use " + ", ".join(f"{k}={v}" for k, v in changed.items()),
                  cost=(f"changes what is learned ({', '.join(learned)})" if learned else "nothing learned changes")
                       + f"; peak {fastest.peak_gb:.2f} GiB against {c.peak_gb:.2f}; "
                       f"{run_speed(fastest, run) / run_speed(c, eta(c, total)):.2f}x the speed (trial {fastest.trial})",
                  basis="its own probe", eta=run, trial=fastest.trial, sets={"trial": fastest.trial})


def shorter_max_length(c: Candidate, params: Params, data_lengths: Sequence[int], seed: int, total: int,
                       window_s: float, eta: Callable[[Candidate, int], Eta], data_samples: int | None = None
                       ) -> list[Option]:
    """Shorter ``max_length`` values that fit, each with the share of samples it truncates. The
    step cost is the one fitted through the config's timed shapes (no new probe): lengths below
    the longest timed shape are inside what was measured, and a shorter worst case needs less
    memory than the one probed. ``data_lengths``: the data's (or a uniform sample of them: then
    ``data_samples``, the data's count)."""
    lengths = np.asarray(data_lengths)
    options: list[Option] = []
    for q, length in at_quantiles(lengths, SHORTER_QUANTILES):
        scaled = at_max_length(c, params, lengths, seed, length, data_samples) if length < c.max_length else None
        if scaled is None or not (run := eta(scaled, total)).fits(window_s):
            continue
        cut = float(np.mean(lengths > length))
        options.append(Option(kind="shorter_max_length", change=f"max_length {length} instead of {c.max_length}",
                              cost=f"truncates {cut:.1%} of the samples (the {q:.0%} quantile of their lengths)",
                              basis="the chosen config's step cost fitted through its timed shapes, over the "
                                    "data's lengths cut at the new max_length (not probed)",
                              eta=run, trial=c.trial, flags=f"--max_length {length}", sets={"max_length": length}))
    return options


def at_quantiles(lengths: np.ndarray, quantiles: Sequence[float]) -> list[tuple[float, int]]:
    """Each quantile of ``lengths`` and its length rounded up to a multiple of 64, once each."""
    out: dict[int, float] = {}
    if len(lengths):
        for q in quantiles:
            out.setdefault(int(math.ceil(float(np.quantile(lengths, q)) / 64) * 64), q)
    return [(q, length) for length, q in out.items()]


def at_max_length(c: Candidate, params: Params, lengths: np.ndarray, seed: int, length: int,
                  data_samples: int | None) -> Candidate | None:
    """``c`` cut (or grown) to ``max_length`` ``length``: its speed over the data's lengths at that
    length, priced by the step cost fitted through its timed shapes (no probe); None without one."""
    cost = c.step_cost()
    if cost is None:
        return None
    at = params.replace(**{**c.config, "max_length": length})  # the config's knobs at the new length
    mix = typical_mix(lengths.tolist(), at, length, seed, longest=False, data_samples=data_samples)
    sights = first_sights_of(c.first_sights_s, c.first_sight_s, c.epoch_shapes, len(mix.padded_lengths))
    speed = epoch_speed(cost, mix, at.gradient_accumulation_steps * at.processes, first_sights_s=sights)
    return Candidate(**{**c.__dict__, "samples_per_second": speed.samples_per_second,
                        "step_time_s": speed.step_seconds, "config": {**c.config, "max_length": length},
                        "first_sights_s": sights, "epoch_shapes": len(mix.padded_lengths)})


def ranked(options: Sequence[Option | None]) -> list[Option]:
    """The options that exist, the one that keeps the most of the run first: the shortest ETA is
    not the point, the least given up within the window is. A faster config that changes nothing
    learned first, then truncation, a faster config that changes what is learned, fewer epochs,
    less data."""
    def rank(o: Option) -> int:
        if o.kind == "faster_config":
            return 0 if o.cost.startswith("nothing learned") else 2
        return {"shorter_max_length": 1, "fewer_epochs": 3, "subset": 4}[o.kind]

    return sorted((o for o in options if o is not None), key=rank)


def options_to_fit(run: TuneRun, rebuilt: Rebuilt | None, chosen: Candidate, samples: int, epochs: float, total: int,
                   window: float, eta: Callable[..., Eta]) -> list[Option]:
    """What would make a run that does not fit the window fit, best first: a faster config, a shorter
    ``max_length``, fewer epochs, a subset of the data."""
    shorter: list[Option] = []
    if rebuilt is not None and rebuilt.stats is not None:
        spec = rebuilt.spec
        shorter = shorter_max_length(chosen, spec.params, rebuilt.stats.length_sample, spec.probe.seed, total, window,
                                     eta, data_samples=rebuilt.stats.samples)
    fastest = max(run.candidates, key=lambda c: run_speed(c, eta(c)))
    return ranked([faster_config(chosen, fastest, total, window, eta), *shorter,
                   fewer_epochs(chosen, samples, epochs, window, eta), subset(chosen, samples, epochs, window, eta)])
