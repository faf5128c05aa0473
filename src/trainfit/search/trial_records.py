"""What a stored trial holds and how it is asked: its measurement as a record (type-checked, a
damaged one named and left out), its searched values (an off-grid value kept in the trial's
``values``, a grid stand-in told to Optuna), and its memory constraint.

OOM and over-budget configs are COMPLETE trials with a violated ``memory`` constraint
(``trial.set_constraint``), never FAIL trials, which Optuna's samplers ignore and so propose
again. Every trial carries the same constraint key, as GPSampler requires, and a param of every
searched knob in the knob's one distribution, as Optuna's samplers require to model it."""

from __future__ import annotations

import csv
import math
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainfit.json_record import Malformed, check_bounds, check_finite, typed
from trainfit.probe.measurement import Measurement, read_measurement
from trainfit.search.claims import beat, owner_id
from trainfit.search.trials import config_key

CONSTRAINT = "memory"


def constraint_value(m: Measurement) -> float:
    """<= 0 when the config fits; the relative overshoot otherwise (1.0 for OOM and failures)."""
    if m.status != "ok":
        return 1.0
    if m.budget_memory_gb is None or m.peak_memory_gb is None:
        return -1.0
    return (m.peak_memory_gb + (m.budget_headroom_gb or 0.0) - m.budget_memory_gb) / m.budget_memory_gb


def record_problem(trial: Any, names: Sequence[str]) -> str | None:
    """Why a measured trial's record (what :meth:`~trainfit.search.study.TrialStore.tell` stores: its measurement, values
    and objective) cannot be read back, or None. A journal edited by hand or by a tool can hold valid
    JSON of any type there, which would fail far from here (a traceback in the ranking), or a speed
    of NaN or below 0, which would rank first. Tune and plan both leave out a trial this flags."""
    attrs = trial.user_attrs
    try:
        read_measurement(attrs.get("measurement"))
        values = typed(dict[str, Any | None], attrs.get("values", trial.params), "values", nullable=False)
        if missing := sorted(set(names) - set(values)):
            raise Malformed("values", f"no {', '.join(missing)}")
        for name in names:
            if isinstance(values[name], (dict, list)):
                raise Malformed(f"values.{name}", f"a JSON {'object' if isinstance(values[name], dict) else 'list'}"
                                                  " where a searched value belongs")
        objective = typed(float | None, attrs.get("objective"), "objective")
        check_finite({"objective": objective})
        check_bounds("objective", objective, {"at_least": 0})
    except Malformed as err:
        return str(err)
    return None


def recorded_key(trial: Any, names: Sequence[str]) -> str | None:
    """The config key of a trial whose record may be damaged (see :func:`record_problem`): of its
    stored values where they hold every searched name, as the history keys them, else of Optuna's
    own params; None where neither does."""
    values = trial.user_attrs.get("values", trial.params)
    if not (isinstance(values, dict) and set(names) <= set(values)):
        values = {k: trial.params[k] for k in names if k in trial.params}
    return config_key(values) if set(names) <= set(values) else None


def recorded_trials(table: Path) -> list[int]:
    """The trial numbers in a tune's trials.csv (written after every trial, from the study), or
    none where it is missing or unreadable: it only cross-checks the journal."""
    try:
        with table.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    return sorted({int(r["trial"]) for r in rows if r.get("measurement") == "1" and str(r.get("trial")).isdigit()})


def trial_values(trial: Any, names: Sequence[str]) -> dict[str, Any] | None:
    """A trial's searched values: those stored with it (``values``, set when it is asked for with
    them and when it is told), else its params; None while they are not all stored (being asked for)."""
    stored = trial.user_attrs.get("values")
    values = dict(stored) if isinstance(stored, dict) else {k: trial.params[k] for k in names if k in trial.params}
    return {k: values[k] for k in names} if set(names) <= set(values) else None


