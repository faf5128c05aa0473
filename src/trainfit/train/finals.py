"""``trainfit train RUN_DIR --from-compare DIR --top N``: guide 001's phase 4. The comparison's N
best configs (its ``ranking``) are each run to completion, one after another, into ``OUTPUT/NAME``:
each the fastest way the tune measured that learns as it does, with its training values,
checkpoints and resume, as ``train --from-compare --config NAME`` trains it (the plan, made for one
run, decides none of them). Each one's ETA is said before it starts. Then they are set side by side
in ``OUTPUT/finals.json``, and the final pick is the lowest final loss.

The finals evaluate nothing of their own yet: the pick is by train loss, and says so.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.format import format_duration
from trainfit.json_record import Record
from trainfit.plan import make_plan
from trainfit.plan.from_compare import read_winner
from trainfit.train.records import TrainResult, log_events
from trainfit.train.train_options import TrainOptions

FINALS_FILE = "finals.json"
MOST = 5
"""The most finals ``--top`` takes: the guide runs two or three."""


@dataclass(frozen=True, kw_only=True)
class Final(Record):
    """One final's run."""

    name: str
    trial: int | None
    status: str
    step: int | None
    max_steps: int | None
    elapsed_s: float
    loss: float | None
    """The last logged train loss (None: none logged)."""
    output: str


@dataclass(frozen=True, kw_only=True)
class Finals(Record):
    """``finals.json``."""

    compare_dir: str
    finals: list[Final] = field(default_factory=list)
    pick: str | None = None
    """The final with the lowest train loss, of those that finished (None: not all finished yet)."""
    pick_by: str = "the lowest final train loss (the finals evaluate no held-out set of their own yet)"


def train_finals(run_dir: Path, compare_dir: Path, top: int, output: Path, options: TrainOptions,
                 train: Callable[[Path, Path, TrainOptions], TrainResult]) -> Finals:
    """Run the comparison's ``top`` best into ``output`` (see the module) with ``train`` (``trainfit.train.train``);
    stops at the first that does not finish (a signal, the deadline), which the same command with
    ``--resume`` continues."""
    ranking = _ranking(compare_dir)
    names = ranking[:top]
    again = shlex.join(["trainfit", "train", str(run_dir), "--from-compare", str(compare_dir), "--top", str(top),
                        "--output", str(output), "--resume"])
    for i, name in enumerate(names, 1):
        options.say(f"trainfit: final {i} of {len(names)}: {name}, {_eta(run_dir, compare_dir, name)}")
    done = []
    for name in names:
        out = output / name
        result = train(run_dir, out, dataclasses.replace(
            options, from_compare=compare_dir, compare_config=name, final=True, resume_with=again,
            resume=options.resume and (out / "train.json").is_file()))
        done.append(Final(name=name, trial=result.trial, status=result.status, step=result.step,
                          max_steps=result.max_steps, elapsed_s=result.elapsed_s, loss=_last_loss(out),
                          output=str(out)))
        if result.status != "finished":
            break
    finished = [f for f in done if f.status == "finished" and f.loss is not None]
    pick = min(finished, key=lambda f: f.loss or 0.0).name if len(done) == len(names) and finished else None
    finals = Finals(compare_dir=str(compare_dir), finals=done, pick=pick)
    output.mkdir(parents=True, exist_ok=True)
    write_atomically(output / FINALS_FILE, json.dumps(finals.to_json(), indent=2) + "\n")
    return finals


def _ranking(compare_dir: Path) -> list[str]:
    best = read_winner(compare_dir)  # a clear error where the folder ranks nothing
    raw = json.loads((compare_dir / "compare.json").read_text())
    ranking = [str(n) for n in raw.get("ranking") or [best.name]]
    if len(ranking) < 2:
        raise TrainfitError(f"the comparison in {compare_dir} ranks one config that finished ({best.name}): "
                            "there are no finals to choose between", f"train it: --from-compare {compare_dir}")
    return ranking


def _eta(run_dir: Path, compare_dir: Path, name: str) -> str:
    """A final's config and ETA, as a plan of it prices them (its window unbounded)."""
    try:
        plan = make_plan(run_dir, max_hours=24 * 366, priority="fast", winner=read_winner(compare_dir, name))
    except TrainfitError as err:
        return f"its ETA unknown ({err.message})"
    return f"trial {plan.trial}, ~{format_duration(plan.eta.total_s)} for {plan.epochs:g} epoch(s)"


def _last_loss(output: Path) -> float | None:
    """The last train loss a run's log holds."""
    try:
        lines = (output / "train_log.jsonl").read_text(errors="replace").splitlines()
    except OSError:
        return None
    losses = [float(e["loss"]) for e in log_events(lines) if isinstance(e.get("loss"), (int, float))]
    return losses[-1] if losses else None
