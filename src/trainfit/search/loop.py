"""The search as ask/tell: open a study (:func:`open_search`), then ask a strategy, probe, tell the
study, repeat (:meth:`Search.measured` yields the state as each probed trial ends).

Every trial is stored in the study as it ends, so an interrupted run loses at most the probe in
flight, and ``resume=True`` picks up from there. The search writes nothing else and knows nothing of
what its caller does with a trial: ``trainfit.tune`` writes its outputs from each state.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import time
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainfit.data.analyze import analyze_spec
from trainfit.data.stats import LengthStats
from trainfit.devices import resolve_device_name
from trainfit.files import naming
from trainfit.params import Params
from trainfit.probe.measurement import Malformed, Measurement, read_measurement
from trainfit.probe.request import Bar
from trainfit.probe.runner import ProbeSession, run_probe
from trainfit.search.confirm import confirm, neighbours
from trainfit.search.events import (
    JournalRepaired,
    ProbeProgress,
    Resumed,
    SharedStudy,
    TrialEnd,
    TrialsLost,
    TrialStart,
    Waiting,
)
from trainfit.search.options import EventFn, ProbeFn, SearchOptions
from trainfit.search.ranking import Repeats, bar_for, ranked
from trainfit.search.stops import (
    SEARCH_COMPLETE,
    Limits,
    budget_reached,
    converged_stop,
    search_limits,
    search_stop,
    time_stop,
)
from trainfit.search.strategies import make_strategy
from trainfit.search.study import TrialStore
from trainfit.search.trial_records import trial_values
from trainfit.search.trials import Trial, can_run, config_key, unsupported_values
from trainfit.space import SearchSpace
from trainfit.spec import Spec

RUNNING = "running"
"""``SearchState.stop_reason`` while the search goes on."""


@dataclass(frozen=True, kw_only=True)
class SearchState:
    """The search as a probed trial ends, or as it ends: what a writer of its outputs reads."""

    trials: list[Trial]
    """Every measured trial of the study (a shared storage's other runs' too)."""
    stop_reason: str
    """Why it ended; :data:`RUNNING` while it goes on."""
    elapsed_s: float
    repeats: Repeats
    """Each config's confirmation re-probes."""
    new_trials: int
    """Trials this run probed."""


BUSY_WAIT_S = 5.0  # beside other runs of a shared storage: how often to look for their results


@dataclass
class LoopState:
    """What the loop knows between two trials."""

    history: list[Trial]
    start: float
    busy: set[str] = field(default_factory=set)
    """Configs other runs of a shared storage probe now (not measured yet)."""
    new_trials: int = 0
    stop_reason: str = SEARCH_COMPLETE
    refining: bool = False
    """After the search, whatever ended it but the clock (--refine): the best's neighbours."""
    refined: int = 0
    reused: int = 0
    """Known answers told the sampler in a row (measured or excluded configs it proposed again)."""
    announced: bool = False
    """The ``Waiting`` event was emitted for the current wait."""

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


AGAIN = object()
"""``SearchLoop.next_trial``: nothing to probe yet, go round again (wait for others, or re-ask)."""


