"""``trainfit plan``: fit a training run into a time window, from a tune output folder; or, before the
hardware, from your own figure (``--spec --throughput``) or a tune folder scaled to another device
(``--like --device``), estimated, not measured."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainfit.cli import COMMANDS
from trainfit.cli.common import add_compare_arguments, check_eval_flags, number
from trainfit.data.analyze import analyze_spec
from trainfit.errors import TrainfitError
from trainfit.plan import MAX_EPOCHS, Plan, make_plan, plan_from_throughput
from trainfit.plan.apply import apply_option
from trainfit.plan.estimated import MAX_FIGURE
from trainfit.plan.from_compare import Winner, read_winner
from trainfit.plan.given_lengths import given_stats, parse_lengths
from trainfit.plan.inputs import best_step_cost
from trainfit.plan.outputs import PLAN_FILE, TEXT_FILE, write_plan
from trainfit.run_folder import SUMMARY_FILE, RunFolder
from trainfit.spec import load_spec
from trainfit.spec.sections import PRIORITIES, PlanSettings
from trainfit.trainer.calibration import calibrate

EPILOG = """\
examples:
  trainfit plan trainfit-runs/tiny-llama/20261124-101500 --max-hours 12 --epochs 3
  trainfit plan RUN_DIR --max-hours 8 --priority quality --calibrate 50   # real trainer steps first
  trainfit plan RUN_DIR --max-hours 2 --json                              # plan.json on stdout
  trainfit plan RUN_DIR --max-hours 12 --eval-data val.jsonl --eval-every 500   # with evaluation passes
  trainfit plan RUN_DIR --max-hours 2 --apply 1        # it does not fit: write option 1 into the plan
  trainfit plan RUN_DIR --max-hours 8 --from-compare CMP_DIR   # the comparison's best, trained the fastest way

before the hardware (estimated, not measured; written to --output):
  trainfit plan --spec spec.yaml --throughput 800 --max-hours 12 --epochs 3   # your figure, tokens/s
  trainfit plan --spec spec.yaml --throughput 800 --samples 8000 --lengths 500 --max-hours 12   # no data yet
  trainfit plan --like RUN_DIR --device H100 --max-hours 12                   # a tune's run, scaled to an H100

Priorities are rules over the configs tune measured, never fixed numbers:
  fast              the fastest config that fits
  balanced          the highest capacity (full fine-tuning, LoRA rank, max_length) within 10% of the fastest
  quality           the highest capacity whose run fits the window
  memory_efficient  the lowest peak memory within 10% of the fastest

The ETA is the epoch's real work at the measured speed plus the checkpoint saves (timed on this disk);
--calibrate N adds the trainer's own cost per micro-batch and each runner's start-up, measured by running
train_command.sh for N/5 steps as written, then `trainfit train` for N/5 + N, timing the last N (the ETA is
that runner's; the written command's is shown beside it; a tune run with --calibrate measured it already, and
the plan reuses that); a tune.command_template with {max_steps} runs twice itself, from this folder (run plan
where you ran tune: its relative paths); --eval-data adds the evaluation passes, one timed forward-only on the chosen config
(and the planned command evaluates on that set). Writes RUN_DIR/plan.json and RUN_DIR/plan.txt. Exit status: 0
when the run fits the window, 1 when it does not (the plan then lists what would, each with its ETA).

