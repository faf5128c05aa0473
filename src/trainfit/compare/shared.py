"""A comparison split between machines (``compare --storage URL``), through the tune's own
storage mechanism: each config is trained under a trial of an Optuna study in the shared
database, asked for by the machine that claims it, kept alive by the tune's heartbeat while it
trains, and closed when its machine dies, which opens the config again. Every machine reads the
others' results from the study, so each one's ``compare.json`` ends with all of them."""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from trainfit.compare.runs import ConfigRun
from trainfit.search.claims import abandoned, closed_elsewhere, heartbeat, wait_beside
from trainfit.search.storage import open_storage
from trainfit.search.trial_records import ask_trial

WAIT_S = 5.0
"""Seconds between two looks at the configs other machines are training."""
SETTLE_S = 0.3
"""Seconds between asking for a trial of a config and reading which trial of it came first: a
database server may show a trial a moment after a later one. (A trial shown without its config yet
is waited for: see ``SharedConfigs._first``.)"""


class SharedConfigs:
    """The configs ``names`` of the study ``name`` in the storage at ``url`` (see the module)."""

    def __init__(self, url: str, name: str, names: Sequence[str],
                 on_outage: Callable[[Any], None] | None = None) -> None:
        """``on_outage``: told when the storage stops answering and answers again (see ``open_storage``)."""
        import optuna
        from optuna.distributions import BaseDistribution, CategoricalDistribution

        self.storage = open_storage(url, on_outage=on_outage)
        self.names = list(names)
        self.distributions: dict[str, BaseDistribution] = {"config": CategoricalDistribution(self.names)}
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.study = optuna.create_study(storage=self.storage, study_name=name, load_if_exists=True,
                                         direction="minimize")

    def _trials(self, *states: Any) -> list[Any]:
        return self.study.get_trials(deepcopy=False, states=states)

    def _taken(self) -> dict[str, int]:
        """Each config trained or training: the id of its first trial (the claim), once dead
        machines' trials are closed (no heartbeat for three beats, or a dead process on this
        host). A trial asked for a moment ago may not have its config yet: it is left out."""
        import optuna
        from optuna.trial import TrialState

        with warnings.catch_warnings():  # "experimental" since optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        for t in self._trials(TrialState.RUNNING):
            if abandoned(t):  # another machine may close it at the same moment
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    self.storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        taken: dict[str, int] = {}
        for t in sorted(self._trials(TrialState.RUNNING, TrialState.COMPLETE), key=lambda t: t._trial_id):
            if "config" in t.params:
                taken.setdefault(t.params["config"], t._trial_id)
        return taken

    def claim(self) -> tuple[Any, str] | None:
        """A config no machine trains or has trained (its trial, its name), or None when none is
        left to claim. Each machine asks for a trial of its own (no queue: over SQLite two
        machines can pop one queued trial). Two that ask for one config at once each get a trial
        of it: the first trial of a config is its claim, a later one is closed (:data:`SETTLE_S`)."""
        from optuna.trial import TrialState

        while True:
            taken = self._taken()
            free = [n for n in self.names if n not in taken]
            if not free:
                return None
            trial = ask_trial(self.study, self.distributions, {"config": free[0]}, heartbeat_in=self.storage)
            time.sleep(SETTLE_S)
            if self._first(trial, free[0]):
                return trial, free[0]
            self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)  # another machine's trial claims it

    def _first(self, trial: Any, name: str) -> bool:
        """Is ``trial`` the first of config ``name``? Asked once every earlier live trial has its
        config: one still being asked for (a loaded machine can stall between making its trial and
        giving it its config) may be of this config. This trial beats meanwhile; an earlier one whose
        machine died asking is closed after the grace period, and past that this config is left."""
        from optuna.trial import TrialState

        def look() -> bool | None:
            taken = self._taken()
            asking = [t for t in self._trials(TrialState.RUNNING)
                      if t._trial_id < trial._trial_id and "config" not in t.params]
            return None if asking else taken.get(name) == trial._trial_id

        return wait_beside(self.storage, trial, look, gone=False)

    @contextlib.contextmanager
    def training(self, trial: Any) -> Iterator[None]:
        """While the config of ``trial`` trains: its heartbeat, for other machines to see it alive."""
        with heartbeat(self.storage, trial):
            yield

    def finish(self, trial: Any, run: ConfigRun, name: str) -> None:
        """Record ``run``, the config ``name`` trained under ``trial``: in a new trial of it where
        another machine closed ``trial`` while it trained (this one paused past the heartbeat's
        grace period; see :func:`~trainfit.search.claims.closed_elsewhere`)."""
        if closed_elsewhere(self.storage, trial):
            trial = ask_trial(self.study, self.distributions, {"config": name}, heartbeat_in=self.storage)
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

        return sorted({t.params["config"] for t in self._trials(TrialState.RUNNING) if "config" in t.params})

    def wait(self) -> None:
        time.sleep(WAIT_S)
