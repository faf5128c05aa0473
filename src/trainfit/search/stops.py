"""When a search stops: its limits (trials, time, quick) from the spec and the flags, and the stop
rules as pure functions of those limits and the history (no clock, no store)."""

from __future__ import annotations

from dataclasses import dataclass

from trainfit.search.ranking import ranked
from trainfit.search.trials import Trial
from trainfit.space import SearchSpace
from trainfit.spec import Spec

QUICK_TRIALS = 6


def trials_since_best(history: list[Trial]) -> int:
    """Trials measured after the best one (all of them while none fits): what patience counts."""
    order = ranked(history)
    return sum(1 for t in history if not order or t.number > order[0].number)


SEARCH_COMPLETE = "search complete: nothing left worth probing"


@dataclass(frozen=True)
class Limits:
    """When the search stops: its trial and time budgets, and the patience of the samplers."""

    strategy: str
    max_trials: int
    most_trials: int
    """What the progress view counts to: every strategy but bayes proposes grid points, each once."""
    time_budget_s: float | None
    patience: int
    refine: bool


def search_limits(spec: Spec, space: SearchSpace, quick: bool, refine: bool) -> Limits:
    """The limits of the spec's ``tune:`` section (``--quick``: at most ``QUICK_TRIALS`` trials)."""
    strategy, max_trials = spec.tune.strategy, spec.tune.max_trials
    if quick:
        max_trials = min(max_trials or QUICK_TRIALS, QUICK_TRIALS)
    if max_trials is None:
        max_trials = space.grid_size() if strategy == "grid" else 30
    return Limits(strategy=strategy, max_trials=max_trials,
                  most_trials=max_trials if strategy == "bayes" else min(max_trials, space.grid_size()),
                  time_budget_s=spec.tune.time_budget_s, patience=spec.tune.patience, refine=refine)


def time_stop(limits: Limits, elapsed_s: float) -> str | None:
    """Why the run stops now for its time budget, or None."""
    if limits.time_budget_s is not None and elapsed_s >= limits.time_budget_s:
        return f"time budget reached ({limits.time_budget_s:g} s)"
    return None


def budget_reached(limits: Limits) -> str:
    """The stop reason of a spent trial budget."""
    return f"trial budget reached ({limits.max_trials})"


def search_stop(limits: Limits, history: list[Trial], busy: set[str]) -> str | None:
    """Why the search proper ends before another config is asked for, or None: the trial budget
    (a trial another run of the storage probes counts), or no better config within the patience."""
    if len(history) + len(busy) >= limits.max_trials:
        return budget_reached(limits)
    if limits.strategy in ("random", "bayes") and trials_since_best(history) >= limits.patience:
        return f"no better config in the last {limits.patience} trials"
    return None


def converged_stop(limits: Limits, reused: int) -> str | None:
    """Why the run stops after the sampler proposed ``reused`` known answers in a row, or None."""
    if reused >= limits.patience:
        return f"the sampler proposed {reused} measured or excluded configs in a row"
    return None

