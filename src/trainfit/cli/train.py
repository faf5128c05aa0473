"""``trainfit train``: run the measured config for real, checkpointed, resumable, on the plan's clock."""

from __future__ import annotations

import argparse
import json
import shlex
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.cli import COMMANDS
from trainfit.cli.common import add_compare_arguments, number
from trainfit.errors import TrainfitError
from trainfit.format import format_duration, table
from trainfit.train import TrainOptions, train
from trainfit.train.finals import FINALS_FILE, MOST, train_finals

if TYPE_CHECKING:
    from trainfit.train.records import TrainResult

EPILOG = """\
examples:
  trainfit train RUN_DIR                                  # trains into RUN_DIR/train
  trainfit train RUN_DIR --output runs/final --resume     # after a crash, kill -9, preemption or Ctrl-C
  trainfit train RUN_DIR --deadline                       # stop with a checkpoint before the plan's window ends
  trainfit train RUN_DIR --max-steps 100                  # a short run first
  trainfit train RUN_DIR -- --logging_steps 10 --report_to tensorboard   # more `trl sft` arguments
  trainfit train RUN_DIR --from-compare CMP_DIR --config wide   # a compare winner, the fastest way measured
  trainfit train RUN_DIR --from-compare CMP_DIR --top 3          # its 3 best to completion, then the pick

What trains: the config RUN_DIR/plan.json chose (`trainfit plan`), else the fastest one (with
--from-compare: the fastest that learns as the compare config, with its training values): a Hugging
Face model with the written `trl sft` arguments, by TRL's own trainer in this process; a factory
model in trainfit's loop on the probe's step (its factory's collate feeds it the rows); a spec's
tune.command_template as a child process, told the plan, output, resume and deadline through
TRAINFIT_* variables (its checkpoints are its own).
Checkpoints: every --checkpoint-minutes (default: the plan's, else 30) and at the end; a save
counts once its last file is on disk, so a crash mid-save leaves the previous one usable. The
newest --keep are kept. --resume continues from the last complete one: optimizer, scheduler, RNG
and the data position restored, no sample repeated or skipped; it refuses when the arguments
differ from the first start's, and names them. SIGTERM or Ctrl-C: a checkpoint, then exit
(143 / 130); resume later (a second Ctrl-C stops at once, without the save: the resume starts from
the last complete checkpoint). With a plan, an on-track line every --monitor-seconds.

Writes to the output folder: train.json, checkpoint-STEP/, train_log.jsonl (one JSON object per
log, checkpoint and stop), the trained model, train_result.json; and RUN_DIR/actual.json (the
actual time against the plan's ETA) when a planned run finishes.
Exit status: 0 finished, 2 bad input (a clear error, nothing lost), 3 stopped by the deadline,
4 stopped at a loss that is not finite (no save), 130/143/129 stopped by Ctrl-C/SIGTERM/SIGHUP.
"""

