"""The priorities: rules over the measured configs that fit, never fixed numbers."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from trainfit.errors import TrainfitError
from trainfit.plan.eta import Eta, run_speed
from trainfit.plan.inputs import Candidate
from trainfit.spec.sections import PRIORITIES

WITHIN = 0.10
"""``balanced`` and ``memory_efficient`` look among the configs this close to the fastest."""

RULES = {
    "fast": "the fastest config that fits the memory budget",
    "balanced": f"the highest capacity (full fine-tuning, then LoRA rank, then max_length) among the configs "
                f"within {WITHIN:.0%} of the fastest",
    "quality": "the highest capacity (full fine-tuning, then LoRA rank, then max_length) whose run fits the window "
               "(the fastest when none does)",
    "memory_efficient": f"the lowest peak memory among the configs within {WITHIN:.0%} of the fastest",
}


def choose(priority: str, candidates: Sequence[Candidate], eta: Callable[[Candidate], Eta],
           window_s: float) -> Candidate:
    """The config ``priority`` picks from ``candidates`` (all fitting the memory budget), each as fast
    as ``eta`` prices its run's steps (:func:`run_speed`); ``window_s`` is the time it may take. ``priority`` is
    one of :data:`PRIORITIES` (``make_plan`` checks it)."""
    speed = {c.trial: run_speed(c, eta(c)) for c in candidates}  # with a calibration: the trainer's cost included
    fastest = max(candidates, key=lambda c: speed[c.trial])
    near = [c for c in candidates if speed[c.trial] >= (1 - WITHIN) * speed[fastest.trial]]
    if priority == "fast":
        return fastest
    if priority == "balanced":
        return max(near, key=lambda c: (c.capacity, speed[c.trial]))
    if priority == "memory_efficient":
        return min(near, key=lambda c: (c.peak_gb, -speed[c.trial]))
    in_window = [c for c in candidates if eta(c).fits(window_s)] or [fastest]
    return max(in_window, key=lambda c: (c.capacity, speed[c.trial]))


def of_trial(candidates: Sequence[Candidate], trial: int) -> Candidate:
    """The measured config of ``trial`` (``plan --apply`` of a faster config), or a clear error naming
    the ones there are."""
    found = next((c for c in candidates if c.trial == trial), None)
    if found is None:
        raise TrainfitError(f"trial {trial} is not a measured config that fits with an epoch speed",
                            "plan one of trials " + ", ".join(str(c.trial) for c in candidates))
    return found
