"""``trainfit tune``: search for the fastest configuration that fits the memory budget."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from trainfit.cli import COMMANDS, interrupt_behind
from trainfit.cli.common import (
    add_spec_arguments,
    interrupted,
    knobs_help,
    number,
    resume_command,
    spec_from_args,
    stats_from_args,
)
from trainfit.cli.tune_render import TuneView, print_result
from trainfit.devices import resolve_device_name
from trainfit.errors import TrainfitError, os_error
from trainfit.format import table
from trainfit.space import EFFECTIVE_BATCH, learning_knobs
from trainfit.spec import STRATEGIES, Spec, unused_lora_note, with_tune
from trainfit.spec.yaml_input import parse_override
from trainfit.tune import TunePlan, calibration_steps, resolve, run_tune
from trainfit.tune.options import TuneOptions
from trainfit.tune.budgets import HEADER, parse_budgets, tune_budgets
from trainfit.tune.levers import PADDING_SHARE, trainer_takes
from trainfit.tune.outputs import run_samples

EPILOG = """\
exit status: 0 a config fits (see summary.json), 1 nothing fits, 2 bad usage/spec or a file that cannot
be written, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM: a cluster's preemption or time limit),
129 the terminal closed (SIGHUP); --resume continues.

examples:
  trainfit tune examples/tiny-llama.yaml --quick                 # 6 probes
  trainfit tune examples/tiny-llama.yaml --memory-gb 22 --max-trials 20 --output runs/llama
  trainfit tune examples/tiny-llama.yaml --resume                # the latest run, after Ctrl-C or a crash
  trainfit tune spec.yaml --strategy bayes --time-budget 3600 --refine
  trainfit tune spec.yaml --confirm 2                            # re-probe near-ties on a noisy machine
  trainfit tune spec.yaml --storage postgresql://host/db --join  # the same on every machine: one search
  trainfit tune spec.yaml --budgets 8,12,16,24                   # the fastest config for each GPU size
  trainfit tune spec.yaml --calibrate 30                         # rank by the trainer's speed, not the model's