class SearchLoop:
    """Ask, probe, tell; one ``turn`` per trial (see :class:`Search`)."""

    def __init__(self, spec: Spec, space: SearchSpace, store: TrialStore, limits: Limits, probe_fn: ProbeFn,
                 emit: EventFn, strat: Any) -> None:
        self.spec, self.space, self.store, self.limits = spec, space, store, limits
        self.probe_fn, self.emit, self.strat = probe_fn, emit, strat
        self.takes_bar = takes_keyword(probe_fn, "slower_than")
        """A probe function that takes ``slower_than`` is told each probe's bar (:func:`bar_for`)."""
        self.state = LoopState(history=store.history(), start=time.perf_counter())
        self.ended: TrialEnd | None = None
        """The event of the trial just probed, emitted once its state was yielded."""

    def run(self) -> Iterator[SearchState]:
        """Turns until a stop rule ends them: the state after each probed trial (its ``TrialEnd``
        event follows, once the caller has taken it)."""
        while self.turn():
            if self.ended is not None:
                yield self.snapshot(RUNNING)
                ended, self.ended = self.ended, None
                self.emit(ended)
        if self.state.refined:
            self.state.stop_reason += f"; then refined: {self.state.refined} neighbour(s) of the best probed"

    def turn(self) -> bool:
        """One pass: stop (False), or ask for a config and measure it (or wait for other runs)."""
        s, store = self.state, self.store
        if store.shared:  # other runs' results count, and what they probe now is theirs
            s.history = store.history()
            # a config measured already is a confirmation repeat there: it changes no proposal
            s.busy = store.in_flight() - {config_key(t.values) for t in s.history}
        if (reason := time_stop(self.limits, s.elapsed())) is not None:
            s.stop_reason = reason
            return False
        if not s.refining and not store.pending_queue():
            if (reason := search_stop(self.limits, s.history, s.busy)) is not None:
                s.stop_reason = reason
                if not (self.limits.refine and ranked(s.history)):
                    return False
                s.refining = True
        trial = self.next_trial()
        if trial is None:
            return False
        return trial is AGAIN or self.measure(trial)

    def next_trial(self) -> Any:
        """The next trial to measure, ``AGAIN``, or None when nothing is left worth probing."""
        s, store = self.state, self.store
        if store.pending_queue():
            return store.ask(None)  # an interrupted trial, retried first
        proposal = self.propose()
        if proposal is None:
            if s.busy:  # their results may open new configs (a family's next batch size)
                self.wait_for_others()
                return AGAIN
            if not s.refining:
                s.stop_reason = SEARCH_COMPLETE
            return None
        trial = store.ask(None if isinstance(proposal, str) else proposal)  # the one str: SAMPLER
        if not s.refining and store.over_budget(trial, self.limits.max_trials):  # another run took the last one
            store.drop(trial, "over the trial budget")
            return AGAIN  # the next turn counts that run's trial, and stops (or refines)
        return trial

    def propose(self) -> Any:
        """The strategy's next config; once it has none (or while refining), with --refine, the
        best's first unmeasured neighbour (a faster one brings its own)."""
        s = self.state
        proposal = None if s.refining else self.strat.propose(s.history, s.busy)
        if proposal is None and self.limits.refine and (order := ranked(s.history)):
            if not s.refining:
                s.stop_reason, s.refining = SEARCH_COMPLETE, True
            proposal = next((v for v in neighbours(self.space, order[0].values)
                             if self.store.find(v, s.history) is None and config_key(v) not in s.busy
                             and can_run(v, unsupported_values(s.history))), None)
        return proposal

    def measure(self, trial: Any) -> bool:
        """Probe ``trial``'s config, or tell the store what is known of it; False: stop (converged)."""
        s, store = self.state, self.store
        values = trial_values(trial, self.space.names)
        assert values is not None, "a trial this run asked for has all its values"
        cached = store.find(values, s.history)
        if cached is None and store.claimed_elsewhere(trial):  # another run measured or took it meanwhile
            store.drop(trial)
            self.wait_for_others()
            return True
        s.announced = False
        known = cached is not None
        if known or not self.space.allowed(values) or not can_run(values, unsupported_values(s.history)):
            # The sampler (or --refine) may propose a config that is excluded, cannot run here or is
            # already measured: tell it the known answer instead of probing again.
            m = cached.measurement if cached is not None else Measurement(
                status="error", config=self.space.params(values).to_dict(),
                message="excluded by tune.constraints" if not self.space.allowed(values)
                else "a knob value of it cannot run on this machine (see the failed probe)")
            store.tell(trial, values, m, s.history, reused=True)
            s.reused += 1
            reason = converged_stop(self.limits, s.reused)
            if reason is not None:  # it has nothing new to try
                s.stop_reason = reason
            return reason is None
        s.reused = 0
        self.probe(trial, values)
        return True

    def probe(self, trial: Any, values: dict[str, Any]) -> None:
        s, limits = self.state, self.limits
        self.emit(TrialStart(number=trial.number, index=len(s.history) + 1, max_trials=limits.most_trials,
                             refining=s.refining, values=values, elapsed_s=s.elapsed()))
        bar = {"slower_than": bar_for(self.space, s.history, values, self.store.objective)} if self.takes_bar else {}
        with self.store.beating(trial):
            m = self.probe_fn(self.space.params(values), trial.number, **bar)
        s.history.append(self.store.tell(trial, values, m, s.history))
        s.new_trials += 1
        s.refined += s.refining
        self.ended = (TrialEnd(number=trial.number, index=len(s.history), max_trials=limits.most_trials,
                           refining=s.refining, values=values, measurement=m, best=next(iter(ranked(s.history)), None),
                           elapsed_s=s.elapsed(), mean_probe_s=s.elapsed() / max(s.new_trials, 1)))

    def snapshot(self, stop_reason: str) -> SearchState:
        s = self.state
        return SearchState(trials=list(s.history), stop_reason=stop_reason, elapsed_s=s.elapsed(),
                           repeats=self.store.repeats(), new_trials=s.new_trials)

    def wait_for_others(self, searching: bool = True) -> None:
        """``searching``: their results decide what to probe next; else the summary waits for them."""
        s = self.state
        if s.busy and not s.announced:
            s.announced = True
            self.emit(Waiting(busy=len(s.busy), searching=searching, elapsed_s=s.elapsed()))
        time.sleep(BUSY_WAIT_S)

    def settle(self) -> bool:
        """The study's trials, for the confirmation and the summary. Beside other runs of a shared
        storage, first wait for the trials they probe within ``max_trials`` (the run that ended
        first wrote a summary without them), but not past the time budget. Nothing in flight is
        taken as the end once two looks a wait apart find it so and the same measured: another run
        may have read the history a moment before this one ended, and be about to ask for a trial.

        True: search on. The run stopped on a trial budget that counted trials in flight elsewhere,
        and one of them ended unmeasured (its run died, and its trial was closed as stale), so the
        budget is not spent and that config is open again."""
        s = self.state
        if not self.store.shared:
            return False
        quiet: int | None = None  # the measured count at the last look that found nothing in flight
        while True:
            s.busy = self.store.last_trials(self.limits.max_trials)
            measured = min(len(self.store.history()), self.limits.max_trials)
            if (not s.busy and measured == quiet) or time_stop(self.limits, s.elapsed()) is not None:
                break
            quiet = None if s.busy else measured
            self.wait_for_others(searching=False)
        s.history = self.store.history()
        return (s.stop_reason == budget_reached(self.limits) and not s.refining
                and search_stop(self.limits, s.history, set()) is None and time_stop(self.limits, s.elapsed()) is None)