STOP_STATUS = {"deadline": 3, "diverged": 4, **{s.name: 128 + s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}}
"""The exit status of a run stopped by ``TrainResult.stopped_by`` (a SIGHUP's was 1 before it was listed)."""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("train", help=COMMANDS["train"],
                       usage="trainfit train RUN_DIR [options] [-- TRL_ARGS ...]",
                       description="Train the config a tune folder measured (or its plan chose), with checkpoints, "
                                   "resume and the on-track check against the plan.",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a `trainfit tune` output folder (holds summary.json)")
    p.add_argument("--output", help="where the run, its checkpoints and model go (default: RUN_DIR/train)")
    p.add_argument("--resume", action="store_true", help="continue the run in --output from its last complete checkpoint")
    p.add_argument("--checkpoint-minutes", type=number(float, above=0),
                   help="save a checkpoint this often (default: the plan's, else 30)")
    p.add_argument("--max-steps", type=number(int, at_least=1), metavar="N",
                   help="stop after N optimizer steps, over as many epochs as they take (default: the plan's "
                        "epochs, else the command's)")
    p.add_argument("--loop", action="store_true",
                   help="a factory model: train in trainfit's loop even when the spec has a tune.command_template")
    p.add_argument("--keep", type=number(int, at_least=1), default=2, help="complete checkpoints kept (default: 2)")
    p.add_argument("--deadline", type=number(float, above=0), nargs="?", const=0.0, metavar="HOURS",
                   help="stop with a checkpoint before HOURS after the first start (no value: the plan's window)")
    p.add_argument("--monitor-seconds", type=number(float, above=0), default=60.0,
                   help="seconds between on-track lines, with a plan (default: 60)")
    add_compare_arguments(p, "train the fastest config the tune measured that learns as it does, with its learning "
                             "rate and schedule (a plan must carry it: plan --from-compare)")
    p.add_argument("--top", type=number(int, at_least=2, at_most=MOST), metavar="N",
                   help="with --from-compare: run the comparison's N best to completion, one after another, into "
                        "OUTPUT/NAME (default RUN_DIR/finals), then pick the lowest final loss (guide 001's phase 4)")
    p.add_argument("--record-batches", metavar="FILE",
                   help="append each training micro-batch's padded length to FILE, one a line (a `trl sft` run; "
                        "`plan --calibrate` prices the steps it times by them)")
    p.set_defaults(run=run, passed_on=[])  # after --: more `trl sft` arguments (see the examples)


def run(args: argparse.Namespace) -> int:

    if (args.config is not None or args.top) and args.from_compare is None:
        raise TrainfitError("--config and --top name configs of a comparison", "add --from-compare DIR")
    if args.config is not None and args.top:
        raise TrainfitError("--config trains one config and --top the comparison's best few", "give one of them")
    options = TrainOptions(
        resume=args.resume, checkpoint_minutes=args.checkpoint_minutes, keep=args.keep,
        deadline_hours=args.deadline or None, use_plan_deadline=args.deadline == 0.0, extra_args=args.passed_on,
        max_steps=args.max_steps, loop=args.loop, monitor_every_s=args.monitor_seconds,
        from_compare=args.from_compare, compare_config=args.config, record_batches=args.record_batches)
    if args.top:
        return _finals(args, options)
    output = Path(args.output) if args.output else Path(args.run_dir) / "train"
    result = train(args.run_dir, output, options)
    print(json.dumps(result.to_json(), indent=2))
    if result.status == "finished":
        print(f"\ntrained: {output}{_steps(result)}")
        return 0
    if result.at_once:  # no save; the resume starts from the last complete checkpoint
        print(f"\nstopped by {result.stopped_by} at once, {_lost(result)}; continue: {result.resume}")
        return STOP_STATUS.get(result.stopped_by or "", 1)
    if result.stopped_by == "diverged":  # no save: a resume starts from the last checkpoint, before it
        print(f"\nstopped: the loss is not finite{_steps(result)}; the last checkpoint is from before it. Train "
              "again into a new --output with a lower learning rate (-- --learning_rate X), or in bf16 rather than "
              "fp16: a resume repeats the same steps")
        return STOP_STATUS["diverged"]
    saved = ", with a checkpoint" if result.step is not None else " (your trainer was told; its checkpoints are its own)"
    print(f"\nstopped by {result.stopped_by}{_steps(result)}{saved}; continue: {result.resume}")
    return STOP_STATUS.get(result.stopped_by or "", 1)


def _finals(args: argparse.Namespace, options: TrainOptions) -> int:
    """``--top N``: the comparison's N best to completion, set side by side (:mod:`trainfit.train.finals`)."""
    output = Path(args.output) if args.output else Path(args.run_dir) / "finals"
    finals = train_finals(Path(args.run_dir), Path(args.from_compare), args.top, output, options, train)
    print(table([(f.name, f.status, f"{f.step}/{f.max_steps}", format_duration(f.elapsed_s),
                  "" if f.loss is None else f"{f.loss:.4g}") for f in finals.finals],
                ["final", "status", "steps", "elapsed", "final loss"]))
    if finals.pick is not None:
        print(f"\nfinal pick: {finals.pick}, by {finals.pick_by}; written: {output / FINALS_FILE}")
        return 0
    last = finals.finals[-1]
    print(f"\nstopped at {last.name} ({last.status}); continue: trainfit train {shlex.quote(args.run_dir)} --from-compare "
          f"{shlex.quote(args.from_compare)} --top {args.top} --output {shlex.quote(str(output))} --resume")
    return 1


def _steps(result: TrainResult) -> str:
    """Where the run got to, of how many steps (none said for your own command's run: its steps are its own)."""
    if result.step is None:
        return ""
    return f" (step {result.step:,}" + (f" of {result.max_steps:,})" if result.max_steps is not None else ")")


def _lost(result: TrainResult) -> str:
    """What a stop at once (no save) lost: nothing before the first step (the run was starting up;
    its total steps are not known then), else the steps since the last complete checkpoint."""
    if result.before_first_step:
        return "before its first step: nothing was lost"
    if result.step:
        return f"without a save: the last checkpoint is at step {result.step:,}, the steps after it are lost"
    return "without a save: no checkpoint was saved, the steps trained are lost"
