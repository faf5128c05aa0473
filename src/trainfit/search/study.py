"""Trials persisted in an Optuna study: every probe is stored as it ends, and a study can be
resumed after Ctrl-C or a crash (a trial cut off mid-probe is retried).

OOM and over-budget configs are COMPLETE trials with a violated ``memory`` constraint
(``trial.set_constraint``), never FAIL trials, which Optuna's samplers ignore and so propose
again. Every trial carries the same constraint key, as GPSampler requires.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.probe.measurement import Measurement
from trainfit.search.space import SearchSpace
from trainfit.search.strategies import Trial, config_key
from trainfit.spec import Spec

CONSTRAINT = "memory"


def study_name(spec: Spec) -> str:
    """Same model, data, budget, probe settings, base params and space -> same study."""
    space = spec.search
    key = json.dumps([spec.digest(), spec.params.to_dict(), [c.text for c in space.constraints] if space else [],
                      space.target_effective_batch if space else None], sort_keys=True, default=list)
    return "trainfit-" + hashlib.sha256(key.encode()).hexdigest()[:12]


def constraint_value(m: Measurement) -> float:
    """<= 0 when the config fits; the relative overshoot otherwise (1.0 for OOM and failures)."""
    if m.status != "ok":
        return 1.0
    if m.budget_memory_gb is None or m.peak_memory_gb is None:
        return -1.0
    return (m.peak_memory_gb + (m.budget_headroom_gb or 0.0) - m.budget_memory_gb) / m.budget_memory_gb


class TrialStore:
    def __init__(self, *, output: Path, spec: Spec, space: SearchSpace, objective: str, resume: bool,
                 storage: str | None, seed: int, sampler: Any = None) -> None:
        import optuna
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space, self.objective = space, objective
        self.distributions = space.distributions()
        output.mkdir(parents=True, exist_ok=True)
        journal = output / "study.journal"
        self.storage = storage or JournalStorage(JournalFileBackend(str(journal)))
        self.name = study_name(spec)
        existing = [s.study_name for s in optuna.get_all_study_summaries(self.storage)] \
            if storage or journal.exists() else []
        where = storage or str(output)
        if self.name in existing and not resume:
            raise TrainfitError(f"{where} already holds this tuning study",
                                "pass --resume to continue it, or --output NEW_FOLDER to start afresh")
        if resume and self.name not in existing:
            if existing and storage is None:
                raise TrainfitError("the spec changed since this study started (model, data, budget, probe "
                                    "settings, params or search space differ), so its trials do not apply",
                                    "restore the spec, or use --output NEW_FOLDER")
            raise TrainfitError(f"nothing to resume in {where}", "drop --resume to start a new study")
        if existing and storage is None and self.name not in existing:
            raise TrainfitError(f"{output} holds a study of a different spec; its outputs would be overwritten",
                                "use --output NEW_FOLDER")
        # The sampler only chooses for the bayes strategy; the others fix every trial's values.
        sampler = sampler or optuna.samplers.GPSampler(seed=seed, n_startup_trials=5)
        self.study = optuna.create_study(study_name=self.name, storage=self.storage, direction="maximize",
                                         sampler=sampler, load_if_exists=True)
        self.retried = self._retry_interrupted()

    def _retry_interrupted(self) -> int:
        """A trial left RUNNING by a crash or Ctrl-C is closed as FAIL and queued again."""
        from optuna.trial import TrialState

        stale = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for t in stale:
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            self.study.enqueue_trial(t.params, skip_if_exists=False)
        return len(stale)

    def history(self) -> list[Trial]:
        from optuna.trial import TrialState

        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            data = t.user_attrs.get("measurement")
            if data is None or t.user_attrs.get("reused"):
                continue
            m = Measurement.from_dict(data)
            out.append(Trial(number=t.number, values=dict(t.user_attrs.get("values", t.params)), measurement=m,
                             objective=t.user_attrs.get("objective")))
        return out

    def ask(self, values: Mapping[str, Any] | None) -> Any:
        """A new trial: with ``values`` fixed, or chosen by the sampler when None."""
        if values is not None:
            self.study.enqueue_trial(dict(values))
        return self.study.ask(self.distributions)

    def pending_queue(self) -> bool:
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def tell(self, trial: Any, values: Mapping[str, Any], m: Measurement, history: Sequence[Trial],
             reused: bool = False) -> Trial:
        """Record a finished trial. ``reused``: the sampler re-proposed a measured (or excluded)
        config; the sampler is told again, but the trial is not a new measurement."""
        objective = getattr(m, self.objective) if m.status == "ok" else None
        if reused:
            trial.set_user_attr("reused", True)
        trial.set_constraint(CONSTRAINT, constraint_value(m))
        trial.set_user_attr("measurement", m.to_dict())
        trial.set_user_attr("values", {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()})
        trial.set_user_attr("objective", objective)
        self.study.tell(trial, objective if objective is not None and m.fits else self._impute(values, history))
        return Trial(number=trial.number, values=dict(values), measurement=m, objective=objective)

    def _impute(self, values: Mapping[str, Any], history: Sequence[Trial]) -> float:
        """For an infeasible trial: the best feasible objective of the same family at a smaller
        batch (a smooth surface for the GP instead of a cliff at 0)."""
        bs = values.get("batch_size")
        family = {k: v for k, v in values.items() if k != "batch_size"}
        same = [t.objective for t in history if t.feasible and t.objective is not None
                and all(t.values.get(k) == v for k, v in family.items())
                and (bs is None or t.values.get("batch_size", 0) < bs)]
        return max(same, default=0.0)

    def find(self, values: Mapping[str, Any], history: Sequence[Trial]) -> Trial | None:
        key = config_key(values)
        return next((t for t in history if config_key(t.values) == key), None)