def takes_keyword(probe_fn: ProbeFn, name: str) -> bool:
    """Does ``probe_fn`` take the keyword ``name`` (``slower_than``, ``folder``)? False where its
    signature cannot be read (a builtin): it is called as ``probe_fn(params, number)``."""
    try:
        return name in inspect.signature(probe_fn).parameters
    except (TypeError, ValueError):
        return False


def probe_folder(output: Path, number: int) -> Path:
    """Where the probe of trial ``number`` keeps its files: request.json, probe.log (its output) and
    result.json (its measurement, with the whole error message of a failed probe)."""
    return output / "probes" / f"trial-{number:04d}"


@dataclass(frozen=True, kw_only=True)
class CommonFailure:
    """Why nothing fits when no probe got as far as measuring memory (each failed with an error or
    timed out, none ran out of memory): the failure most of them share. No memory knob helps."""

    what: str
    """What every probe did, in words: "failed with an error", "timed out", or both."""
    line: str
    """The line of its message that says what went wrong (``Measurement.headline``)."""
    probes: int
    """How many probes it ended."""
    total: int
    """How many probes there were."""
    trial: int
    """The first trial it ended: its probe's folder (:func:`probe_folder`) holds the whole message."""

    def advice(self, output: Path = Path()) -> str:
        """What to do, naming where the first such probe's files are (under ``output``)."""
        folder = probe_folder(output, self.trial)
        return (f"every probe {self.what} (none ran out of memory), so no memory knob helps. Fix this first "
                f"({self.probes} of {self.total} probes): {self.line}; the whole message of trial {self.trial}: "
                f"{folder / 'result.json'}; its output: {folder / 'probe.log'}")