--throughput takes your figure as given: the ETA's interval is the data side's alone. --like scales each
measured config's step time by the peak FLOP/s of its device over --device's, at the MFU it measured, and
widens the training time by +-30% for the MFU the other device may reach (docs/plan.md).
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help=COMMANDS["plan"],
                       description="Plan a training run from what `trainfit tune` measured: the config a priority "
                                   "picks, its ETA with an interval, checkpoints, and what to change when it does "
                                   "not fit the window. Before the hardware: from your own figure (--spec with "
                                   "--throughput), or a tune folder scaled to another device (--like with --device); "
                                   "such a plan says it is estimated, not measured.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                   help="a `trainfit tune` output folder (holds summary.json): plan what it measured")
    p.add_argument("--like", metavar="RUN_DIR",
                   help="plan a tune folder's run on another device (--device), scaled by peak FLOP/s at its MFU")
    p.add_argument("--device", metavar="NAME", help="with --like: the device to plan for, e.g. H100, A100, L4")
    p.add_argument("--spec", metavar="SPEC", help="with --throughput or --samples-per-second: the spec whose data "
                                                  "and params the run trains (no tune needed)")
    p.add_argument("--throughput", type=number(float, above=0, at_most=MAX_FIGURE), metavar="TOKENS_PER_S",
                   help="with --spec: your figure in real (not padding) tokens per second, taken as given "
                        f"(at most {MAX_FIGURE:g})")
    p.add_argument("--samples-per-second", type=number(float, above=0, at_most=MAX_FIGURE), metavar="N",
                   help=f"with --spec: your figure in samples per second, taken as given (at most {MAX_FIGURE:g})")
    p.add_argument("--samples", type=number(int, at_least=1), metavar="N",
                   help="with --spec and a figure, before there is data: the dataset's sample count (with --lengths)")
    p.add_argument("--lengths", type=_lengths, metavar="MEAN|pNN=L,...",
                   help="with --samples: the samples' lengths in tokens, a mean (500) or percentiles "
                        "(p50=400,p90=900,p99=1500,max=2048); the spec's data is not read")
    p.add_argument("--output", metavar="DIR", help="with --spec or --like: where plan.json and plan.txt go "
                                                   "(default: a new trainfit-runs/SPEC_NAME/plan-TIMESTAMP)")
    p.add_argument("--max-hours", type=number(float, above=0, at_most=24 * 366),
                   help="the time window, in hours, at most a year (default: the spec's plan.max_hours)")
    p.add_argument("--epochs", type=number(float, above=0, at_most=MAX_EPOCHS),
                   help=f"passes over the dataset, at most {MAX_EPOCHS:,} (default: the spec's tune.epochs)")
    p.add_argument("--priority", choices=PRIORITIES,
                   help="how to choose among the measured configs (default: the spec's plan.priority, else "
                        "balanced; see below)")
    p.add_argument("--margin-minutes", type=number(float, at_least=0),
                   help="safety margin taken off the window (default: the spec's plan.margin_minutes, else 30)")
    p.add_argument("--checkpoint-minutes", type=number(float, above=0),
                   help="save a checkpoint this often (default: the spec's plan.checkpoint_minutes, else 30)")
    p.add_argument("--calibrate", type=number(int, at_least=1), metavar="N",
                   help="first run real trainer steps to measure the trainer's own cost and start-up: "
                        "train_command.sh for N/5 steps (at least 2), then `trainfit train` for N/5 + N, timing the "
                        "last N; on a GPU with padding to the longest, 100 or "
                        "more should get past a fresh process's slower first steps (docs/plan.md)")
    p.add_argument("--eval-data", metavar="PATH",
                   help="an eval set (the training data's format and fields): its passes are timed and priced")
    p.add_argument("--eval-every", type=_every, default=None, metavar="N|epoch",
                   help="evaluate every N optimizer steps, or at each epoch's end (default: epoch)")
    p.add_argument("--eval-batch-size", type=number(int, at_least=1), metavar="B",
                   help="samples per eval batch (default: the config's batch size)")
    p.add_argument("--apply", type=number(int, at_least=1), metavar="N",
                   help="write the plan with its option N applied (when the run does not fit: fewer epochs, a shorter "
                        "max_length, a subset's steps, a faster config; with room to spare: more epochs, the quality "
                        "priority's config), which `trainfit train` then runs")
    add_compare_arguments(p, "plan among the configs the tune measured that learn as it does (its learned knobs and "
                             "effective batch), trained with its learning rate and schedule")
    p.add_argument("--json", action="store_true", help="print plan.json instead of the text plan")
    p.set_defaults(run=run)


def _lengths(text: str) -> dict[str, float]:
    """``--lengths``: :func:`~trainfit.plan.given_lengths.parse_lengths`, its error as argparse's."""
    try:
        return parse_lengths(text)
    except TrainfitError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _every(text: str) -> int | None:
    """``--eval-every``: a number of optimizer steps, or ``epoch`` (None)."""
    if text == "epoch":
        return None
    try:
        return number(int, at_least=1)(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err}: give a number of optimizer steps, or 'epoch'") from None


