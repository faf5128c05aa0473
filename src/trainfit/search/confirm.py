"""After the search: ``--refine``'s neighbours of the best config, and ``--confirm N``'s re-probes of
the best and its closest runners-up, interleaved so that a drift of the machine hits them alike."""

from __future__ import annotations

from typing import Any

from trainfit.search.events import ConfirmEnd, ConfirmStart
from trainfit.search.options import EventFn, ProbeFn
from trainfit.search.ranking import ranked, within_noise
from trainfit.search.study import TrialStore
from trainfit.search.trials import Trial, config_key
from trainfit.space import SearchSpace
from trainfit.spec import Spec

CONFIRM_MAX = 4  # configs re-probed by --confirm: the best and its three closest runners-up


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

