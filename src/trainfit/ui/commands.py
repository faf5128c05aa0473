"""The command line of each action the UI offers, built as a list of arguments from fields that
were checked one by one (never a shell string): a form field reaches a command only as a knob value
the spec's loader accepted, a number, a path under the root, or a word of a fixed alphabet."""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Mapping
from pathlib import Path

from trainfit.ui.paths import Refused, Root

SPEC_COMMANDS = ("analyze", "probe", "tune", "ablate", "compare")
"""The actions on a spec."""
RUN_COMMANDS = ("plan", "train")
"""The actions on a tune's run folder."""
RESUMABLE = ("tune", "ablate", "compare", "train")
"""The commands with ``--resume`` (each one's ``--help``): a stopped job of theirs can go on."""
WORD = r"[A-Za-z0-9][A-Za-z0-9_-]*"
"""A word of a form's list (``--only``): one that begins with ``-`` would be read as an option (``--storage``)."""
RUNS = "trainfit-runs"
"""Where new run folders go under the root, by spec name, as the CLI's default ``--output`` puts them."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Planned:
    """A command ready to start: ``trainfit COMMAND ARGS...``, and the folder it writes."""

    command: str
    args: list[str]
    output: Path | None
    """Its run folder (a new one made already: :func:`new_folder`)."""


def new_folder(base: Path, name: str) -> Path:
    """``base/name-TIMESTAMP``, made here and now (``-2``, ``-3``... after it where taken). Made, not
    just found free: two starts within one second (two tabs, a double click) both found the same name
    free, as a tune makes its folder only once its process is up, and the two runs wrote into one."""
    stem = f"{name}-{time.strftime('%Y%m%d-%H%M%S')}" if name else time.strftime("%Y%m%d-%H%M%S")
    base.mkdir(parents=True, exist_ok=True)
    n = 1
    while not _made(path := base / (stem if n == 1 else f"{stem}-{n}")):
        n += 1
    return path


def _made(path: Path) -> bool:
    """Make the folder ``path``; False where it exists already (mkdir is one step: of two processes
    making it, one is told it exists)."""
    try:
        path.mkdir()
    except FileExistsError:
        return False
    return True


def number(form: Mapping[str, str], name: str, kind: type, *, required: bool = False,
           above: float | None = None, at_least: float | None = None) -> int | float | None:
    """Form field ``name`` as an int or float in range, None where it is empty and not required."""
    text = form.get(name, "").strip()
    if not text:
        if required:
            raise Refused(f"{name} is required", f"give {name} a number", status=400)
        return None
    try:
        value = kind(text)
    except ValueError:
        raise Refused(f"{name}: {text!r} is not {'an integer' if kind is int else 'a number'}", status=400) from None
    if not math.isfinite(value) or (above is not None and value <= above) or (at_least is not None and value < at_least):
        bound = f"above {above:g}" if above is not None else f"at least {at_least:g}"
        raise Refused(f"{name} must be {bound}, got {text}", status=400)
    return value


def sets(overrides: list[str]) -> list[str]:
    """``--set NAME=VALUE`` for each override."""
    return [arg for o in overrides for arg in ("--set", o)]


def spec_command(command: str, spec: Path, overrides: list[str], form: Mapping[str, str], root: Root) -> Planned:
    """The action ``command`` on ``spec`` (checked already) with the knob ``overrides`` (accepted by
    the spec's loader) and the action's own fields from ``form``."""
    runs = root.path / RUNS / spec.stem
    if command == "analyze":
        out = new_folder(runs, "analyze")
        return Planned(command=command, output=out,
                       args=["--spec", str(spec), "--json", str(out / "lengths.json"), "--plot", str(out / "lengths.html")])
    if command == "probe":
        out = new_folder(runs, "probe")
        return Planned(command=command, output=out,
                       args=[str(spec), *sets(overrides), "--json", str(out / "measurement.json")])
    if command == "tune":
        trials = number(form, "max_trials", int, at_least=1)  # checked before its folder is made
        out = new_folder(runs, "")
        return Planned(command=command, output=out, args=[
            str(spec), *sets(overrides), "--output", str(out), *(["--quick"] if form.get("quick") else []),
            *(["--max-trials", str(trials)] if trials is not None else [])])
    if command == "ablate":
        only = form.get("only", "").strip()
        if only and not re.fullmatch(rf"{WORD}(,{WORD})*", only):  # checked before its folder is made
            raise Refused(f"--only {only!r}: give comma-separated words, each beginning with a letter or a digit",
                          "e.g. checkpointing,precision", status=400)
        out = new_folder(runs, "ablate")
        return Planned(command=command, output=out,  # --only=WORDS: never read as an option of its own
                       args=[str(spec), *sets(overrides), "--output", str(out), *([f"--only={only}"] if only else [])])
    if command == "compare":
        configs = root.inside(form.get("configs", "").strip())
        if not configs.is_file():
            raise Refused(f"{form.get('configs')} is not a file", "pick a configs YAML", status=400)
        steps = number(form, "steps", int, required=True, at_least=1)
        out = new_folder(runs, "compare")
        return Planned(command=command, output=out, args=[
            str(spec), "--configs", str(configs), "--steps", str(steps), *sets(overrides), "--output", str(out)])
    raise Refused(f"{command!r} is not an action on a spec", f"one of {', '.join(SPEC_COMMANDS)}", status=400)


def run_command(command: str, run: Path, form: Mapping[str, str]) -> Planned:
    """The action ``command`` (plan, train) on the tune folder ``run`` (under the root, checked)."""
    if command == "plan":
        hours = number(form, "max_hours", float, required=True, above=0)
        epochs = number(form, "epochs", float, above=0)
        return Planned(command=command, output=run, args=[
            str(run), "--max-hours", str(hours), *(["--epochs", str(epochs)] if epochs is not None else [])])
    if command == "train":
        steps = number(form, "max_steps", int, at_least=1)
        if not run.is_dir():  # its training folder is made in it below
            raise Refused(f"{run.name} is not a folder", "pick a tune's run folder", status=400)
        out = run / "train" if _made(run / "train") else new_folder(run, "train")
        return Planned(command=command, output=out, args=[
            str(run), "--output", str(out), *(["--max-steps", str(steps)] if steps is not None else [])])
    raise Refused(f"{command!r} is not an action on a run folder", f"one of {', '.join(RUN_COMMANDS)}", status=400)


def resumed(command: str, args: list[str]) -> list[str]:
    """A stopped job's arguments with ``--resume`` (the same ``--output``): it goes on where it stopped."""
    if command not in RESUMABLE:
        raise Refused(f"`trainfit {command}` cannot resume", f"only {', '.join(RESUMABLE)} can", status=400)
    return args if "--resume" in args else [*args, "--resume"]
