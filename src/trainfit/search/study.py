"""The trial store (:class:`TrialStore`): the Optuna study a run asks and tells, every probe stored as
it ends, a study resumed after Ctrl-C or a crash (a trial cut off mid-probe is retried), and the
claims on configs of runs sharing a storage. What a stored trial holds, and why an OOM is a COMPLETE
trial with a violated constraint: :mod:`trainfit.search.trial_records`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from trainfit.errors import TrainfitError
from trainfit.probe.measurement import Measurement
from trainfit.search.claims import abandoned, closed_elsewhere, heartbeat, owner_id, wait_beside
from trainfit.search.journal import journal_storage, mend_journal
from trainfit.search.storage import (
    lock_study_folder,
    masked,
    open_storage,
    other_studies,
    refuse_to_open,
    same_data,
    study_name,
)
from trainfit.search.trial_records import (
    CONSTRAINT,
    ask_trial,
    constraint_problem,
    constraint_value,
    holds,
    record_problem,
    recorded_key,
    recorded_trials,
    stand_in,
    trial_values,
)
from trainfit.search.trials import Trial, config_key, jsonable
from trainfit.space import SearchSpace
from trainfit.spec import Spec


class TrialStore:
    def __init__(self, *, output: Path, spec: Spec, space: SearchSpace, objective: str, resume: bool,
                 storage: str | None, seed: int, sampler: Any = None, join: bool = False,
                 on_event: Callable[[Any], None] | None = None) -> None:
        """``on_event``: what the storage reports while the run goes on (a database that stopped
        answering, and when it answers again: ``StorageLost``, ``StorageBack``)."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.space, self.objective = space, objective
        self.distributions = space.distributions()
        if resume and storage is None and not (output / "study.journal").exists():  # before making anything there
            raise TrainfitError(f"nothing to resume in {output}: it holds no study.journal",
                                "drop --resume to start a new study there")
        try:
            output.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TrainfitError(f"cannot create the output folder {output}: {err.strerror}",
                                "choose another --output") from None
        self._lock: IO[str] | None = lock_study_folder(output)
        try:
            self._open(output, spec, resume, storage, seed, sampler, join, on_event)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Release the output folder (another run may use it from now on)."""
        if self._lock is not None:
            self._lock.close()  # closing the file releases its flock
            self._lock = None

    def _open(self, output: Path, spec: Spec, resume: bool, storage: str | None, seed: int, sampler: Any,
              join: bool, on_event: Callable[[Any], None] | None) -> None:
        self.shared = storage is not None
        journal = output / "study.journal"
        self.journal = None if self.shared else journal
        """The output folder's journal, the study's storage without --storage."""
        self.repaired = mend_journal(journal, resume) if not self.shared and journal.exists() else None
        """The damaged tail dropped from the journal (line, reason, backup), for the run to report."""
        self.emptied = emptied = not self.shared and journal.exists() and journal.stat().st_size == 0
        """The journal was there but empty (0 bytes): its study, if it had one, lost every trial."""
        self.unreadable: dict[int, str] = {}
        """Measured trials whose record cannot be read back, by number, with why (:func:`record_problem`)."""
        self._unreadable_keys: dict[int, str] = {}
        """Their config keys, where readable (:func:`recorded_key`): a config measured again since is
        no longer lost (see :meth:`lost`)."""
        self._stale: list[int] = []
        """Trials this run closed because Optuna's heartbeat found them stale (their numbers)."""
        self.storage = (open_storage(storage, lambda study, trial: self._stale.append(trial.number), on_event)
                        if storage else journal_storage(journal))
        self.where = masked(storage) if storage else str(journal)  # a URL open_storage has checked
        """The study's storage, in words: the journal, or the --storage URL with its password hidden."""
        self.name = study_name(spec)
        # The storage's own list of studies (names and attributes), not optuna.get_all_study_summaries: that one
        # reads every measured trial's constraint too (from Optuna 5.1), which a damaged record turns into a bare
        # TypeError before anything here could name the trial (see _check_constraints).
        summaries = self.storage.get_all_studies() if storage or journal.exists() else []
        existing = [s.study_name for s in summaries]
        doc = {k: v for k, v in spec.to_dict().items() if k != "source"}
        others = other_studies(summaries, self.name, doc)
        refuse_to_open(self.name, output=output, storage=storage, existing=existing, others=others,
                        resume=resume, join=join, emptied=emptied)
        began_on = next((s.user_attrs.get("data_fingerprint") for s in summaries if s.study_name == self.name), None)
        data = same_data(spec, began_on, self.shared)
        self._start_study(spec, doc, others, new=self.name not in existing, data=data, began_on=began_on,
                          seed=seed, sampler=sampler)

    def _start_study(self, spec: Spec, doc: dict[str, Any], others: list[dict[str, Any]], *, new: bool,
                     data: str | None, began_on: str | None, seed: int, sampler: Any) -> None:
        """Create or load the study, record what later runs compare with, and retry the trials a
        crash left running."""
        import optuna

        spec_file = Path(spec.source).name if spec.source else None
        # The sampler only chooses for the bayes strategy; the others fix every trial's values.
        sampler = sampler or optuna.samplers.GPSampler(seed=seed, n_startup_trials=5)
        self.study = optuna.create_study(study_name=self.name, storage=self.storage, direction="maximize",
                                         sampler=sampler, load_if_exists=True)
        self.others: list[dict[str, Any]] = []
        """Other studies of the same spec file in a shared storage, with the keys that differ
        (machines of one job array given different options search apart)."""
        if new:  # what a later run compares its spec with
            self.study.set_user_attr("spec_file", spec_file)
            self.study.set_user_attr("spec", doc)
        if data is not None and began_on is None:  # a new study, or one begun before fingerprints: from now on
            self.study.set_user_attr("data_fingerprint", data)
        if self.shared:
            self.others = [{"name": o["name"], "differs": o["differs"]} for o in others
                           if spec_file is not None and o["spec_file"] == spec_file]
        self.retried = self._retry_interrupted()

    def _retry_interrupted(self) -> int:
        """A trial left RUNNING by a crash or Ctrl-C is closed as FAIL and retried; how many.

        With the output folder's journal, holding the folder's lock means no other run is live,
        so every RUNNING trial is stale, and it is queued again. A shared ``--storage`` may hold
        trials that another machine is probing right now: only abandoned ones are closed (see
        :meth:`_live_trials`), and not queued (two runs could pop one queued trial): its config,
        unmeasured, is simply open to be proposed again."""
        from optuna.trial import TrialState

        if self.shared:
            return self._live_trials()[1]
        stale = self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        for t in stale:
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            stored = t.user_attrs.get("values")  # an integer batch past the grid is not among its params
            self.study.enqueue_trial(t.params, user_attrs={"values": stored} if stored else None, skip_if_exists=False)
        return len(stale)

    def _live_trials(self) -> tuple[list[Any], int]:
        """The RUNNING trials of a shared storage that live runs are probing, and how many abandoned
        ones this call closed as FAIL first: those Optuna's heartbeat finds stale (the storage's
        ``fail_stale_trials``, as ``Study.optimize`` does before each trial), and those
        :func:`abandoned` knows sooner or which the heartbeat cannot judge."""
        import optuna
        from optuna.trial import TrialState

        closed = len(self._stale)
        with warnings.catch_warnings():  # "experimental" since optuna 2.9
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)  # each trial it closes goes in self._stale
        closed = len(self._stale) - closed
        live = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if not abandoned(t):
                live.append(t)
                continue
            # another run may close it at the same moment (as fail_stale_trials allows for)
            with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
                closed += 1
        return live, closed

    def in_flight(self) -> set[str]:
        """Config keys that other live runs of a shared ``--storage`` are probing right now (so
        this run probes something else). Empty for the output folder's own journal: the folder
        lock means no other run is live."""
        if not self.shared:
            return set()
        return {self._key(t) for t in self._others_running()}

    def claimed_elsewhere(self, trial: Any) -> bool:
        """Did another run measure the config of ``trial`` since this run last looked, or ask for
        it before ``trial`` (two runs proposed it at the same moment)? The earlier trial keeps
        it; see :meth:`drop`."""
        from optuna.trial import TrialState

        if not self.shared:
            return False
        key = self._key(trial)

        def look() -> bool | None:
            # running ones first: an earlier trial that ends between the two reads is still seen, as measured
            earlier = [t for t in self._others_running() if t.number < trial.number]
            measured = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if any(self._key(t) == key for t in (*earlier, *measured)):
                return True
            # An earlier trial still being asked for (a Bayesian sampler's fit can take seconds) has
            # not stored its values: it may be of this config. Past the wait it is left to that trial:
            # proposed again if that trial never probes it.
            return False if all(trial_values(t, self.space.names) is not None for t in earlier) else None

        return wait_beside(self.storage, trial, look, gone=True)

    def drop(self, trial: Any, reason: str = "claimed by another run") -> None:
        """Give up ``trial`` unprobed (its config is another run's, or the trial budget is spent): a
        FAIL trial, which holds no measurement, is left out of the history and which samplers ignore."""
        import optuna
        from optuna.trial import TrialState

        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):  # closed by another run: given up
            trial.set_user_attr("dropped", reason)
            self.study.tell(trial, state=TrialState.FAIL, skip_if_finished=True)

    def over_budget(self, trial: Any, max_trials: int) -> bool:
        """Had ``max_trials`` trials claimed the trial budget before ``trial`` was asked for: the
        measured ones, plus those other live runs of a shared storage are probing (unmeasured
        configs) with a smaller number? The storage numbers trials in the order they are asked
        for, so of two runs that both saw one trial left, only the first to ask probes. Never with
        the output folder's journal: the folder lock means no other run is live."""
        if not self.shared:
            return False
        measured, running = self._claims()
        return self._claimed_before(trial.number, measured, running) >= max_trials

    def last_trials(self, max_trials: int) -> set[str]:
        """Configs that other live runs of a shared storage are probing within ``max_trials`` (not
        a --refine beyond it, nor a confirmation): the rest of this search, whose results belong in
        this run's summary."""
        if not self.shared:
            return set()
        measured, running = self._claims()
        return {self._key(t) for t in running if self._claimed_before(t.number, measured, running) < max_trials}

    def _claims(self) -> tuple[int, list[Any]]:
        """What counts against the trial budget: how many trials are measured, and the trials other
        live runs are probing whose configs are not (a repeat of a measured one is a confirmation),
        as the search loop's own count (measured plus busy) has it. The running ones are read first:
        one that ends between the two reads is counted once, as measured."""
        running = self._others_running()
        history = self.history()
        measured = {config_key(t.values) for t in history}
        return len(history), [t for t in running if self._key(t) not in measured]

    def _claimed_before(self, number: int, measured: int, running: Sequence[Any]) -> int:
        """Trials counted against the budget ahead of trial ``number``: the measured ones, and one
        per config in flight in a trial asked for before it."""
        return measured + len({self._key(t) for t in running if t.number < number})

    def _others_running(self) -> list[Any]:
        mine = owner_id()
        return [t for t in self._live_trials()[0] if t.user_attrs.get("owner") != mine]

    def _key(self, trial: Any) -> str:
        """The config key of ``trial``; one of its own for a trial whose values are not all stored
        yet (being asked for), so that two such trials count as two configs in flight."""
        values = trial_values(trial, self.space.names)
        if values is None:
            return config_key({"(being asked for)": trial._trial_id})
        return config_key(values)

    def _measured(self) -> list[Any]:
        """The COMPLETE trials holding a measurement whose record reads back. A measured trial's
        that does not (:func:`record_problem`) is left out, its config counted as never measured
        (probed again), and kept in ``unreadable`` for the run to report."""
        from optuna.trial import TrialState

        out = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.user_attrs.get("measurement") is None:
                continue
            problem = record_problem(t, self.space.names)
            if problem is None:
                out.append(t)
            elif not t.user_attrs.get("reused"):  # a reused trial repeats a measured answer: nothing is lost
                self.unreadable.setdefault(t.number, problem)
                if (key := recorded_key(t, self.space.names)) is not None:
                    self._unreadable_keys[t.number] = key
        return out

    def history(self) -> list[Trial]:
        return [Trial(number=t.number, values=dict(t.user_attrs.get("values", t.params)),
                      measurement=Measurement.from_dict(t.user_attrs["measurement"]),
                      objective=t.user_attrs.get("objective"))
                for t in self._measured() if not (t.user_attrs.get("reused") or t.user_attrs.get("repeat"))]

    def repeats(self) -> dict[str, list[Measurement]]:
        """Confirmation measurements (``tell(..., repeat=True)``) by config key, in order."""
        out: dict[str, list[Measurement]] = {}
        for t in self._measured():
            if t.user_attrs.get("repeat"):
                out.setdefault(config_key(t.user_attrs.get("values", t.params)), []).append(
                    Measurement.from_dict(t.user_attrs["measurement"]))
        return out

    def lost(self, history: Sequence[Trial]) -> dict[int, str]:
        """Trials an earlier run measured that the study no longer holds readably, by number, with
        what is wrong, in order: a record of the wrong type (:func:`record_problem`), and, with the
        output folder's journal, a trial its trials.csv shows that the journal lacks (``history``:
        the study's trials): a line of it lost, or the whole file emptied. Their configs count as
        never measured, so the search probes them again. A damaged record stays in the journal (a
        finished trial cannot change): once its config is measured again (in ``history``), it is
        no longer lost, and a later resume does not name it again. trials.csv is written from the
        history, so a trial it lacks the journal lacked is named once."""
        measured = {config_key(t.values) for t in history}
        lost = {n: why for n, why in self.unreadable.items() if self._unreadable_keys.get(n) not in measured}
        if self.journal is not None:
            have = {t.number for t in history}
            for number in recorded_trials(self.journal.parent / "trials.csv"):
                if number not in have:
                    lost.setdefault(number, "in trials.csv, not in the journal: "
                                    + ("the journal was emptied" if self.emptied else "a line of it was lost"))
        return dict(sorted(lost.items()))

    @contextlib.contextmanager
    def beating(self, trial: Any) -> Iterator[None]:
        """While a probe of ``trial`` runs, its :func:`heartbeat` in a shared storage (nothing to
        do with the output folder's journal)."""
        if not self.shared:
            yield
            return
        with heartbeat(self.storage, trial):
            yield

    def ask(self, values: Mapping[str, Any] | None) -> Any:
        """A new trial: with ``values`` fixed, or else the next queued retry or the sampler's choice
        (see :func:`ask_trial`). Values are stored with the trial (:func:`trial_values`): a value
        its knob's distribution cannot hold (``auto``'s integer batch past the grid) is not one
        of its params while it is probed, so the sampler never draws one in its place; it is told
        with a :func:`stand_in` there. With the sampler's choice, a study whose measured trials it
        cannot read is refused first (:meth:`_check_constraints`)."""
        if values is None:
            values = self._queued_values()
        if values is None and not self.pending_queue():
            self._check_constraints()  # the sampler chooses: it reads every measured trial's constraint
        distributions = self.distributions if values is None else {
            k: d for k, d in self.distributions.items() if k not in values or holds(d, values[k])}
        trial = ask_trial(self.study, distributions, values, heartbeat_in=self.storage if self.shared else None)
        if values is not None:
            trial.set_user_attr("values", jsonable(values))
        return trial

    def _check_constraints(self) -> None:
        """Refuse, before the sampler is asked, a study holding a measured trial whose constraint it
        cannot read (:func:`constraint_problem`): a finished trial cannot change, and the sampler
        reads every one, so it cannot be left out as a damaged record is (:func:`record_problem`).
        The strategies that fix every value ask the sampler nothing."""
        from optuna.trial import TrialState

        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if (problem := constraint_problem(t)) is not None:
                raise TrainfitError(f"trial {t.number} of {self.where} holds {problem}, which Optuna's sampler (the "
                                    "bayes strategy) cannot read; the study is left as it is",
                                    "resume with --strategy auto, grid or random (they do not ask the sampler), "
                                    "or use --output NEW_FOLDER to start afresh")

    def _queued_values(self) -> dict[str, Any] | None:
        """The values stored with the retry that the next ask takes from the queue, if any."""
        from optuna.trial import TrialState

        waiting = self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        stored = waiting[0].user_attrs.get("values") if waiting else None
        return dict(stored) if isinstance(stored, dict) else None

    def pending_queue(self) -> bool:
        from optuna.trial import TrialState

        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def tell(self, trial: Any, values: Mapping[str, Any], m: Measurement, history: Sequence[Trial],
             reused: bool = False, repeat: bool = False) -> Trial:
        """Record a finished trial. ``reused``: the sampler re-proposed a measured (or excluded)
        config; the sampler is told again, but the trial is not a new measurement. ``repeat``: a
        confirmation measurement of a config already in the history (see :meth:`repeats`).
        A trial that another run closed while this one probed it (:func:`closed_elsewhere`) gives
        its measurement to a new trial of the same values: nothing measured is lost."""
        import optuna

        try:
            return self._tell(trial, values, m, history, reused, repeat)
        except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
            if not (self.shared and closed_elsewhere(self.storage, trial)):
                raise
        return self._tell(self.ask(values), values, m, history, reused, repeat)

    def _tell(self, trial: Any, values: Mapping[str, Any], m: Measurement, history: Sequence[Trial],
              reused: bool, repeat: bool) -> Trial:
        objective = getattr(m, self.objective) if m.status == "ok" else None
        if reused:
            trial.set_user_attr("reused", True)
        if repeat:
            trial.set_user_attr("repeat", True)
        constraint = constraint_value(m)
        trial.set_constraint(CONSTRAINT, constraint)
        trial.set_user_attr("measurement", m.to_dict())
        trial.set_user_attr("values", jsonable(values))
        trial.set_user_attr("objective", objective)
        self._stand_ins(trial, values, fits=constraint <= 0)
        self.study.tell(trial, objective if objective is not None and m.fits else self._impute(values, history))
        return Trial(number=trial.number, values=dict(values), measurement=m, objective=objective)

    def _stand_ins(self, trial: Any, values: Mapping[str, Any], fits: bool) -> None:
        """Give ``trial``, before it is told, a :func:`stand_in` param for each of its ``values`` that
        its knob's distribution cannot hold (asked for without it, see :meth:`ask`), so that the
        sampler's search space keeps the knob (a finished trial's params cannot change)."""
        for name, distribution in self.distributions.items():
            if name not in values or name in trial.params or holds(distribution, values[name]):
                continue
            choice = stand_in(distribution, values[name], fits)
            if choice is not None:  # Optuna's storage API: a Trial has no setter of a param it was not asked for
                trial.storage.set_trial_param(trial._trial_id, name, distribution.to_internal_repr(choice),
                                              distribution)

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

