"""How one search runs, besides its spec: ``SearchOptions``. What to search and when to stop
(strategy, trials, time, patience, confirmation) is the spec's ``tune:`` section, the one channel
for them: the CLI's ``--strategy``, ``--max-trials`` and ``--time-budget`` write into it
(``trainfit.spec.with_tune``), so the summary records what ran. ``trainfit.tune.TuneOptions`` adds
what ``tune`` does around the search (its calibration)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.search.events import TuneEvent

if TYPE_CHECKING:
    from trainfit.data.stats import LengthStats

ProbeFn = Callable[..., Measurement]
"""Measures one configuration: ``probe_fn(params, trial_number)``; one that also takes a keyword
``slower_than`` is given the search's bar for it (``trainfit.search.ranking.bar_for``: None, or the
fastest config of the same learning values), and may stop timing once the config is clearly slower."""

EventFn = Callable[[TuneEvent], None]
"""Receives what a running search reports."""


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """A search: where its study and probes live, what it continues, what it is told as it goes."""

    output: str | Path
    """The run's folder: the study (study.journal) and probes/ (and ``tune``'s outputs)."""
    stats: LengthStats | None = None
    """The data's length analysis (None: analyzed once, for real probes)."""
    resume: bool = False
    """Continue the study in ``output`` (or ``storage``)."""
    join: bool = False
    """With ``storage``: start the study or continue it, for several machines started alike."""
    storage: str | None = None
    """A database URL (``sqlite:///...``, ``postgresql://...``) or journal file shared by several runs."""
    quick: bool = False
    """At most 6 trials (fewer where ``tune.max_trials`` says so)."""
    refine: bool = False
    """After the search, probe the best config's neighbours."""
    probe_fn: ProbeFn | None = None
    """Measures a config (default: a real isolated probe); tests of the search pass a stand-in."""
    on_event: EventFn | None = None
    """Receives the search's events (``trainfit.search.events``) as they happen."""
    device_type: str | None = None
    """The device type the priors use (``cuda``, ``cpu``; default: the probe's device)."""
    sampler: Any = None
    """An Optuna sampler in place of the bayes strategy's (GPSampler), e.g. TPE to compare."""
