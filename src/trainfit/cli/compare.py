"""``trainfit compare``: named configs trained K steps each, their curves, speed and memory compared."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trainfit.cli import COMMANDS
from trainfit.cli.common import check_eval_flags, interrupted, number
from trainfit.compare import compare
from trainfit.compare.report import header, rows
from trainfit.format import table

EPILOG = """\
examples:
  trainfit compare examples/tiny-llama.yaml --configs examples/compare-configs.yaml --steps 60
  trainfit compare my.yaml --configs round1.yaml --steps 200 --eval-data val.jsonl --eval-every 25
  trainfit compare my.yaml --configs round1.yaml --steps 200 --holdout 200   # 200 rows of the data as the eval set
  trainfit compare my.yaml --configs round1.yaml --steps 200 --output runs/cmp --resume   # after an interruption
  trainfit compare my.yaml --configs runs/cmp/next_configs.yaml --steps 400 --output runs/cmp2   # the next round
  trainfit compare my.yaml --configs round1.yaml --steps 200 --storage postgresql://host/db   # on every machine

The configs file maps names to settings on top of the spec's params: any knob (batch_size,
gradient_accumulation_steps, lora_r, lora_alpha, precision, ...; a factory model's own keys too)
and the training values learning_rate, lr_scheduler_type, warmup_steps, warmup_ratio,
weight_decay and max_grad_norm:

  low_lr:  {learning_rate: 1.0e-4}
  high_lr: {learning_rate: 1.0e-3, warmup_ratio: 0.1}
  big_r:   {learning_rate: 1.0e-3, lora_r: 64}

Each config trains in its own process on the trainer `trainfit train` uses (TRL's SFTTrainer, or
trainfit's loop for a factory model), with the same seed and data order, its loss logged every
step and the eval set evaluated on its schedule. A config whose loss is not finite or rises past
its start is stopped as diverged; one that runs out of memory is reported, and the others still run.
Writes OUTPUT/compare.json (after each config: --resume keeps the finished ones, and rebuilds a
damaged compare.json from the configs' results), compare.html (loss curves against steps and time,
speed and memory bars), next_configs.yaml (from the suggestions); each config trains in
OUTPUT/configs/NAME. OUTPUT is locked while a comparison runs: a second one into it is refused.
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help=COMMANDS["compare"],
                       description="Train each named config of a configs file for the same number of steps on the "
                                   "spec's model and data; compare loss curves, speed and memory; suggest the next "
                                   "round.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                       allow_abbrev=False)  # the resume hint repeats the flags as typed: each in full
    p.add_argument("spec", help="YAML spec (see examples/tiny-llama.yaml)")
    p.add_argument("--configs", required=True, metavar="YAML", help="the named configs (see below)")
    p.add_argument("--steps", type=number(int, at_least=1), required=True, help="optimizer steps per config")
    p.add_argument("--minutes", type=number(float, above=0), metavar="T",
                   help="also stop each config after T minutes of training (the same time for each; --steps stays "
                        "the learning-rate schedule's length)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec value for every config (as in tune), or a training value "
                        "(learning_rate=1e-4: every config that does not set its own); repeatable")
    p.add_argument("--eval-data", metavar="PATH", help="a held-out set (the training data's format and fields)")
    p.add_argument("--holdout", type=number(int, at_least=1), metavar="N",
                   help="no eval set of your own: hold out N rows of the spec's data (drawn with its seed) as one; "
                        "the configs train on the rest")
    p.add_argument("--eval-every", type=number(int, at_least=1), metavar="N",
                   help="evaluate every N steps and after the last (default: 5 times in the run)")
    p.add_argument("--eval-batch-size", type=number(int, at_least=1), metavar="B",
                   help="samples per eval batch (default: the spec's batch size)")
    p.add_argument("--target-loss", type=number(float, above=0), metavar="LOSS",
                   help="report the step, time and samples each config took to reach this loss")
    p.add_argument("--output", help="output folder (default: a new trainfit-runs/SPEC_NAME/compare-TIMESTAMP)")
    p.add_argument("--resume", action="store_true", help="keep the configs --output's compare.json finished")
    p.add_argument("--storage", metavar="URL",
                   help="a database shared by several machines running this same command (postgresql://user:pw@host/db, "
                        "with trainfit[postgres]), or a PATH.journal file shared by runs on one machine: they split "
                        "the configs (each trained once; a dead run's config is trained again) and each one's "
                        "compare.json ends with all of them")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from datetime import datetime

    check_eval_flags(args)
    out = Path(args.output) if args.output else \
        Path("trainfit-runs") / Path(args.spec).stem / datetime.now().strftime("compare-%Y%m%d-%H%M%S")
    print(f"trainfit compare: {args.spec} with {args.configs} -> {out}")
    try:
        state = compare(args.spec, args.configs, steps=args.steps, output=out, overrides=args.overrides,
                        eval_data=args.eval_data, eval_every=args.eval_every, eval_batch_size=args.eval_batch_size,
                        target_loss=args.target_loss, resume=args.resume, storage=args.storage, minutes=args.minutes,
                        holdout=args.holdout)
    except KeyboardInterrupt as err:
        return interrupted(err, args.argv, out, f"the configs that finished are kept in {out / 'compare.json'}")
    print()
    print(table([header(state), *rows(state)]))
    print("\nsuggestions for the next round:")
    for s in state.suggestions:
        print(f"  - {s.says}\n      ({s.evidence})")
    print(f"\nwritten: {out / 'compare.json'}, {out / 'compare.html'}"
          + (f", {out / 'next_configs.yaml'}" if (out / "next_configs.yaml").is_file() else ""))
    return 0 if all(r.status == "finished" for r in state.runs.values()) else 1