def run(args: argparse.Namespace) -> int:

    check_eval_flags(args)
    _check_source(args)
    tunes_pick = None
    if args.run_dir is None:
        folder, plan = _estimated_plan(args)
    else:
        folder = Path(args.run_dir)
        run_folder = RunFolder(folder)  # read once, whatever asks
        plan = _measured_plan(args, run_folder)
        tunes_pick = run_folder.summary.best_config
    text = write_plan(folder, plan, epochs_given=args.epochs is not None)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print(text)
        if tunes_pick is not None and plan.trial is not None and plan.trial != tunes_pick.trial:
            how = "run the command above, or `trainfit train`," if plan.command else "run `trainfit train`"
            why = plan.rule if plan.applied is not None else f"the one priority {plan.priority} picks ({plan.rule})"
            if plan.from_compare is not None:
                why = f"{why} among the configs that learn as compare's {plan.from_compare.name} does"
            print(f"\nnote: this plan trains trial {plan.trial}, {why}, not the tune's pick, trial {tunes_pick.trial}, which train_command.sh and the tune's other files "
                  f"are written for: {how} for the planned run")
        print(f"\nwritten: {folder / PLAN_FILE}, {folder / TEXT_FILE}")
    return 0 if plan.fits else 1


def _check_source(args: argparse.Namespace) -> None:
    """One source of speed: RUN_DIR, --like RUN_DIR --device NAME, or --spec SPEC with one figure; a
    clear error naming what is wrong and the way on otherwise."""
    figure = args.throughput is not None or args.samples_per_second is not None
    ways = "give RUN_DIR (a tune folder), --like RUN_DIR --device NAME, or --spec SPEC --throughput TOKENS_PER_S"
    problems = [
        (args.throughput is not None and args.samples_per_second is not None,
         "--throughput and --samples-per-second are two figures for one speed", "give one of them"),
        (sum(x is not None for x in (args.run_dir, args.like, args.spec)) > 1,
         "give one source of the speed: RUN_DIR, --like RUN_DIR or --spec SPEC", ways),
        (args.like is not None and not args.device,
         "--like plans the run on another device, and --device names none", "add --device NAME, e.g. --device H100"),
        (args.device is not None and args.like is None,
         "--device names the device --like plans a tune folder's run for", "add --like RUN_DIR, or drop --device"),
        (args.spec is not None and not figure, "--spec plans its data at your figure, and none was given",
         "add --throughput TOKENS_PER_S or --samples-per-second N"),
        (figure and args.spec is None, "--throughput and --samples-per-second plan a spec's data at your figure",
         "add --spec SPEC (a tune folder has measured speeds: plan RUN_DIR without a figure)"),
        (args.run_dir is None and (args.calibrate or args.eval_data),
         "--calibrate and --eval-data time this machine's trainer and model, not the run's device",
         "drop them from a plan before the hardware"),
        (args.run_dir is None and args.like is None and args.spec is None, "nothing to plan from", ways),
        ((args.samples is None) != (args.lengths is None), "a dataset given by numbers needs both its sample count "
         "and its lengths", "give --samples N and --lengths MEAN (or percentiles: p50=400,p99=1500,max=2048)"),
        (args.samples is not None and args.spec is None, "--samples and --lengths describe the data of a plan from "
         "your figure", "add --spec SPEC --throughput TOKENS_PER_S (a tune folder counted its data)"),
        (args.run_dir is not None and args.output is not None,
         "a plan of RUN_DIR is written into it, where `trainfit train` reads it", "drop --output"),
        (args.config is not None and args.from_compare is None, "--config names a config of a comparison",
         "add --from-compare DIR (a `trainfit compare` output folder)"),
        (args.from_compare is not None and args.spec is not None, "--from-compare picks among the configs a tune "
         "measured, and --spec plans the spec's config at your figure", "plan RUN_DIR --from-compare DIR"),
    ]
    for wrong, problem, fix in problems:
        if wrong:
            raise TrainfitError(problem, fix)


