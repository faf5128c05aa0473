"""What ``trainfit.tune.tune`` takes besides the spec (``TuneOptions``: the search's options and the
calibration's) and what it returns (``TuneResult``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainfit.search.options import SearchOptions
from trainfit.search.trials import Trial
from trainfit.summary import Summary


@dataclass(frozen=True, kw_only=True)
class TuneOptions(SearchOptions):
    """A run of ``trainfit.tune``: where it writes, what it continues, what it is told as it goes
    (see :class:`~trainfit.search.options.SearchOptions`), and the calibration after the search.

    Example::

        trainfit.tune.tune(spec, trainfit.TuneOptions(output="runs/a", quick=True))
    """

    calibrate_steps: int | None = None
    """Then time that many real steps of the written command and rank with the trainer's own cost
    (None: 30 on a GPU where the written command can run, none on a CPU; 0: none)."""
    calibration_optional: bool = False
    """A calibration nobody asked for (a GPU's default) whose failure leaves the probes' ranking."""
    on_calibration: Callable[[str], None] | None = None
    """Receives the calibration's progress lines."""


@dataclass
class TuneResult:
    """What a tune found: every trial of its study, the pick, the summary its outputs hold."""

    trials: list[Trial]
    best: Trial | None
    """The trial of the summary's best config (ranked as the summary ranks: with a trainer cost where
    it has one); None where nothing fit."""
    summary: Summary
    output: Path
    stop_reason: str
    new_trials: int
    """Trials this run probed (not counting those of an earlier run or of another machine)."""


def best_trial(trials: Sequence[Trial], summary: Summary) -> Trial | None:
    """The trial of ``summary``'s best config (ranked as the summary ranks: with a trainer cost
    where it has one), None where nothing fit."""
    best = summary.best_config
    return None if best is None else next((t for t in trials if t.number == best.trial), None)
