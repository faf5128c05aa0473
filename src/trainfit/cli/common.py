"""Arguments shared by the commands that take a spec."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainfit.cli import interrupted_status
from trainfit.errors import TrainfitError
from trainfit.params import KNOBS
from trainfit.spec import load_spec


def knobs_help() -> str:
    """The built-in knobs and their values, for a command's --help (docs/spec.md: the knob table)."""
    import textwrap

    def values(k: Any) -> str:
        if k.choices:
            return "|".join(map(str, k.choices))
        return {"int": "int", "float": "number", "bool": "true|false", "modules": "names"}[k.kind] + \
            ("|null" if k.nullable else "")

    items = ", ".join(f"{k.name}\xa0({values(k)})" for k in KNOBS.values())  # a knob and its values stay on one line
    lines = textwrap.wrap(f"knobs (--set NAME=VALUE; params: and search: in the spec): {items}; a factory model "
                          "takes custom keys too", width=100, subsequent_indent="  ", break_on_hyphens=False)
    return "\n".join(lines).replace("\xa0", " ")


def output_file(path: str | None, option: str) -> Path | None:
    """``path`` ready to be written once the work is done (its folder created): checked before the
    work starts, so a typo in an output path never costs a measurement."""
    if path is None:
        return None
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TrainfitError(f"cannot create the folder of {option} {path}: {err.strerror}",
                            f"give {option} a path in a writable folder") from None
    if target.is_dir() or not os.access(target.parent, os.W_OK):
        raise TrainfitError(f"cannot write {option} {path}: "
                            f"{'it is a folder' if target.is_dir() else 'its folder is not writable'}",
                            f"give {option} a file path in a writable folder")
    if _is_run_file(target) and (target.exists() or target.is_symlink()) and (target.parent / ".lock").exists():
        raise TrainfitError(f"{option} {path} would write over a file of the trainfit run folder {target.parent}: "
                            "what the run keeps there could not be rebuilt",
                            f"give {option} a path outside {target.parent}, or a new file name")
    return target


RUN_FILES = frozenset({
    ".lock", "study.journal", "summary.json", "trials.csv", "report.html", "train_command.sh", "training_args.json",
    "axolotl.yaml", "accelerate_config.yaml", "trl_data.yaml", "trainer_cost.json", "budgets.json", "plan.json",
    "plan.txt", "actual.json", "ablation.json", "ablation.html", "compare.json", "compare.html", "next_configs.yaml",
    "train.json", "train_log.jsonl", "train_result.json", "on_track.json"})
"""The files a tune, plan, ablate, compare or train keeps in its folder (which holds its ``.lock``)."""


def _is_run_file(path: Path) -> bool:
    return path.name in RUN_FILES or path.suffix == ".journal"


def number(kind: type, *, at_least: float | None = None, above: float | None = None,
           at_most: float | None = None) -> Callable[[str], Any]:
    """An argparse ``type``: a ``kind`` (int or float) within bounds, or a usage error naming them."""
    name = "an integer" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {name}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        checks = [(">=", at_least, at_least is not None and value < at_least),
                  (">", above, above is not None and value <= above),
                  ("<=", at_most, at_most is not None and value > at_most)]
        if any(failed for _, _, failed in checks):
            bounds = " and ".join(f"{op} {bound:g}" for op, bound, _ in checks if bound is not None)
            raise argparse.ArgumentTypeError(f"{text} is out of range: expected {name} {bounds}")
        return value

    return parse


def add_spec_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="YAML spec (see examples/tiny-llama.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a spec value; a bare key is a knob under params, a section name "
                        "replaces the section (--set batch_size=8 --set budget.memory_gb=22 "
                        "--set 'search={batch_size: [1, 2, 4]}'); repeatable")
    p.add_argument("--memory-gb", type=number(float, above=0), help="memory budget in GiB (same as --set budget.memory_gb=...)")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N (same as --set probe.device=...)")
    p.add_argument("--lengths", metavar="JSON",
                   help="length analysis from `trainfit analyze --json` (default: computed and cached)")


def spec_from_args(args: argparse.Namespace):

    overrides = list(args.overrides)
    if args.memory_gb is not None:
        overrides.append(f"budget.memory_gb={args.memory_gb}")
    if args.device is not None:
        overrides.append(f"probe.device={args.device}")
    return load_spec(args.spec, overrides)


def stats_from_args(args: argparse.Namespace, spec, progress: bool = True):
    """The spec's length analysis: the --lengths file when given (checked against the data), else computed."""
    # local: numpy loads only for the commands that read data (`trainfit dashboard` imports this module too)
    from trainfit.data.stats import LengthStats

    if args.lengths:
        path = Path(args.lengths)
        if not path.is_file():
            raise TrainfitError(f"--lengths {path} not found", "create it with `trainfit analyze ... --json FILE`")
        try:
            stats = LengthStats.from_dict(json.loads(path.read_text()))
        except (ValueError, TypeError) as err:
            raise TrainfitError(f"{path} is not a trainfit length analysis ({err})",
                                "give the file `trainfit analyze ... --json FILE` wrote, or leave --lengths out "
                                "to count the lengths now") from None
        if spec.data is not None and Path(stats.source).resolve() != Path(spec.data.path).resolve():
            print(f"warning: {path} analyzed {stats.source}, but the spec's data is {spec.data.path}")
        return stats
    if spec.data is None:
        return None
    # local: numpy loads only for the commands that read data (`trainfit dashboard` imports this module too)
    from trainfit.data.analyze import analyze_spec

    return analyze_spec(spec, progress=progress)


def add_compare_arguments(p: argparse.ArgumentParser, does: str) -> None:
    """``--from-compare DIR`` and ``--config NAME`` (``plan`` and ``train``): a compare winner carried
    on; ``does``: what the command does with it, in words."""
    p.add_argument("--from-compare", metavar="DIR", help=f"carry a `trainfit compare` winner on: {does}")
    p.add_argument("--config", metavar="NAME", help="with --from-compare: that config instead of the comparison's best")


def check_eval_flags(args: argparse.Namespace) -> None:
    """``--eval-every`` and ``--eval-batch-size`` say how to evaluate: refused without an eval set
    (``--eval-data``, or compare's ``--holdout``)."""
    holdout = getattr(args, "holdout", None)
    if args.eval_data is None and holdout is None and (args.eval_every is not None or args.eval_batch_size is not None):
        raise TrainfitError("--eval-every and --eval-batch-size say how to evaluate, and no eval set was given",
                            "add --eval-data PATH (the training data's format and fields)"
                            + (" or --holdout N" if hasattr(args, "holdout") else ""))


def resume_command(argv: list[str], output: str | Path) -> str:
    """``argv`` (what the user ran, its sub-command first) as the command that continues the run in
    ``output``: every flag kept as given (a new one too), ``--output`` the run's folder, and ``--resume``.
    The sub-command's parser must have ``allow_abbrev=False``, so each flag is here in full."""
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
        elif word == "--output":
            skip = True  # its value follows
        elif word != "--resume" and not word.startswith("--output="):
            words.append(word)
    return shlex.join(["trainfit", *words, "--output", str(output), "--resume"])


def interrupted(err: KeyboardInterrupt, argv: list[str], output: str | Path, kept: str) -> int:
    """Say what an interrupted run kept (``kept``) and the command that continues it; the shell's exit status."""
    with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
        print(f"\ninterrupted: {kept}; continue with\n  {resume_command(argv, output)}", file=sys.stderr)
    return interrupted_status(err)
