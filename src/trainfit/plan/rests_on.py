"""What a plan's figures rest on, in words: the probe's spread, the calibration (or why none), the
checkpoint saves, the evaluation passes, the trials left out, and what is not included."""

from __future__ import annotations

import math
from collections.abc import Mapping

from trainfit.plan.estimated import Estimated
from trainfit.plan.eval_pass import Evaluation
from trainfit.plan.inputs import Candidate, TuneRun, probe_spread
from trainfit.summary import Summary
from trainfit.template import placeholders
from trainfit.trainer.calibration import Calibration
from trainfit.trainer.written_command import NO_MAX_STEPS_HINT


def left_out(trials: Mapping[int, str]) -> str:
    """The trials a plan left out for their damaged records, as its output names them."""
    return "; ".join(f"trial {number} ({why})" for number, why in trials.items())


UNSETTLED = 0.25
"""A probe's spread past which a plan says its figure did not settle (a busy machine, or too few steps)."""


def rests_on(run: TuneRun, chosen: Candidate, calibration: Calibration | None,
              evaluation: Evaluation | None = None, estimated: Estimated | None = None) -> list[str]:
    s = run.summary
    measured = chosen.spread_rel if estimated is None or chosen.measurement is None else probe_spread(chosen.measurement)
    lines = [f"speed: trial {chosen.trial}'s probe over the epoch's own batches ({s.device or 'this device'}), "
             f"measured to +-{measured:.1%} (its step time's 95% interval and the epoch fit's largest miss)"]
    if measured > UNSETTLED:
        lines.append(f"trial {chosen.trial}'s probe did not settle (+-{measured:.0%}), so its ETA's interval is "
                     "as wide: `trainfit tune SPEC --output RUN_DIR --resume --confirm 3` re-probes the leaders "
                     "(or raise probe.max_seconds and tune again)")
    if calibration is None:
        template = s.command_template
        calibratable = bool(s.best_config and s.best_config.command) and (not template or
                                                                          "max_steps" in placeholders(template))
        how = (f"--calibrate times the trainer on this machine, not on {estimated.device}: tune there to measure "
               "it" if estimated else "run with --calibrate 50 to measure it" if calibratable else
               f"--calibrate stops your tune.command_template by its {{max_steps}}, which it lacks: {NO_MAX_STEPS_HINT}"
               if template else "--calibrate runs only the `trl sft` command trainfit writes, so here the ETA rests "
                                "on the probe alone")
        lines.append("not calibrated: the ETA is the model's step alone, a lower bound; a trainer adds its own "
                     "per-step work (measured: 0-50% of the step on a 2-core CPU, 40-110% on an H100 and an H200 with short steps, "
                     f"docs/benchmarks.md); {how}")
    else:
        lines += _calibration_lines(calibration, s, chosen)
    lines.append("checkpoint saves: the optimizer state and trained weights the probe measured, at the write speed "
                 f"timed on the disk of {run.folder} (the trainer's --output_dir may be elsewhere)")
    if evaluation is not None:
        lines.append(f"evaluation: {evaluation.samples:,} samples in {evaluation.batches:,} batches of "
                     f"{evaluation.batch_size}, one pass timed forward-only on trial {evaluation.trial} at "
                     f"{evaluation.pass_s:.3g} s (+-{evaluation.spread_rel:.1%}), applied to every config; the "
                     "trainer's own work around a pass (collation, its metrics) is not in it")
    if run.left_out:
        lines.append(f"left out: {left_out(run.left_out)}: damaged record(s) in {run.folder / 'study.journal'}, "
                     "which tune leaves out too (`tune --resume` into this folder probes such a config again "
                     "where no other trial measured it)")
    if estimated is not None:
        lines.append("not included: evaluation passes, start-up (model load, tokenization) and the trained model's "
                     f"save as the run exits: they are timed on this machine, not on {estimated.device}")
    elif calibration is None or evaluation is None:
        lines.append("not included: " + ", ".join(
            ([] if evaluation else ["evaluation passes (--eval-data prices them)"])
            + ([] if calibration else ["start-up (model load, tokenization) and the trained model's save as the run "
                                       "exits (the checkpoint saves above are priced): --calibrate measures "
                                       "them"])))
    return lines


