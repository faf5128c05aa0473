"""The tuning loop: ask a strategy, probe, persist, repeat; then write the outputs.

Every trial is stored in the study as it ends and the outputs are rewritten after each one, so
an interrupted run loses at most the probe in flight, and ``resume=True`` picks up from there.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trainfit.data.stats import LengthStats
from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.search.events import (
    ConfirmEnd,
    ConfirmStart,
    JournalRepaired,
    ProbeProgress,
    Resumed,
    SharedStudy,
    TrialEnd,
    TrialStart,
    TuneEvent,
    Waiting,
)
from trainfit.search.ranking import Repeats, ranked, within_noise
from trainfit.search.strategies import Trial, can_run, config_key, make_strategy, unsupported_values
from trainfit.search.study import TrialStore
from trainfit.space import SearchSpace
from trainfit.spec import Spec

ProbeFn = Callable[[Params, int], Measurement]
EventFn = Callable[[TuneEvent], None]


class OutputWriter(Protocol):
    """Writes a run's outputs from its trials so far and returns the summary (``trainfit.report.write_outputs``:
    the search itself writes nothing, so it does not depend on the report)."""

    def __call__(self, output: Path, spec: Spec, space: SearchSpace, trials: Sequence[Trial], *,
                 stats: LengthStats | None, strategy: str, stop_reason: str, elapsed_s: float,
                 repeats: Repeats) -> dict[str, Any]: ...
QUICK_TRIALS = 6
BUSY_WAIT_S = 5.0  # beside other runs of a shared storage: how often to look for their results
CONFIRM_MAX = 4  # configs re-probed by --confirm: the best and its three closest runners-up


@dataclass
class TuneResult:
    trials: list[Trial]
    best: Trial | None
    summary: dict[str, Any]
    output: Path
    stop_reason: str
    new_trials: int


def neighbours(space: SearchSpace, values: dict[str, Any]) -> list[dict[str, Any]]:
    """Configs one grid step away from ``values`` in one dimension (for --refine)."""
    out = []
    for d in space.dims:
        grid = list(d.grid_values())
        if values.get(d.name) not in grid:
            continue
        i = grid.index(values[d.name])
        for j in (i - 1, i + 1):
            if 0 <= j < len(grid):
                candidate = {**values, d.name: grid[j]}
                if space.allowed(candidate):
                    out.append(candidate)
    return out


def trials_since_best(history: list[Trial]) -> int:
    """Trials measured after the best one (all of them while none fits): what patience counts."""
    order = ranked(history)
    return sum(1 for t in history if not order or t.number > order[0].number)


def confirm(spec: Spec, space: SearchSpace, store: TrialStore, history: list[Trial], probe_fn: ProbeFn,
            emit: EventFn) -> None:
    """``tune.confirm_rounds`` more probes of the best config and of each runner-up within its
    measurement noise or within ``tune.confirm_margin`` of it (at most ``CONFIRM_MAX - 1``),
    interleaved (A B A B: a drift of the machine hits both alike). Rounds already in the study
    (a resumed run, or another run sharing the storage) are not probed again."""
    rounds = spec.tune.confirm_rounds
    order = ranked(history)
    if rounds <= 0 or not order:
        return
    tied = {e["trial"] for e in within_noise(order)}
    best = order[0]
    close = [t for t in order[1:] if t.number in tied
             or t.measured_objective >= best.measured_objective * (1 - spec.tune.confirm_margin)]
    candidates = [best, *close][:CONFIRM_MAX]
    if len(candidates) < 2:
        return  # a clear winner: nothing to confirm
    for r in range(rounds):
        for c in candidates:
            key = config_key(c.values)
            # fresh each time: other runs of a shared storage confirm too (done, or probing it now)
            if len(store.repeats().get(key, ())) > r or key in store.in_flight():
                continue
            trial = store.ask(c.values)
            emit(ConfirmStart(round=r + 1, rounds=rounds, values=c.values))
            with store.beating(trial):
                m = probe_fn(space.params(c.values), trial.number)
            store.tell(trial, c.values, m, history, repeat=True)
            emit(ConfirmEnd(round=r + 1, rounds=rounds, values=c.values, measurement=m))


def run_search(
    spec: Spec,
    *,
    outputs: OutputWriter,
    output: str | Path,
    stats: LengthStats | None = None,
    resume: bool = False,
    join: bool = False,
    storage: str | None = None,
    strategy: str | None = None,
    max_trials: int | None = None,
    time_budget_s: float | None = None,
    quick: bool = False,
    refine: bool = False,
    probe_fn: ProbeFn | None = None,
    on_event: EventFn | None = None,
    device_type: str | None = None,
    sampler: Any = None,
) -> TuneResult:
    """Search ``spec.search`` for the fastest configuration that fits ``spec.budget``, writing the
    run's outputs with ``outputs`` after every trial and at the end (``trainfit.tune`` passes the
    report's writer).

    ``probe_fn(params, trial_number)`` measures one configuration (default: a real isolated
    probe); tests of the search logic pass a deterministic one. ``sampler`` replaces the
    Optuna sampler the bayes strategy uses (GPSampler), e.g. to compare with TPE. ``resume``
    continues a study; ``join`` (with ``storage``) starts it or continues it, for several
    machines started with one command.
    """
    output = Path(output)
    space = spec.search or SearchSpace(base=spec.params, dims=())
    if stats is None and spec.data is not None and probe_fn is None:
        from trainfit.data.analyze import analyze_spec

        stats = analyze_spec(spec, progress=False)  # once, for every probe and the runtime estimate
    strategy_name = strategy or spec.tune.strategy
    if quick:
        max_trials = min(max_trials or QUICK_TRIALS, QUICK_TRIALS)
    if max_trials is None:
        max_trials = spec.tune.max_trials or (space.grid_size() if strategy_name == "grid" else 30)
    # What the progress view counts to: every strategy but bayes proposes grid points, each once.
    most_trials = max_trials if strategy_name == "bayes" else min(max_trials, space.grid_size())
    time_budget_s = time_budget_s if time_budget_s is not None else spec.tune.time_budget_s
    emit = on_event or (lambda event: None)

    session = None
    if probe_fn is None:
        from trainfit.probe.runner import ProbeSession, resolve_device_name, run_probe

        device_type = device_type or resolve_device_name(spec.probe.device)
        session = ProbeSession()  # keeps a built model for the next probe of the same family

        def probe_fn(params: Params, number: int) -> Measurement:
            return run_probe(spec, params, stats=stats, workdir=output / "probes" / f"trial-{number:04d}",
                             on_event=lambda e: emit(ProbeProgress(e)), session=session)

    store = TrialStore(output=output, spec=spec, space=space, objective=spec.tune.objective, resume=resume,
                       storage=storage, seed=spec.tune.seed, sampler=sampler, join=join)
    with contextlib.closing(store):  # releases the output folder for the next run
        strat = make_strategy(strategy_name, space, seed=spec.tune.seed, budget_gb=spec.budget.memory_gb,
                              headroom_gb=spec.budget.headroom_gb, device_type=device_type or "cpu")
        if store.repaired is not None:
            emit(JournalRepaired(**store.repaired))
        history = store.history()
        if store.shared:  # the name is the spec's digest: machines of one search all print the same
            emit(SharedStudy(name=store.name, trials=len(history), others=store.others))
        if history or store.retried:
            emit(Resumed(trials=len(history), retried=store.retried))
        start = time.perf_counter()
        new_trials = 0
        stop_reason = "search complete: nothing left worth probing"
        refining = False  # after the search, whatever ended it but the clock (--refine)
        refined = 0
        reused = 0
        busy: set[str] = set()
        announced = False  # the "waiting" event, once per wait

        def out_of_time() -> bool:
            return time_budget_s is not None and time.perf_counter() - start >= time_budget_s

        def wait_for_others(searching: bool = True) -> None:
            """``searching``: their results decide what to probe next; else the summary waits for them."""
            nonlocal announced
            if busy and not announced:
                announced = True
                emit(Waiting(busy=len(busy), searching=searching, elapsed_s=time.perf_counter() - start))
            time.sleep(BUSY_WAIT_S)

        def settle() -> list[Trial]:
            """The study's trials, for the confirmation and the summary. Beside other runs of a shared
            storage, first wait for the trials they probe within ``max_trials`` (the run that ended
            first wrote a summary without them), but not past the time budget."""
            nonlocal busy
            if not store.shared:
                return history
            while (busy := store.last_trials(max_trials)) and not out_of_time():
                wait_for_others(searching=False)
            return store.history()

        def write(reason: str) -> dict[str, Any]:
            return outputs(output, spec, space, history, stats=stats, strategy=strategy_name, stop_reason=reason,
                                 elapsed_s=time.perf_counter() - start, repeats=store.repeats())

        try:
            while True:
                if store.shared:  # other runs' results count, and what they probe now is theirs
                    history = store.history()
                    # a config measured already is a confirmation repeat there: it changes no proposal
                    busy = store.in_flight() - {config_key(t.values) for t in history}
                if out_of_time():
                    stop_reason = f"time budget reached ({time_budget_s:g} s)"
                    break
                if not refining and not store.pending_queue():
                    ended = None
                    if len(history) + len(busy) >= max_trials:  # a trial another run probes counts
                        ended = f"trial budget reached ({max_trials})"
                    elif strategy_name in ("random", "bayes") and trials_since_best(history) >= spec.tune.patience:
                        ended = f"no better config in the last {spec.tune.patience} trials"
                    if ended is not None:
                        stop_reason = ended
                        if not (refine and ranked(history)):
                            break
                        refining = True
                if store.pending_queue():
                    trial = store.ask(None)  # an interrupted trial, retried first
                else:
                    proposal = None if refining else strat.propose(history, busy)
                    if proposal is None and refine and ranked(history):
                        if not refining:
                            stop_reason, refining = "search complete: nothing left worth probing", True
                        # A local search: the best's unmeasured neighbours; a faster one brings its own.
                        proposal = next((v for v in neighbours(space, ranked(history)[0].values)
                                         if store.find(v, history) is None and config_key(v) not in busy
                                         and can_run(v, unsupported_values(history))), None)
                    if proposal is None:
                        if busy:  # their results may open new configs (a family's next batch size)
                            wait_for_others()
                            continue
                        if not refining:
                            stop_reason = "search complete: nothing left worth probing"
                        break
                    trial = store.ask(None if isinstance(proposal, str) else proposal)  # the one str: SAMPLER
                    if not refining and store.over_budget(trial, max_trials):  # another run took the last one
                        store.drop(trial, "over the trial budget")
                        continue  # the next pass counts that run's trial, and stops (or refines)
                values = {k: trial.params[k] for k in space.names}
                cached = store.find(values, history)
                if cached is None and store.claimed_elsewhere(trial):  # another run measured or took it meanwhile
                    store.drop(trial)
                    wait_for_others()
                    continue
                announced = False
                unsupported = unsupported_values(history)
                if not space.allowed(values) or not can_run(values, unsupported) or cached is not None:
                    # The sampler (or --refine) may propose a config that is excluded, cannot run here or
                    # is already measured: tell it the known answer instead of probing again.
                    m = cached.measurement if cached is not None else Measurement(
                        status="error", config=space.params(values).to_dict(),
                        message="excluded by tune.constraints" if not space.allowed(values)
                        else "a knob value of it cannot run on this machine (see the failed probe)")
                    store.tell(trial, values, m, history, reused=True)
                    reused += 1
                    if reused >= spec.tune.patience:  # converged: it has nothing new to try
                        stop_reason = f"the sampler proposed {reused} measured or excluded configs in a row"
                        break
                    continue
                reused = 0
                params = space.params(values)
                emit(TrialStart(number=trial.number, index=len(history) + 1, max_trials=most_trials,
                                refining=refining, values=values, elapsed_s=time.perf_counter() - start))
                with store.beating(trial):
                    m = probe_fn(params, trial.number)
                history.append(store.tell(trial, values, m, history))
                new_trials += 1
                best = next(iter(ranked(history)), None)
                write("running")
                refined += refining
                emit(TrialEnd(number=trial.number, index=len(history), max_trials=most_trials, refining=refining,
                              values=values, measurement=m, best=best, elapsed_s=time.perf_counter() - start,
                              mean_probe_s=(time.perf_counter() - start) / max(new_trials, 1)))
            if refined:
                stop_reason += f"; then refined: {refined} neighbour(s) of the best probed"
            history = settle()
            confirm(spec, space, store, history, probe_fn, emit)
        finally:
            if session is not None:
                session.close()  # no worker outlives the search

        if store.shared:  # what other runs measured meanwhile goes in the summary too
            history = store.history()
        summary = write(stop_reason)
        order = ranked(history, store.repeats(), spec.tune.objective)
        return TuneResult(trials=history, best=order[0] if order else None, summary=summary, output=output,
                          stop_reason=stop_reason, new_trials=new_trials)
