"""Search strategies behind one small protocol:
``propose(history, busy) -> values | SAMPLER | None``.

``history`` is every finished trial of the study (resumed ones, and those of other runs sharing
the storage, included), so a strategy is a pure function of what has been measured. ``busy``
holds the config keys other runs are probing right now: never proposed, and ``auto`` leaves a
family alone while another run climbs it. ``SAMPLER`` hands the choice to Optuna's sampler
(bayes); ``None`` means nothing is left worth probing (until a busy config's result arrives).
"""

from __future__ import annotations

import json
import random
from collections.abc import Collection, Sequence
from typing import Any

from trainfit.search.auto import AutoStrategy
from trainfit.search.trials import SAMPLER, Strategy, Trial, can_run, config_key, model_family, unsupported_values
from trainfit.space import SearchSpace


class GridStrategy:
    """Every grid point, skipping the ones already measured; the configs of one model family
    follow each other, so a probe worker builds each model once."""

    name = "grid"

    def __init__(self, space: SearchSpace) -> None:
        points = list(space.grid())
        first_seen: dict[str, int] = {}
        for p in points:
            first_seen.setdefault(model_family(p), len(first_seen))
        # A family's configs in a row, smaller batches first: each model is built once.
        self.points = sorted(points, key=lambda p: (first_seen[model_family(p)], p.get("batch_size", 0)))

    def propose(self, history: Sequence[Trial], busy: Collection[str] = ()) -> dict[str, Any] | None:
        done = {config_key(t.values) for t in history}
        unsupported = unsupported_values(history)
        open_ = [p for p in self.points
                 if config_key(p) not in done and config_key(p) not in busy and can_run(p, unsupported)]
        # Beside other runs of a shared storage, take a family none of them is probing: each run
        # then builds its own models instead of the one another run holds.
        taken = {model_family(json.loads(k)) for k in busy}
        return next((p for p in open_ if model_family(p) not in taken), next(iter(open_), None))


class RandomStrategy(GridStrategy):
    """Grid points in a seeded random order."""

    name = "random"

    def __init__(self, space: SearchSpace, seed: int) -> None:
        super().__init__(space)
        random.Random(seed).shuffle(self.points)


class BayesStrategy:
    """Optuna's sampler chooses (GPSampler with the memory constraint, see search.trial_records)."""

    name = "bayes"

    def propose(self, history: Sequence[Trial], busy: Collection[str] = ()) -> str:
        return SAMPLER


def make_strategy(name: str, space: SearchSpace, *, seed: int, budget_gb: float | None, headroom_gb: float,
                  device_type: str) -> Strategy:
    if name == "grid":
        return GridStrategy(space)
    if name == "random":
        return RandomStrategy(space, seed)
    if name == "bayes":
        return BayesStrategy()
    return AutoStrategy(space, budget_gb, headroom_gb, device_type)