def holds(distribution: Any, value: Any) -> bool:
    """Can an Optuna ``distribution`` hold ``value`` as a param (a choice of it, or in its range)?"""
    import optuna

    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return any(c == value and type(c) is type(value) for c in distribution.choices)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return bool(distribution._contains(distribution.to_internal_repr(value)))  # its range and its step


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def constraint_problem(trial: Any) -> str | None:
    """Why a sampler cannot read a measured trial's constraints, or None: :meth:`~trainfit.search.study.TrialStore.tell`
    gives every trial one, ``memory``, a number (GPSampler requires one same set on every trial).
    A journal edited by hand can hold another type there, or none, and GPSampler then raises a bare
    TypeError or ValueError from inside ``ask``. Read from the system attrs Optuna keeps them in
    (``constraints:KEY``): a wrong-typed one of its older form (``constraints``) breaks even
    ``trial.constraints``."""
    stored = {k: v for k, v in trial.system_attrs.items() if k == "constraints" or k.startswith("constraints:")}
    key = f"constraints:{CONSTRAINT}"
    if set(stored) != {key}:
        return f"the constraints {sorted(stored)}, not [{key!r}]"
    value = stored[key]
    if not _number(value) or math.isnan(value):
        return f"a {CONSTRAINT} constraint of {value!r}, not a number"
    return None


def stand_in(distribution: Any, value: Any, fits: bool) -> Any | None:
    """The choice of a categorical ``distribution`` that a trial holds as its param in place of
    ``value``, a number it cannot hold (``auto``'s integer batch between two of the grid's), or
    None where no choice is a number. Optuna's samplers model a knob only where every measured trial
    holds it in one same distribution (its intersection search space): a trial without it would
    drop the knob from the model for every trial. The real value stays in the trial's ``values``
    (:func:`trial_values`), which every record of trainfit reads.

    A categorical knob has no place between two choices, so the stand-in is one on the side of the
    grid the trial's outcome holds for, memory growing with the batch: the largest choice below
    ``value`` for a config that ``fits``, the smallest above for one that does not (the nearest on
    the other side where that side has none). The sampler's model then learns no grid point to fit
    that does not, or to fail that fits; the choice below a fitting batch was measured on the way up,
    so the sampler proposing it again costs no probe."""
    import optuna

    if not isinstance(distribution, optuna.distributions.CategoricalDistribution) or not _number(value):
        return None
    numbers: list[Any] = [c for c in distribution.choices if _number(c)]  # ints or floats: comparable
    below, above = [c for c in numbers if c < value], [c for c in numbers if c > value]
    if fits:
        return max(below) if below else min(above, default=None)
    return min(above) if above else max(below, default=None)


def ask_trial(study: Any, distributions: Mapping[str, Any], values: Mapping[str, Any] | None,
              heartbeat_in: Any = None) -> Any:
    """A new trial of ``study`` stamped with its ``owner``: with ``values`` fixed, or else the next
    queued trial or the sampler's choice.

    Fixed values go through ``PartialFixedSampler``, not the study's queue: a queued trial is
    popped by whichever run of a shared storage asks first, and over SQLite two runs can pop the
    same one. A new trial is each run's own (one insert), though it has no params for a moment.

    In a shared storage (``heartbeat_in``) the trial's first heartbeat is recorded before its
    ``owner``: a trial with an owner has a heartbeat for Optuna to judge (see :func:`~trainfit.search.claims.abandoned`).
    Another run can close a trial while it is asked for (it judges the trial's start by its own
    clock: a machine in another time zone sees it hours old): then a new one is asked for."""
    import optuna

    for attempt in range(5):
        try:
            trial = _ask(study, distributions, values)
            if heartbeat_in is not None:
                beat(heartbeat_in, trial, first=True)  # recorded before the owner, whatever the outage
            trial.set_user_attr("owner", owner_id())
            return trial
        except optuna.exceptions.UpdateFinishedTrialError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def _ask(study: Any, distributions: Mapping[str, Any], values: Mapping[str, Any] | None) -> Any:
    import optuna

    sampler = study.sampler
    if values is not None:
        with warnings.catch_warnings():  # "experimental" since optuna 2.4
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.sampler = optuna.samplers.PartialFixedSampler(dict(values), sampler)
    try:
        with warnings.catch_warnings():
            # A heartbeat storage warns on every ask that its heartbeat "is supposed to be used with
            # Study.optimize": ask and tell alone neither record heartbeats nor close stale trials.
            # The callers do both, as optimize does (heartbeat, abandoned).
            warnings.filterwarnings("ignore", "Heartbeat of storage is supposed to be used", UserWarning)
            return study.ask(dict(distributions))
    finally:
        study.sampler = sampler