The search space is the spec's `search:` section (same keys as `params:`; a list = choices,
{low, high, log} = a range). Outputs in --output (default trainfit-runs/SPEC_NAME/TIMESTAMP):
summary.json, trials.csv, report.html (speed and memory by batch size, per family), train_command.sh
(with trl_data.yaml, the data config of its `trl sft`), the same config as training_args.json (your
own Trainer), axolotl.yaml and, for several GPUs, accelerate_config.yaml; study.journal (every trial,
as it ends) and probes/ (each probe's request, log and result).
--resume without --output continues the latest run.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("tune", help=COMMANDS["tune"],
                       description="Probe configurations of the spec's search space, learning the memory "
                                   "boundary from OOMs, and report the fastest that fits with a ready-to-run command.",
                       epilog=EPILOG + "\n" + knobs_help(), formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)  # the resume hint repeats the flags as typed: each in full
    add_spec_arguments(p)
    p.add_argument("--output", help="output folder (default: a new trainfit-runs/SPEC_NAME/TIMESTAMP)")
    p.add_argument("--resume", action="store_true",
                   help="continue the study in --output (default: the latest run of this spec)")
    p.add_argument("--storage", metavar="URL",
                   help="a database URL (postgresql://..., with trainfit[postgres]) or a PATH.journal file (runs "
                        "on one machine) instead of the output folder's journal file; runs that share it split "
                        "the search and never probe a config twice (see --join)")
    p.add_argument("--join", action="store_true",
                   help="with --storage: start the study, or join it if another machine already did "
                        "(one command for every machine of a job array)")
    p.add_argument("--strategy", choices=STRATEGIES, help="default: the spec's (auto)")
    p.add_argument("--max-trials", type=number(int, at_least=1), help="probes at most")
    p.add_argument("--time-budget", type=number(float, above=0), metavar="SECONDS",
                   help="start no probe after this long")
    p.add_argument("--quick", action="store_true", help="at most 6 probes")
    p.add_argument("--refine", action="store_true",
                   help="then probe the neighbours of the best config (one grid step in one knob), beyond "
                        "--max-trials/--quick: a local search until the best's neighbours are all measured")
    p.add_argument("--confirm", type=number(int, at_least=0), metavar="N",
                   help="then probe the best and the runners-up within its measurement noise or within "
                        "tune.confirm_margin (default 5%%) N more times each, interleaved, and rank them by their "
                        "median (tune.confirm_rounds; for noisy or shared machines)")
    p.add_argument("--budgets", metavar="GIB,GIB,...",
                   help="a matrix: search under the largest budget, then each smaller one with every config "
                        "measured so far taken as measured (judged against it), probing only what is new; "
                        "each budget's outputs in OUTPUT/budget-<N>gb, the matrix in OUTPUT/budgets.json")
    p.add_argument("--calibrate", type=number(int, at_least=0), metavar="N",
                   help="then run the written `trl sft` command for N/5 real steps (at least 2), and `trainfit "
                        "train` for N/5 + N, timing its last N: the trainer's own cost beyond the model's step "
                        "(its data loader, "
                        "scheduler, metrics); add it to every config's steps, rank again and write the command "
                        "for the new pick (trainer_cost.json; `trainfit plan` reuses it). Default: 30 on a GPU "
                        "(where that cost is as large as the step), none on a CPU; 0: none")
    p.add_argument("--quiet", action="store_true", help="only the final report")
    p.set_defaults(run=run)


def output_folder(args: argparse.Namespace) -> Path:
    """--output, or a fresh timestamped folder per run; --resume alone takes the latest one."""
    if args.output:
        return Path(args.output)
    base = Path("trainfit-runs") / Path(args.spec).stem
    if args.resume:
        runs = sorted(p for p in base.glob("*") if (p / "study.journal").exists()) if base.is_dir() else []
        if not runs:
            raise TrainfitError(f"no earlier run of {args.spec} under {base} to resume",
                                "pass --output FOLDER, or drop --resume")
        return runs[-1]
    return base / datetime.now().strftime("%Y%m%d-%H%M%S")


def saved_where(args: argparse.Namespace, output: Path) -> str:
    """Where an interrupted or failed tune kept its trials, in words."""
    return f"every finished trial is saved in {args.storage or output}"


def check_sets_not_searched(overrides: list[str], spec: Spec) -> None:
    """A ``--set`` of a knob the spec's ``search:`` searches changes nothing the tune probes (each of
    its configs sets that knob itself): refused, naming both, where it was silently overridden."""
    for text in overrides:
        key, _ = parse_override(text)
        name = key.removeprefix("params.")
        if key.startswith("params.") and spec.search is not None and (dim := spec.search.dim(name)) is not None:
            raise TrainfitError(
                f"--set {text}, but the spec's search: section searches {name} over {list(dim.grid_values())}: every "
                f"config the tune probes sets its own {name}, so this --set would change nothing",
                f"to fix {name}, take it out of the search (give search: without it, e.g. --set 'search={{...}}'), or "
                f"drop the --set; to search other values of it, list them in search:")


def run(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    check_sets_not_searched(args.overrides, spec)
    output = output_folder(args)
    stats = stats_from_args(args, spec, progress=not args.quiet)
    if args.calibrate and args.budgets:
        raise TrainfitError("--calibrate and --budgets together: a calibration times one folder's written command",
                            "tune with --budgets, then `trainfit plan BUDGET_FOLDER --calibrate N` on the budget "
                            "you train with")
    # The flags' run limits go into the spec's tune: section, the one channel the search reads.
    spec = with_tune(spec, strategy=args.strategy, max_trials=args.max_trials, time_budget_s=args.time_budget,
                     confirm_rounds=args.confirm)
    options = TuneOptions(output=output, stats=stats, resume=args.resume, join=args.join, storage=args.storage,
                          quick=args.quick, refine=args.refine,
                          on_event=TuneView(args.quiet, spec.tune.objective, run_samples(spec, stats),
                                            spec.tune.epochs),
                          # --budgets calibrates no folder, and without --calibrate 0 a kept trainer cost still ranks
                          calibrate_steps=0 if args.budgets else args.calibrate,
                          calibration_optional=bool(args.budgets) and args.calibrate is None,
                          on_calibration=_calibration_note if args.quiet else _calibration_line)
    try:
        plan = resolve(spec, options)
        print_plan(args, plan)
        if args.budgets:
            return run_budgets(args, plan)
        result = run_tune(plan)
    except KeyboardInterrupt as err:
        return interrupted(err, args.argv, output, saved_where(args, output))
    except OSError as err:  # a full disk mid-run: the study keeps every trial that ended
        if (interrupt := interrupt_behind(err)) is not None:  # a Ctrl-C inside the journal's lock
            print(f"while stopping: {os_error(err)}", file=sys.stderr)
            return interrupted(interrupt, args.argv, output, saved_where(args, output))
        print(f"trainfit tune: error: {os_error(err)}\n{saved_where(args, output)}; continue with\n  "
              f"{resume_command(args.argv, output)}", file=sys.stderr)
        return 2
    return print_result(result, plan.spec)


def print_plan(args: argparse.Namespace, plan: TunePlan) -> None:
    """What the tune will search, before its first probe."""
    spec, stats = plan.spec, plan.options.stats
    assert spec.search is not None, "resolve gives every plan a search space"
    if plan.default_search:
        grouping = ("; length grouping too: random batches of this data are more than "
                    f"{PADDING_SHARE:.0%} padding" if "group_by_length" in spec.search.names else "")
        if spec.batch_open:
            print(f"no search: section in {args.spec}, and no batch_size, gradient_accumulation_steps or "
                  f"tune.target_effective_batch: searching {', '.join(spec.search.names)} with the batch left open, "
                  f"up to what fits (accumulation {spec.params.gradient_accumulation_steps}: the effective batch is the "
                  "pick's batch, and it changes what is learned; set tune.target_effective_batch to keep one)"
                  + grouping)
        else:
            print(f"no search: section in {args.spec}: searching {', '.join(spec.search.names)} at the effective "
                  f"batch {spec.search.target_effective_batch} (raise it with tune.target_effective_batch, or give a "
                  "search: section)" + grouping)
    print(f"trainfit tune: {spec.source} -> {plan.options.output}")
    if stats is not None:
        print(f"data: {stats.headline()}")
    print(f"space: {', '.join(f'{d.name} {list(d.grid_values())}' for d in spec.search.dims)}; "
          f"{spec.budget.describe()}")
    if (lora_note := unused_lora_note(spec)) is not None:
        print(f"note: {lora_note}")
    if plan.default_search and trainer_takes(spec, "packing") and not spec.params.packing:
        print("aside: packing, which changes what is learned: " + (
            "not measured with --quick" if plan.options.quick else
            f"measured on the pick once the search ends, where its batches are more than {PADDING_SHARE:.0%} padding"))
    if EFFECTIVE_BATCH in learning_knobs(spec.search) and not (plan.default_search and spec.batch_open):  # said above
        print("effective batch: differs between configs (no tune.target_effective_batch, or one that a batch size "
              "over its processes passes) and changes what is learned; the summary gives the fastest per effective "
              "batch (set tune.target_effective_batch, at least every batch size x processes, to compare every "
              "config at one)")
    if args.budgets and args.calibrate is None and \
            calibration_steps(spec, resolve_device_name(spec.probe.device), None)[0]:
        print("note: not calibrated (--budgets: a calibration times one folder's written command); the ranking rests "
              "on the probes alone: `trainfit plan BUDGET_FOLDER --calibrate 30` times the budget you train with")


def _calibration_line(line: str) -> None:
    print(line if line.startswith("note:") else f"  calibration: {line}", flush=True)


def _calibration_note(line: str) -> None:
    """With --quiet: only a calibration's note (a default one that failed), not its progress."""
    if line.startswith("note:"):
        print(line, flush=True)


def run_budgets(args: argparse.Namespace, plan: TunePlan) -> int:
    """``--budgets``: one search per budget, sharing what is measured; the matrix at the end."""
    budgets = parse_budgets(args.budgets)
    if args.memory_gb is not None or args.storage:
        raise TrainfitError("--budgets sets the budget of each search (and keeps each in its own folder's journal)",
                            "drop --memory-gb and --storage")

    def announce(budget: float, folder: Path) -> None:
        print(f"\n== budget {budget:g} GiB -> {folder}")

    matrix, _ = tune_budgets(plan.spec, budgets, plan.options, announce=announce)
    print("\nBUDGET MATRIX (the fastest measured config under each budget)")
    print(table([HEADER, *matrix.cells()]))
    print(f"\n{matrix.probes} probes in all; each budget's summary.json and train_command.sh are in its folder; "
          f"the matrix in {Path(plan.options.output) / 'budgets.json'}")
    return 0 if matrix.rows[0].trial is not None else 1