def is_the_tunes(calibration: Calibration, s: Summary) -> bool:
    """Whether ``calibration`` is the one ``tune --calibrate`` measured (a damaged one is not: the plan
    measured its own)."""
    try:
        return s.trainer_cost is not None and calibration == Calibration.from_json(s.trainer_cost.calibration)
    except (ValueError, TypeError):
        return False


def _learned_lines(calibration: Calibration) -> list[str]:
    """What a plan learned from the run before it (``plan.learned``) rests on."""
    assert calibration.model_step_s is not None  # learned: the probe's expected step of its config
    return [f"learned from the run before ({calibration.learned_from}): its {calibration.steps:,} steps of trial "
            f"{calibration.trial} ran at {calibration.seconds_per_step:.3g} s a step where the probe expected "
            f"{calibration.model_step_s:.3g} s; the difference (at least 0), {calibration.trainer_overhead_s():.3g} s "
            f"a step of {calibration.micro_batches} micro-batch{'es' * (calibration.micro_batches != 1)}, so "
            f"{calibration.step_overhead_s(1):.3g} s a micro-batch, is added to every micro-batch, and its start-up "
            f"once ({calibration.startup_s:.0f} s, its launch to the trainer's start; --calibrate measures afresh)",
            "the run before's spread was not kept: the interval holds the probe's alone"]


def _calibration_lines(calibration: Calibration, s: Summary, chosen: Candidate) -> list[str]:
    """What a plan's trainer cost and start-ups rest on: the calibration that measured them."""
    if calibration.learned_from is not None:
        return _learned_lines(calibration)
    lines: list[str] = []
    against = (f"{calibration.seconds_per_step:.3g} s a step where the probe's cost of the very batches they "
               f"trained is {calibration.model_step_s:.3g} s" if calibration.model_step_s is not None else
               f"{calibration.ratio:.2f}x the probe's speed over the epoch (their batches not priced one by one)")
    by = " (by `trainfit tune --calibrate`)" if is_the_tunes(calibration, s) else ""
    how = ("the trainer's own time, fitted apart from the machine's drift over steps of varied cost (at "
           "least 0)" if calibration.own_step_s is not None else "the difference (at least 0)")
    lines.append(f"calibrated{by}: {calibration.steps} real trainer steps of `{calibration.command[:60]}...` ran "
                 f"at {against}; {how}, {calibration.trainer_overhead_s():.3g} s a step of "
                 f"{calibration.micro_batches} micro-batch{'es' * (calibration.micro_batches != 1)}, so "
                 f"{calibration.step_overhead_s(1):.3g} s a micro-batch, is added to every micro-batch, and the "
                 "run's start-up and end once (launch to exit less its steps: "
                 + (f"{calibration.train_startup_s:.0f} s for `trainfit train`, " if calibration.train_startup_s
                    is not None else "") + f"{calibration.startup_s:.0f} s for the written command)")
    if not math.isfinite(calibration.spread_rel):
        lines.append("the calibration's own spread could not be measured (too few steps shown): the interval "
                     "holds the probe's alone; calibrate over more steps for it")
    elif calibration.spread_rel >= 0.005:
        lines.append(f"the calibration's own spread, +-{calibration.spread_rel:.1%}, joins the probe's in the training "
                     "time's interval (the two as independent errors)")
    change = calibration.pace_change_rel
    if change is not None:
        lines.append(f"the calibration's later steps ran {abs(change):.0%} {'faster' if change < 0 else 'slower'} "
                     "than its earlier ones for their work: " + (
                         "still speeding up (as a fresh process on a GPU does), so the run's steps are likely "
                         "faster and the ETA long; calibrate over more steps to time past it" if change < 0 else
                         "the machine slowing down (or the trainer's work growing), so the ETA may be short; the "
                         "monitor corrects it as the run goes"))
    ran = calibration.trial if calibration.trial is not None else s.best_config.trial  # type: ignore[union-attr]
    if calibration.steps and chosen.trial != ran:
        lines.append(f"the calibration ran trial {ran}; its cost per micro-batch is applied to trial "
                     f"{chosen.trial} as measured, though its other batch shapes may change it")
    return lines