def common_failure(trials: Sequence[Trial]) -> CommonFailure | None:
    """The :class:`CommonFailure` of ``trials``, None where one measured memory (ran, or ran out of it).
    The most common line wins; of equals, the earliest trial's."""
    if not trials or any(t.measurement.status in ("ok", "oom") for t in trials):
        return None
    by_line: dict[str, list[Trial]] = {}
    for t in sorted(trials, key=lambda t: t.number):
        by_line.setdefault(t.measurement.headline or t.measurement.status, []).append(t)
    line, hit = max(by_line.items(), key=lambda item: len(item[1]))  # max keeps the first of equals
    statuses = {t.measurement.status for t in trials}
    what = {frozenset({"error"}): "failed with an error", frozenset({"timeout"}): "timed out",
            frozenset({"diverged"}): "diverged"}.get(frozenset(statuses), "failed with an error, timed out or diverged")
    return CommonFailure(what=what, line=line, probes=len(hit), total=len(trials), trial=hit[0].number)


def default_probe(spec: Spec, stats: LengthStats | None, output: Path, emit: EventFn,
                  device_type: str | None) -> tuple[ProbeFn, Any, str, LengthStats | None]:
    """A real, isolated probe of each config (keeping a built model for the next probe of its
    family), the session to close after the search, the device type the search's priors use, and
    the data's lengths (analyzed here unless given: once, for every probe and the runtime estimate)."""
    if stats is None and spec.data is not None:
        stats = analyze_spec(spec, progress=False)
    session = ProbeSession()

    def probe_fn(params: Params, number: int, slower_than: Bar | None = None, folder: Path | None = None) -> Measurement:
        workdir = folder or probe_folder(output, number)
        with naming(workdir):  # a full disk's error names no file: the probe's folder, where it writes its files
            return run_probe(spec, params, stats=stats, workdir=workdir, on_event=lambda e: emit(ProbeProgress(e)),
                             session=session, slower_than=slower_than)

    return probe_fn, session, device_type or resolve_device_name(spec.probe.device), stats


