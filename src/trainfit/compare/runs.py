"""What one config's training recorded (:class:`ConfigRun`, its ``result.json``: every loss and
evaluation against the steps' own time), when a run has diverged, and what the comparison
suggests from the runs (:class:`Suggestion`, in ``compare.json``). The trainer callback that
records it is :class:`trainfit.compare.child.CurveLog`, in the config's own process."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from trainfit.json_record import Record

MEASURED = ("finished", "diverged", "over_budget", "out_of_memory")
"""The statuses a resumed comparison keeps: what the config's training measured. A failure, or a
config cut short by the comparison's own end, trains again."""

DIVERGED_RISE = 1.1
"""A run diverged when the mean of its last 5 losses passes its first 5's mean by this factor."""
BLOWN_UP = 100.0
"""A run diverged when a loss passes its first by this factor, however few its losses: a learning
rate of 30 took a loss of 7.6 to 20,910 at the second step, which the 10-loss rule saw only at the tenth."""


@dataclass(frozen=True, kw_only=True)
class ConfigRun(Record):
    """``result.json`` of one config: how it trained, its curves, speed and memory."""

    name: str
    status: str
    """``finished``, ``diverged`` (stopped early: a non-finite loss, or one rising past its start),
    ``over_budget`` (it trained, but its peak and the spec's headroom pass ``budget.memory_gb``),
    ``out_of_memory`` (under the budget's cap) or ``failed``."""
    steps: int
    max_steps: int
    samples_per_step: int
    train_s: float
    """The steps' time: from the first step's start to the last's end, evaluations taken out."""
    eval_s: float
    samples_per_second: float | None
    peak_memory_gb: float | None
    """The process's peak: the GPU's allocated peak, or on a CPU its resident peak (model and data included)."""
    losses: list[list[Any]] = field(default_factory=list)
    """``[step, seconds of training so far, loss]`` at every step; a loss that is not finite is null."""
    evals: list[list[float]] = field(default_factory=list)
    """``[step, seconds of training so far, eval loss]`` at every evaluation."""
    diverged_at: int | None = None
    error: str | None = None
    """Why it did not train, or does not fit the budget."""
    wall_s: float | None = None
    """The config's process, launch to exit: imports, the model's build, the data, the steps, the passes."""

    @classmethod
    def failed(cls, name: str, max_steps: int, error: str, status: str = "failed") -> ConfigRun:
        """A config that did not train (``failed`` or ``out_of_memory``), with why."""
        return cls(name=name, status=status, steps=0, max_steps=max_steps, samples_per_step=0, train_s=0.0,
                   eval_s=0.0, samples_per_second=None, peak_memory_gb=None, error=error[-2000:])


def diverged(losses: list[float]) -> bool:
    """A loss that is not finite, one past the first by :data:`BLOWN_UP`, or (past 10 of them) the
    last 5's mean above the first 5's by :data:`DIVERGED_RISE`."""
    if losses and not math.isfinite(losses[-1]):
        return True
    if len(losses) >= 2 and losses[0] > 0 and losses[-1] > BLOWN_UP * losses[0]:
        return True
    if len(losses) < 10:
        return False
    return sum(losses[-5:]) / 5 > DIVERGED_RISE * sum(losses[:5]) / 5


@dataclass(frozen=True, kw_only=True)
class Suggestion(Record):
    says: str
    evidence: str
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Configs for the next round (name -> settings), when the suggestion proposes some."""
