"""``trainfit plan``: fit a training run into a time window, from a tune output folder."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainfit.cli import COMMANDS
from trainfit.cli.common import check_eval_flags, number
from trainfit.plan import MAX_EPOCHS, make_plan
from trainfit.plan.choose import PRIORITIES
from trainfit.plan.inputs import best_step_cost
from trainfit.plan.outputs import PLAN_FILE, TEXT_FILE, write_plan
from trainfit.run_folder import RunFolder
from trainfit.trainer.calibration import calibrate

EPILOG = """\
examples:
  trainfit plan trainfit-runs/tiny-llama/20261124-101500 --max-hours 12 --epochs 3
  trainfit plan RUN_DIR --max-hours 8 --priority quality --calibrate 50   # real trainer steps first
  trainfit plan RUN_DIR --max-hours 2 --json                              # plan.json on stdout
  trainfit plan RUN_DIR --max-hours 12 --eval-data val.jsonl --eval-every 500   # with evaluation passes

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
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plan", help=COMMANDS["plan"],
                       description="Plan a training run from what `trainfit tune` measured: the config a priority "
                                   "picks, its ETA with an interval, checkpoints, and what to change when it does "
                                   "not fit the window.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a `trainfit tune` output folder (holds summary.json)")
    p.add_argument("--max-hours", type=number(float, above=0, at_most=24 * 366), required=True,
                   help="the time window, in hours (at most a year)")
    p.add_argument("--epochs", type=number(float, above=0, at_most=MAX_EPOCHS),
                   help=f"passes over the dataset, at most {MAX_EPOCHS:,} (default: the spec's tune.epochs)")
    p.add_argument("--priority", choices=PRIORITIES, default="balanced",
                   help="how to choose among the measured configs (default: balanced; see below)")
    p.add_argument("--margin-minutes", type=number(float, at_least=0), default=30.0,
                   help="safety margin taken off the window (default: 30)")
    p.add_argument("--checkpoint-minutes", type=number(float, above=0), default=30.0,
                   help="save a checkpoint this often (default: 30)")
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
    p.add_argument("--json", action="store_true", help="print plan.json instead of the text plan")
    p.set_defaults(run=run)


def _every(text: str) -> int | None:
    """``--eval-every``: a number of optimizer steps, or ``epoch`` (None)."""
    if text == "epoch":
        return None
    try:
        return number(int, at_least=1)(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(f"{err}: give a number of optimizer steps, or 'epoch'") from None


def run(args: argparse.Namespace) -> int:

    folder = Path(args.run_dir)
    run = RunFolder(folder)  # read once, whatever asks
    check_eval_flags(args)
    calibration = None
    if args.calibrate:
        what = "your tune.command_template" if run.summary.command_template else folder / "train_command.sh"
        print(f"calibrating: {args.calibrate} real trainer steps of {what} ...", file=sys.stderr,
              flush=True)  # stderr: --json keeps stdout for the plan
        calibration = calibrate(run, args.calibrate, step_cost=best_step_cost(run),
                                on_progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True))
    plan = make_plan(run, max_hours=args.max_hours, epochs=args.epochs, priority=args.priority,
                     margin_minutes=args.margin_minutes, checkpoint_minutes=args.checkpoint_minutes,
                     calibration=calibration, eval_data=args.eval_data, eval_every=args.eval_every,
                     eval_batch_size=args.eval_batch_size)
    text = write_plan(folder, plan, epochs_given=args.epochs is not None)
    if args.json:
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print(text)
        print(f"\nwritten: {folder / PLAN_FILE}, {folder / TEXT_FILE}")
    return 0 if plan.fits else 1
