"""A comparison split between machines (``compare --storage URL``), through the tune's own
storage mechanism: each config is a trial of an Optuna study in the shared database, queued once,
claimed by the machine whose ``ask`` pops it, kept alive by the tune's heartbeat while it trains,
and given back (queued again) when its machine dies. Every machine reads the others' results
from the study, so each one's ``compare.json`` ends with all of them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from trainfit.compare.runs import ConfigRun

WAIT_S = 5.0
"""Seconds between two looks at the configs other machines are training."""
SETTLE_S = 0.3
"""Seconds between stamping a claimed trial with this machine's name and reading the name back.
Two machines can pop one queued trial at the same moment (SQLite lets both read it as waiting);
both stamp it, and the stamp read back after both wrote names the one that trains it."""


class SharedConfigs:
    """The configs ``names`` of the study ``name`` in the storage at ``url`` (see the module)."""

    def __init__(self, url: str, name: str, names: Sequence[str]) -> None:
        import optuna
        from optuna.distributions import BaseDistribution, CategoricalDistribution

        from trainfit.search.study import open_storage

        self.storage = open_storage(url)
        self.names = list(names)
        self.distributions: dict[str, BaseDistribution] = {"config": CategoricalDistribution(self.names)}
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(storage=self.storage, study_name=name, load_if_exists=True,
                                         direction="minimize")

    def _trials(self, *states: Any) -> list[Any]:
        return self.study.get_trials(deepcopy=False, states=states)

    def _requeue(self) -> None:
        """Close the trials of dead machines (no heartbeat for three beats, or a dead process on
        this host) and queue every config that no trial waits for, trains or has finished."""
        import optuna
        from optuna.trial import TrialState

        from trainfit.search.study import abandoned

        optuna.storages.fail_stale_trials(self.study)
        for t in self._trials(TrialState.RUNNING):
            if abandoned(t):
                self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        live = {t.params.get("config") for t in self._trials(TrialState.WAITING, TrialState.RUNNING,
                                                              TrialState.COMPLETE)}
        for name in self.names:
            if name not in live:
                self.study.enqueue_trial({"config": name})

    def claim(self) -> tuple[Any, str] | None:
        """A config no machine trains or has trained (its trial, its name), or None when none is
        left to claim. Two machines that queue one config at once each get a trial of it: the
        lowest-numbered trial of a config is its claim, a later one is closed. Two that pop one
        trial at once both stamp it: the stamp read back names its owner (:data:`SETTLE_S`)."""
        from optuna.trial import TrialState

        from trainfit.search.study import owner_id

        while True:
            self._requeue()
            if not self._trials(TrialState.WAITING):
                return None
            trial = self.study.ask(self.distributions)
            me = owner_id()
            trial.set_user_attr("owner", me)
            time.sleep(SETTLE_S)
            if self.storage.get_trial(trial._trial_id).user_attrs.get("owner") != me:
                continue  # another machine popped this very trial at the same moment, and stamped it last: theirs
            name = trial.params["config"]
            first = min(t.number for t in self._trials(TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE)
                        if t.params.get("config") == name)
            if first == trial.number:
                return trial, name
            self.study.tell(trial, state=TrialState.FAIL)  # another trial claims this config

    @contextlib.contextmanager
    def training(self, trial: Any) -> Iterator[None]:
        """While the config of ``trial`` trains: its heartbeat, for other machines to see it alive."""
        from trainfit.search.study import heartbeat

        with heartbeat(self.storage, trial):
            yield

    def finish(self, trial: Any, run: ConfigRun) -> None:
        trial.set_user_attr("run", run.to_json())
        self.study.tell(trial, 0.0)  # the figures are the run's; the value orders nothing

    def runs(self) -> dict[str, ConfigRun]:
        """Every machine's finished configs."""
        from optuna.trial import TrialState

        return {t.params["config"]: ConfigRun.from_json(t.user_attrs["run"])
                for t in self._trials(TrialState.COMPLETE) if "run" in t.user_attrs}

    def elsewhere(self) -> list[str]:
        """The configs other machines are training now."""
        from optuna.trial import TrialState

        return sorted(t.params["config"] for t in self._trials(TrialState.RUNNING))

    def wait(self) -> None:
        time.sleep(WAIT_S)