class Search:
    """An open search (see :func:`open_search`): its space, limits and data lengths, the trials it
    measures (:meth:`measured`) and how it ended (:meth:`outcome`)."""

    def __init__(self, loop: SearchLoop, probe_fn: ProbeFn, stats: LengthStats | None,
                 session: ProbeSession | None, output: Path) -> None:
        self.loop, self.probe_fn, self.stats, self.session = loop, probe_fn, stats, session
        self.output = output
        self.space, self.limits = loop.space, loop.limits

    def measured(self) -> Generator[SearchState, None, None]:
        """Ask, probe and tell until a stop rule ends the search (then, with ``--refine``, the best's
        neighbours; beside a shared storage, the trials other runs still probe), then ``--confirm``'s
        re-probes: the state as each probed trial ends. Its probes' kept workers are stopped once
        it is done, or closed."""
        loop = self.loop
        try:
            yield from loop.run()
            while loop.settle():  # a dead run's trial, counted against the budget, was closed unmeasured
                yield from loop.run()
            confirm(loop.spec, self.space, loop.store, loop.state.history, self.probe_fn, loop.emit)
        finally:
            self.close_probes()

    def outcome(self) -> SearchState:
        """How the search ended, with every trial of the study (what other runs of a shared storage
        measured meanwhile too)."""
        state, store = self.loop.state, self.loop.store
        if store.shared:
            state.history = store.history()
        return self.loop.snapshot(state.stop_reason)

    def probe_aside(self, params: Params, name: str) -> Measurement:
        """Measure ``params`` outside the study (a config its space leaves out: what a lever not
        searched would buy), in ``probes/NAME`` (the probe's own files, and ``measurement.json``: what
        it measured, read back there by a resumed run instead of probing again, unless it failed with
        an error or a timeout). Its worker is stopped after it, as the search's are."""
        folder = self.output / "probes" / name
        saved = folder / "measurement.json"
        with contextlib.suppress(FileNotFoundError, ValueError, Malformed):
            kept = read_measurement(json.loads(saved.read_text()), name)
            if kept.status in ("ok", "oom"):  # a measurement; an error or a timeout is tried again
                return kept
        takes_folder = takes_keyword(self.probe_fn, "folder")
        try:
            m = self.probe_fn(params, -1, folder=folder) if takes_folder else self.probe_fn(params, -1)
        finally:
            self.close_probes()
        folder.mkdir(parents=True, exist_ok=True)
        m.write_json(saved)
        return m

    def close_probes(self) -> None:
        if self.session is not None:
            self.session.close()  # no worker outlives the search


@contextlib.contextmanager
def open_search(spec: Spec, options: SearchOptions) -> Iterator[Search]:
    """Open the study of ``spec.search`` in ``options.output`` (or ``options.storage``), for a search
    of the fastest configuration that fits ``spec.budget`` within the limits of ``spec.tune``, as
    ``options`` say. The study holds the output folder until the block ends (a second run of it is
    refused meanwhile).

    Example::

        with open_search(spec, SearchOptions(output="runs/a")) as search:
            for state in search.measured():
                print(len(state.trials), "trials")
            print(search.outcome().stop_reason)
    """
    output = Path(options.output)
    space = spec.search or SearchSpace(base=spec.params, dims=())
    limits = search_limits(spec, space, options.quick, options.refine)
    emit = options.on_event or (lambda event: None)
    session = None
    probe_fn, device_type, stats = options.probe_fn, options.device_type, options.stats
    if probe_fn is None:
        probe_fn, session, device_type, stats = default_probe(spec, stats, output, emit, device_type)
    try:
        store = TrialStore(output=output, spec=spec, space=space, objective=spec.tune.objective,
                           resume=options.resume, storage=options.storage, seed=spec.tune.seed,
                           sampler=options.sampler, join=options.join, on_event=emit)
        with contextlib.closing(store):  # releases the output folder for the next run
            strat = make_strategy(limits.strategy, space, seed=spec.tune.seed, budget_gb=spec.budget.memory_gb,
                                  headroom_gb=spec.budget.headroom_gb, device_type=device_type or "cpu")
            loop = SearchLoop(spec, space, store, limits, probe_fn, emit, strat)
            announce(store, loop.state.history, emit)
            yield Search(loop, probe_fn, stats, session, output)
    finally:
        if session is not None:
            session.close()


def announce(store: TrialStore, history: list[Trial], emit: EventFn) -> None:
    """What the run found on opening its study: a repaired journal, trials it lost, a shared study,
    earlier trials."""
    if store.repaired is not None:
        emit(JournalRepaired(**store.repaired))
    if lost := store.lost(history):
        emit(TrialsLost(storage=store.where, trials=lost))
    if store.shared:  # the name is the spec's digest: machines of one search all print the same
        emit(SharedStudy(name=store.name, trials=len(history), others=store.others))
    if history or store.retried:
        emit(Resumed(trials=len(history), retried=store.retried))

