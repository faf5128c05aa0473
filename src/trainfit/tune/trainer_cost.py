"""The trainer's own cost folded into a finished search's ranking (``tune --calibrate N``, and by default
on a GPU): the probes' pick timed on the real trainer, every config ranked again with that cost, and
where that moves the pick to a config the trainer never ran, that one timed too, so the pick rests on
two real runs, not on the one config's cost carried over."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.probe.estimate import shapes_step_cost
from trainfit.run_folder import TRAINER_COST_FILE, RunFolder
from trainfit.tune.options import TuneOptions, TuneResult, best_trial
from trainfit.search.trials import jsonable
from trainfit.summary import Summary, TrainerCost
from trainfit.trainer.calibration import calibrate
from trainfit.trainer.written_command import FALLBACK_HINT

Say = Callable[[str], None] | None


def calibrated(result: TuneResult, steps: int, options: TuneOptions,
               rewrite: Callable[[TrainerCost], Summary]) -> TuneResult:
    """``result`` ranked with the trainer's cost: its pick's (:func:`time_pick`; kept from the
    folder where :func:`reused` says so), and where the ranking with it picks a config the trainer
    did not run, that config's too (:meth:`TrainerCost.joined`). ``rewrite``: the outputs written
    again with a cost (``trainer_cost.json`` is written here). A calibration nobody asked for
    (``options.calibration_optional``) that fails, or a second one that fails, leaves the ranking as
    it stood, with a note in ``options.on_calibration``; an asked-for first one raises."""
    say = options.on_calibration
    try:
        cost = reused(result, say) if options.calibration_optional else None
        cost = cost or time_pick(result, steps, say)
    except Exception as err:  # noqa: BLE001 - a default calibration never fails a search that succeeded
        if not options.calibration_optional:
            raise
        _note(say, "not calibrated, the ranking rests on the probes alone", err, result)
        return result
    result = _ranked_with(result, cost, rewrite)
    if result.best is None or any(m["trial"] == result.best.number for m in cost.timed()):
        return result
    moved = result.best.number
    if say is not None:
        say(f"the trainer's cost moves the pick to trial {moved}, which the trainer has not run: timing it too")
    try:
        second = time_pick(result, steps, say)
    except Exception as err:  # noqa: BLE001 - the first calibration stands
        _note(say, f"the pick stays trial {moved}, ranked by trial {cost.trial}'s trainer cost, as its own "
                   "calibration failed", err, result)
        return result
    joined = cost.joined(second)
    picked = _ranked_with(result, joined, rewrite, write_cost=False).best  # the ranking: by each one's own cost
    tops = {c.trial: c for c in (cost, second)}
    if picked is not None and picked.number in tops and picked.number != second.trial:  # its calibration on top
        top = tops[picked.number]
        joined = dataclasses.replace(joined, trial=top.trial, searched=top.searched, calibration=top.calibration)
    result = _ranked_with(result, joined, rewrite)
    if say is not None and result.best is not None:
        untimed = not any(m["trial"] == result.best.number for m in joined.timed())
        say(f"each ranked by its own trainer cost (trials {cost.trial} and {second.trial}): the pick is trial "
            f"{result.best.number}" + (", ranked by their pooled cost (the trainer has not run it; a --resume times "
                                       "it)" if untimed else ""))
    return result


def _ranked_with(result: TuneResult, cost: TrainerCost, rewrite: Callable[[TrainerCost], Summary], *,
                 write_cost: bool = True) -> TuneResult:
    """``result`` with its outputs written again, ranked with ``cost`` (kept in ``trainer_cost.json``
    unless not ``write_cost``)."""
    if write_cost:
        write_atomically(result.output / TRAINER_COST_FILE, json.dumps(cost.to_json(), indent=2) + "\n")
    summary = rewrite(cost)
    return dataclasses.replace(result, summary=summary, best=best_trial(result.trials, summary))


def _note(say: Say, what: str, err: Exception, result: TuneResult) -> None:
    if say is not None:
        why = err.message if isinstance(err, TrainfitError) else (
            f"{type(err).__name__}: {err} (a trainfit bug: please report it with {result.output})")
        say(f"note: {what}: {why}")


def reused(result: TuneResult, say: Say) -> TrainerCost | None:
    """The trainer cost a calibration nobody asked for can keep: the folder's, where it timed the very
    config the probes pick again (a ``--resume`` that probed nothing better), on a device of the same
    name; None: calibrate."""
    assert result.best is not None
    try:
        stored = RunFolder(result.output).trainer_cost
    except TrainfitError:  # damaged: timed again, and written anew
        return None
    if stored is None or stored.calibration.get("device") != result.summary.device:  # a resume on another GPU
        return None
    pick = (result.best.number, jsonable(result.best.values))
    if not any((m["trial"], m["searched"]) == pick for m in stored.timed()):
        return None
    if say is not None:
        trials = " and ".join(str(m["trial"]) for m in stored.timed())
        say(f"kept: the trainer's cost timed on trial {trials}, the probes' pick still ({TRAINER_COST_FILE}; "
            "--calibrate N times it again)")
    return stored


def time_pick(result: TuneResult, steps: int, on_progress: Say) -> TrainerCost:
    """The calibration of ``result``'s pick (the config its outputs' command trains), as the trainer's
    cost per micro-batch."""
    assert result.best is not None
    m = result.best.measurement
    try:
        calibration = calibrate(result.output, steps, on_progress=on_progress,
                                step_cost=shapes_step_cost(m.shape_times, m.data_wait_s or 0.0, m.first_sight_s or 0.0))
    except TrainfitError as err:  # the search's outputs stand, ranked by the probes alone
        raise TrainfitError(f"the search ended and wrote its outputs (ranked by the probes alone), then its "
                            f"calibration failed: {err.message}",
                            "; ".join(part for part in ((err.hint or "").replace(FALLBACK_HINT, "tune without "
                                                                                                 "--calibrate"),
                                                        "once fixed, the same command with --resume calibrates "
                                                        "again without probing anything again") if part)) from None
    searched = jsonable(result.best.values)
    own = {"trial": result.best.number, "searched": searched, "config": {k: m.config.get(k) for k in searched},
           "per_micro_batch_s": calibration.step_overhead_s(1), "micro_batches": calibration.micro_batches}
    return TrainerCost(per_micro_batch_s=calibration.step_overhead_s(1), trial=result.best.number, searched=searched,
                       calibration=calibration.to_json(), measured=[own])