def _estimated_plan(args: argparse.Namespace) -> tuple[Path, Plan]:
    """A plan before the hardware (--spec with a figure, or --like), and the folder it goes to."""
    if args.like is not None:
        run = RunFolder(args.like)
        common = _settings(args, run.summary.spec.plan)
        folder = _output(args, run.summary.spec.source or args.like)
        plan = _applied(args, lambda trial=None: make_plan(run, device=args.device, trial=trial, winner=_winner(args),
                                                           **common))
        folder.mkdir(parents=True, exist_ok=True)
        return folder, plan
    spec = load_spec(args.spec)
    common = _settings(args, dataclasses.asdict(spec.plan))
    if args.samples is not None:
        stats = given_stats(args.samples, args.lengths)
    elif spec.data is None:
        raise TrainfitError(f"{args.spec} has no data section: a plan counts the samples and lengths it trains",
                            "add data: {path: ..., text_field: ...} to the spec (docs/spec.md), or give its "
                            "numbers: --samples N --lengths MEAN")
    else:
        stats = analyze_spec(spec, progress=not args.json)
    folder = _output(args, args.spec)
    plan = plan_from_throughput(spec, stats, folder, tokens_per_second=args.throughput,
                                samples_per_second=args.samples_per_second, **common)  # it makes the folder
    return folder, _applied(args, lambda trial=None: plan)  # at your figure: no faster config to plan


def _output(args: argparse.Namespace, spec_path: str) -> Path:
    """--output, or a new trainfit-runs/SPEC_NAME/plan-TIMESTAMP (not made here); never a tune folder,
    whose plan.json `trainfit train` runs against."""
    folder = Path(args.output) if args.output else (
        Path("trainfit-runs") / Path(spec_path).stem / _dt.datetime.now().strftime("plan-%Y%m%d-%H%M%S"))
    if (folder / SUMMARY_FILE).is_file():
        raise TrainfitError(f"{folder} is a tune folder: an estimated plan there would stand in for its measured "
                            "one, which `trainfit train` runs against", "give another --output")
    return folder


def _measured_plan(args: argparse.Namespace, run: RunFolder) -> Plan:
    """The plan of what the tune folder ``run`` measured (calibrated first with --calibrate)."""
    folder = run.path
    common = _settings(args, _recorded_plan(run))  # a window missing is said before a calibration runs
    winner = _winner(args)  # and a comparison that cannot be read
    calibration = None
    if args.calibrate:
        what = "your tune.command_template" if run.summary.command_template else folder / "train_command.sh"
        print(f"calibrating: {args.calibrate} real trainer steps of {what} ...", file=sys.stderr,
              flush=True)  # stderr: --json keeps stdout for the plan
        calibration = calibrate(run, args.calibrate, step_cost=best_step_cost(run),
                                on_progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    return _applied(args, lambda trial=None: make_plan(
        run, calibration=calibration, eval_data=args.eval_data, eval_every=args.eval_every,
        eval_batch_size=args.eval_batch_size, trial=trial, winner=winner, **common))


def _winner(args: argparse.Namespace) -> Winner | None:
    return read_winner(args.from_compare, args.config) if args.from_compare is not None else None


def _recorded_plan(run: RunFolder) -> Mapping[str, Any]:
    """The ``plan:`` section the tune in ``run`` recorded; empty where its summary cannot be read yet
    (the plan then says what is wrong with the folder, a running tune, a missing one)."""
    try:
        return run.summary.spec.plan
    except TrainfitError:
        return {}


def _settings(args: argparse.Namespace, section: Mapping[str, Any]) -> dict[str, Any]:
    """The window, priority, margin and checkpoint interval: each flag given, else the spec's ``plan:``
    ``section`` (a tune folder's: as the tune recorded it), else the default; and ``--epochs`` (None:
    the spec's ``tune.epochs``)."""
    defaults = dataclasses.asdict(PlanSettings())
    settings = {key: next((v for v in (getattr(args, key), section.get(key)) if v is not None), defaults[key])
                for key in defaults}
    if settings["max_hours"] is None:
        raise TrainfitError("no time window: a plan fits the run into one",
                            "give --max-hours H, or plan: {max_hours: H} in the spec (docs/plan.md)")
    return {**settings, "epochs": args.epochs}


def _applied(args: argparse.Namespace, plan_of: Callable[..., Plan]) -> Plan:
    """``plan_of()``, the plan the flags ask for, with its option ``--apply N`` applied where given
    (``plan_of(trial)`` plans a faster config's run)."""
    plan = plan_of()
    return plan if args.apply is None else apply_option(plan, args.apply, plan_of)
