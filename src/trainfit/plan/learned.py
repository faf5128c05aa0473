"""A plan learns from the run before it: ``RUN_DIR/actual.json``, written when a planned run of this
tune folder finished, holds the pace of its steps and its start-up as ``trainfit train`` measured
them, on this folder's device and one of its configs. A later plan without ``--calibrate`` takes
them as a calibration of that config (:class:`~trainfit.trainer.calibration.Calibration`), and says so."""

from __future__ import annotations

import json
import math
from typing import Any

from trainfit.plan.inputs import TuneRun
from trainfit.search.ranking import micro_batches
from trainfit.trainer.calibration import Calibration

ACTUAL_FILE = "actual.json"


def learned(run: TuneRun) -> Calibration | None:
    """The calibration the last finished planned run in ``run``'s folder measured: its mean step
    against the step its plan expected of the config it trained (an applied option's own: another
    ``max_length``, say), the difference being the trainer's own cost,
    and its launch to the trainer's start once. None where there is none to learn from: no
    ``actual.json``, one unreadable, of a run resumed (its start-up is a resume's) or from before
    these were kept, or of a config the folder no longer plans."""
    path = run.folder / ACTUAL_FILE
    try:
        actual: Any = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(actual, dict) or actual.get("status") != "finished" or actual.get("resumed_from"):
        return None
    trial, steps = actual.get("trial"), actual.get("step")
    step_s, startup_s = _number(actual.get("step_s")), _number(actual.get("startup_s"))
    planned = _number(actual.get("planned_step_s"))  # the step the plan expected of the very config trained
    if not (isinstance(trial, int) and isinstance(steps, int) and steps > 0 and step_s and planned
            and startup_s is not None):
        return None
    c = next((c for c in run.candidates if c.trial == trial), None)
    if c is None:
        return None
    return Calibration(steps=steps, seconds_per_step=step_s, samples_per_second=c.samples_per_step / step_s,
                       probe_samples_per_second=c.samples_per_second,
                       ratio=c.samples_per_step / step_s / c.samples_per_second, spread_rel=math.inf,
                       startup_s=startup_s, command=f"trainfit train of trial {trial}", device=run.summary.device,
                       train_startup_s=startup_s, model_step_s=planned, trial=trial,
                       micro_batches=micro_batches(c.config), learned_from=str(path))


def _number(value: Any) -> float | None:
    """``value`` as a figure of time: a finite number, at least 0; else None."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None
