"""Real trainer steps of the chosen config, timed: the calibration of ``trainfit plan --calibrate N``.

The probe prices the model's step; ``trl sft`` adds its own per-step work (its data loader and
collator, the scheduler, its metrics over the logits, accelerate's bookkeeping): 0-15% on the test
CPU, 1.4-2.1x on an H100 and an H200 with short steps (docs/benchmarks.md). A calibration measures it by
running the trainer twice, for a short and a long step count: first the command ``tune`` wrote
(``train_command.sh``, ``trl sft`` under ``accelerate launch``) as a user runs it, then ``trainfit
train`` (the same arguments, TRL's trainer in its own process, trainfit's checkpoint and log
callbacks added). Both start-ups are measured, each runner's own: ``trainfit train`` starts
without ``accelerate launch``'s second Python process (6.5 s against 10-11 s on the test CPU,
docs/benchmarks.md), which a plan for one priced at the other's start-up missed by 6%.

The extra steps of the long run are timed two ways. (1) Within the long run: the parent stamps the
arrival of each update of the trainer's progress bar, and the time from the short run's step count
to the last step is the figure; neither run's start-up nor its first steps enter it. (2) The long
run's ``train_runtime`` less the short run's (``bench/trl_fidelity.py``'s method): start-up cancels
out, but the first step's warm-up varies from run to run by as much as a few steps take. While
this was built (seen, not a recorded benchmark), on the 2-core test VM the same config (tiny
Llama, effective batch 64, ~1.1 s a step) took 5.6 s for its first step in one run and 1.3 s in
the next, so a 6-step run finished before the 2-step one; four
calibrations of 4 steps of another config (~0.44 s a step by the bar) gave 0.25-0.55 s a step by
the runtimes. (1) is the figure; (2) is used when the bar shows fewer than two of the steps (a
transformers that draws no bar), and is reported as each run ends.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import sys
import tempfile
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.json_record import Malformed, check_bounds, check_finite, check_schema, typed
from trainfit.trainer.launch import TimedRun, run_timed
from trainfit.probe.estimate import StepCost
from trainfit.search.ranking import micro_batches
from trainfit.trainer.step_pricing import Priced, pace_change, priced_steps
from trainfit.run_folder import RunFolder
from trainfit.summary import ConfigEntry, Summary
from trainfit.trainer.trainer_output import bar_seconds_per_step, recorded_steps, shown_steps, step_spread
from trainfit.trainer.calibration_checks import one_process, trainer_env
from trainfit.trainer.written_command import FALLBACK_HINT, as_one_line, template_for_steps, written_command

SCHEMA_VERSION = 1
"""The version of :meth:`Calibration.to_json`'s format."""


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """What real trainer steps of one config measured, against what its probe expected."""

    steps: int
    """Optimizer steps timed: the long run's ``--max_steps`` minus the short run's (the long run's
    steps after the short run's count)."""
    seconds_per_step: float
    """The trainer's own time per optimizer step over those steps (s), timed within the long run
    from the short run's step count to its last step by its progress bar's updates (the first
    shown at or after that count to the last shown; see :func:`bar_seconds_per_step`); where the bar
    shows fewer than two of them, the difference of the two runs' ``train_runtime`` / ``steps``."""
    samples_per_second: float
    """The trainer's speed: the config's effective batch / ``seconds_per_step``."""
    probe_samples_per_second: float
    """The probe's expected speed of the same config over the epoch's own batches: ``summary.json``'s
    ``best_config`` (its ``confirmed_median`` when confirmation ran, the median of its probes as a
    plan reads them; else its ``samples_per_second``)."""
    ratio: float
    """``samples_per_second / probe_samples_per_second``: the factor a plan multiplies the probe's
    speed by (below 1: the trainer does work per step the probe does not). The timed steps are the
    ones the trainer's seeded shuffle draws first, not the epoch's average batch the probe's figure
    stands for: over few steps of long-tailed data the ratio carries their difference too."""
    spread_rel: float
    """95% relative half-width of ``seconds_per_step``, from the timed steps' own variation: each
    interval between two updates of the long run's progress bar after the short run's step count
    (one per optimizer step, or per few when steps are shorter than tqdm's 0.1 s refresh), divided
    by the steps it covers, is one sample; the half-width is Student's t x their standard error /
    their mean (``probe.timing.relative_ci95``). With fewer than two such intervals, those of both
    runs after their first step are used; with fewer still, ``inf`` (unknown; written as null).
    It leaves out a drift of the machine beyond the timed steps."""
    startup_s: float
    """What a run of the written command costs beyond its optimizer steps at ``seconds_per_step``:
    launch to exit less the steps (imports, ``accelerate launch``'s second process, model load, the
    dataset's tokenization, the first steps' warm-up, the final save), from the first run (the data
    tokenized uncached: a later run may find it cached)."""
    command: str
    """The written ``trl sft`` command with the long run's calibration arguments after it
    (``--max_steps`` and the rest; see :func:`calibration_args`): the arguments the long run,
    ``trainfit train``, trained with in its process."""
    device: str | None
    """The device the config was probed on, which the written command trains on (its
    ``--use_cpu`` and ``OMP_NUM_THREADS`` follow the probe's device): ``summary.json``'s ``device``."""
    train_startup_s: float | None = None
    """The same for ``trainfit train`` (launch to exit less its steps, its final checkpoint and model
    save included), from the second run; None in a calibration recorded before it was measured
    (a plan then prices ``trainfit train`` at ``startup_s``)."""
    model_step_s: float | None = None
    """What the probe expected of the very steps timed, per step: its fitted step cost (the best
    config's ``a + bL + cL^2``) summed over the micro-batches those steps trained, by their padded
    lengths as the long run collated them (``trainfit train --record-batches``), with the probe's
    first sight for each length the run met first in them (``Measurement.first_sight_s``). None: not priced
    (no step cost, or the batches not seen); a plan then compares the trainer's step with the
    epoch's average step (``ratio``), which the first shuffled batches' lengths sway."""
    own_step_s: float | None = None
    """The trainer's own time per step, fitted over the timed steps apart from the machine's drift
    (``step_pricing.own_step_time``); None where their costs vary too little to tell the two apart
    (fixed padding), they were not priced, or it was recorded before this was measured."""
    trial: int | None = None
    """The tune trial of the config the steps ran (None: recorded before it was kept)."""
    micro_batches: int = 1
    """That config's micro-batches per optimizer step (``gradient_accumulation_steps``)."""
    pace_change_rel: float | None = None
    """How much slower (above 0) or faster (below 0) the later half of the timed steps ran than the
    earlier half, for the work they did (:func:`pace_change`); None where the pace held as far as
    the steps can tell. A fresh process on a GPU still speeding up (docs/plan.md) reads below 0, and
    the run's steps are then faster than the figure; a machine slowing down reads above 0."""

    learned_from: str | None = None
    """The ``actual.json`` of the planned run this was learned from (its pace and start-up, as
    ``trainfit train`` measured them: ``plan.learned``); None: timed by ``--calibrate``."""

    def trainer_overhead_s(self) -> float:
        """The trainer's own time per optimizer step beyond the model's step, at least 0: fitted
        apart from the machine's drift (:attr:`own_step_s`) where the timed steps' costs varied
        enough; else the timed step less the probe's cost of the very batches timed
        (:attr:`model_step_s`) where they were priced, else less the epoch's average step. Below 0 it would say the trainer runs the model faster
        than the model's step alone: the machine's drift between probe and calibration, or the first
        batches' mix, neither of which holds for the run (``bench/plan_eta.py``: a calibration 2.5%
        faster than its probe, then a run 6% slower than both)."""
        if self.own_step_s is not None:
            return max(0.0, self.own_step_s)
        model_step = self.model_step_s if self.model_step_s is not None else self.seconds_per_step * self.ratio
        return max(0.0, self.seconds_per_step - model_step)

    def step_overhead_s(self, micro_batches: int) -> float:
        """The trainer's own time per optimizer step of a config of ``micro_batches`` micro-batches
        a step: :meth:`trainer_overhead_s` per micro-batch of the config that ran, times
        ``micro_batches``. Most of ``trl sft``'s own work recurs for each micro-batch (fetching and
        collating it, ``model.train()``'s walk over the modules, counting its FLOPs, its loss metrics
        over the logits: docs/benchmarks.md), so a config that accumulates more micro-batches pays
        more of it per step."""
        return self.trainer_overhead_s() / self.micro_batches * micro_batches

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = None if isinstance(value, float) and not math.isfinite(value) else value
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Calibration:
        """Read back :meth:`to_json`'s JSON; :class:`~trainfit.json_record.Malformed` names the key of a value
        missing, of the wrong type, not finite or out of :data:`BOUNDS` (a file edited by hand or damaged:
        a negative start-up would shorten every ETA it enters)."""
        check_schema(raw, SCHEMA_VERSION, "a calibration", "calibrate again with this trainfit")
        check_finite(raw)  # to_json writes an unknown figure as null
        later = {"train_startup_s", "model_step_s", "own_step_s", "trial", "micro_batches",
                 "pace_change_rel", "learned_from"}  # absent from calibrations recorded before they were measured
        missing = next((f.name for f in fields(cls) if f.name not in raw and f.name not in later), None)
        if missing is not None:
            raise Malformed(missing, "missing")
        hints = typing.get_type_hints(cls)
        values = {f.name: typed(hints[f.name], raw[f.name], f.name, nullable=f.name == "spread_rel")
                  for f in fields(cls) if f.name in raw}
        for name, value in values.items():
            check_bounds(name, value, BOUNDS.get(name, {}))
        if values["spread_rel"] is None:
            values["spread_rel"] = math.inf
        return cls(**values)


BOUNDS: dict[str, dict[str, float]] = {
    **{name: {"at_least": 0.0} for name in ("steps", "spread_rel", "startup_s", "train_startup_s", "model_step_s",
                                            "trial")},
    **{name: {"above": 0.0} for name in ("seconds_per_step", "samples_per_second", "probe_samples_per_second",
                                         "ratio")},
    "micro_batches": {"at_least": 1},
    "pace_change_rel": {"above": -1.0},
}
"""What a :class:`Calibration` read back may hold: no figure a calibration measures is below these (its
own step time ``own_step_s`` may be, read as none; a pace below -100% would be steps taking no time)."""


def short_steps(steps: int) -> int:
    """The short run's ``--max_steps``: enough to be past the first step's warm-up, a fifth of the
    timed steps for a long calibration (a longer warm-up then stays inside the short run)."""
    return max(2, steps // 5)


def calibration_args(max_steps: int, output_dir: Path) -> list[str]:
    """What a calibration run appends to the written command (``trl sft`` takes the later flag):
    the step count, a throw-away output folder, no checkpoints, no reporting, no periodic logging
    (its metrics cost host synchronizations a run with the default ``logging_steps`` makes rarely),
    and the progress bar on (its updates time the steps)."""
    return ["--max_steps", str(max_steps), "--output_dir", str(output_dir), "--save_strategy", "no",
            "--report_to", "none", "--logging_strategy", "no", "--disable_tqdm", "false"]


def calibrate(run_dir: Path | RunFolder, steps: int, *, work: Path | None = None, step_cost: StepCost | None = None,
              on_progress: Callable[[str], None] | None = None) -> Calibration:
    """Time ``steps`` real optimizer steps of the best config of the tune output folder ``run_dir``
    with the command ``tune`` wrote for it (``train_command.sh``, a ``trl sft`` command; for a
    ``config:`` model it trains the random-init model saved in ``run_dir/model``).

    Two runs, each in a child process group, in the environment of this process (``trl`` found
    beside this Python first): the command for ``short_steps(steps)`` optimizer steps, with
    :func:`calibration_args` after it, then ``trainfit train`` (on a copy of the folder's summary and
    command, so a plan already there does not change what trains) for ``short_steps(steps) + steps``,
    without reporting or periodic logging. ``work``: where each run's full output is kept
    (``calibrate-N-steps.log``) and the trainer writes (each run's output folder, with the model
    saved as it ends, is removed after the run); None: a new temporary folder, removed after a
    calibration that succeeds. ``step_cost``: the best config's fitted step cost (its probe's), by
    which the steps timed are priced on the very batches they trained (:func:`priced_steps`; the
    long run records them in ``batches-N-steps.txt``); None: compared with the probe's epoch
    average alone. ``on_progress``: a line at each run's start, its first step shown and its end,
    then the timings of the steps.

    Raises :class:`TrainfitError` when ``steps`` < 1, ``run_dir`` holds no ``summary.json`` or
    ``train_command.sh``, the command is a ``tune.command_template`` or has a placeholder to fill,
    ``trl`` is not installed, or a run fails (with its last lines and the log's path). Ctrl-C (or
    any other exception) kills the run's whole process group before it propagates.
    """
    if steps < 1:
        raise TrainfitError(f"a calibration times at least 1 optimizer step (asked for {steps})",
                            "e.g. 50 steps: more give a tighter figure, each costs one step of the config")
    say = on_progress or (lambda line: None)
    short = short_steps(steps)
    run = RunFolder.of(run_dir)
    best = run.summary.best_config
    one_process(best.config if best is not None else {}, template=bool(run.summary.command_template))
    timed = _timed_runs(run, short, steps, work, say)
    runs, best = timed.runs, timed.best
    seconds = _seconds_per_step(runs, short, steps, timed.folder, say)
    probe = float(best.probe_speed or 0.0)  # the best config is a fitting, timed one
    speed = _samples_per_step(best) / seconds
    batches = timed.folder / f"batches-{short + steps}-steps.txt"  # a template's trainer records none
    priced = None if step_cost is None or timed.template else _priced(batches, best, runs[1].step_arrivals, short,
                                                                      step_cost, say)
    calibration = Calibration(
        steps=steps, seconds_per_step=seconds, samples_per_second=speed,
        probe_samples_per_second=probe, ratio=speed / probe,
        spread_rel=priced.spread_rel if priced is not None and math.isfinite(priced.spread_rel) else
        step_spread(runs[1].step_arrivals, runs[0].step_arrivals, short),
        model_step_s=priced.model_step_s if priced else None, own_step_s=priced.own_step_s if priced else None,
        pace_change_rel=(priced.pace_change_rel if priced else
                         _unpriced_pace_change(runs[1].step_arrivals, short, say)),
        startup_s=max(0.0, runs[0].wall_s - short * seconds),
        train_startup_s=None if timed.template else max(0.0, runs[1].wall_s - (short + steps) * seconds),
        command=timed.command, device=timed.summary.device, trial=best.trial, micro_batches=micro_batches(best.config))
    if timed.scratch:
        shutil.rmtree(timed.folder, ignore_errors=True)
    return calibration


def _samples_per_step(best: ConfigEntry) -> float:
    """The samples one optimizer step of ``best`` trains: its effective batch, or under packing (a
    row holding several) its epoch's mean."""
    return best.samples_per_step if best.samples_per_step is not None else float(best.effective_batch_size)


@dataclass(frozen=True)
class _Timed:
    """The two runs of a calibration, and what they ran."""

    runs: list[TimedRun]
    command: str
    """The long run's command, on one line."""
    best: ConfigEntry
    summary: Summary
    folder: Path
    scratch: bool
    """``folder`` is a temporary one, removed once the calibration succeeds."""
    template: bool
    """The command is the spec's ``tune.command_template`` (run twice), not ``trl sft`` and ``trainfit train``."""


def _timed_runs(run: RunFolder, short: int, steps: int, work: Path | None, say: Callable[[str], None]) -> _Timed:
    """Check ``run``'s command can run (refused before anything runs), then run it for ``short``
    steps and ``short + steps`` (see :func:`calibrate`) in ``work`` (None: a temporary folder)."""
    long = short + steps
    if run.summary.command_template:
        (filled, best, summary), (shorter, _, _) = template_for_steps(run, long), template_for_steps(run, short)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    else:
        script, best, summary = written_command(run)
        env = trainer_env()
    scratch = work is None
    folder = Path(tempfile.mkdtemp(prefix="trainfit-calibrate-")) if work is None else Path(work)
    folder.mkdir(parents=True, exist_ok=True)
    if summary.command_template:  # your trainer, in this process's folder: where its relative paths were written for
        planned = [("your tune.command_template", ["bash", "-c", shorter], short),
                   ("your tune.command_template", ["bash", "-c", filled], long)]
        runs = _run_twice(planned, folder, env, say, scratch=scratch, cwd=Path.cwd())
        return _Timed(runs=runs, command=filled, best=best, summary=summary, folder=folder, scratch=scratch,
                      template=True)
    copy = _copied(run.path, script, folder)
    (folder / f"batches-{long}-steps.txt").unlink(missing_ok=True)  # a reused work folder's: appended to
    trainfit_train = [sys.executable, "-m", "trainfit", "train", str(folder / "run"), "--output",
                      str(folder / f"trainer-{long}-steps"), "--max-steps", str(long),
                      "--record-batches", str(folder / f"batches-{long}-steps.txt"),
                      "--", "--report_to", "none", "--logging_strategy", "no"]
    planned = [("`trl sft`", ["bash", str(copy), *calibration_args(short, folder / f"trainer-{short}-steps")], short),
               ("`trainfit train`", trainfit_train, long)]
    runs = _run_twice(planned, folder, env, say, scratch=scratch)
    shutil.rmtree(folder / "run", ignore_errors=True)
    return _Timed(runs=runs, command=as_one_line(script, calibration_args(long, folder / f"trainer-{long}-steps")),
                  best=best, summary=summary, folder=folder, scratch=scratch, template=False)


def _copied(run_dir: Path, script: str, folder: Path) -> Path:
    """``folder/train_command.sh``: ``script`` as read now (a tune still running may rewrite the
    original), and ``folder/run``, what `trainfit train` reads: ``run_dir``'s summary and this
    command, no plan."""
    copy = folder / "train_command.sh"
    write_atomically(copy, script)
    (folder / "run").mkdir(exist_ok=True)
    shutil.copy(run_dir / "summary.json", folder / "run" / "summary.json")
    shutil.copy(copy, folder / "run" / "train_command.sh")
    return copy


def _priced(path: Path, best: ConfigEntry, arrivals: Mapping[int, float], short: int, cost: StepCost,
            say: Callable[[str], None]) -> Priced | None:
    """:func:`priced_steps` of the long run, from the micro-batch lengths it recorded in ``path``."""
    accumulation = micro_batches(best.config)
    steps = recorded_steps(path.read_text(), accumulation) if path.is_file() else []
    priced = priced_steps(steps, accumulation, arrivals, short, lambda length: float(cost(length)), cost.first_sight)
    if priced is None:
        say(f"the timed steps' batches were not all seen ({len(steps)} steps recorded): compared with the probe's "
            "epoch average instead")
    else:
        say(f"the probe's cost of the very batches timed: {priced.model_step_s:.4g} s a step"
            + ("; the steps cost too much alike to fit the trainer's own time apart from the machine's drift, so "
               "the trainer's cost is the timed step less that" if priced.own_step_s is None else
               f"; the trainer's own time, told from the machine's drift: {priced.own_step_s:.4g} s a step"
               + (" (below 0: taken as none)" if priced.own_step_s < 0 else "")))
        _say_pace_change(priced.pace_change_rel, say)
    return priced


def _unpriced_pace_change(arrivals: Mapping[int, float], short: int, say: Callable[[str], None]) -> float | None:
    """:func:`pace_change` of the long run's bar intervals after ``short`` steps, by step count."""
    change = pace_change([(t1 - t0, n1 - n0) for (n0, t0), (n1, t1) in itertools.pairwise(shown_steps(arrivals, short))])
    _say_pace_change(change, say)
    return change


def _say_pace_change(change: float | None, say: Callable[[str], None]) -> None:
    if change is not None:
        say(f"the later half of the timed steps ran {abs(change):.0%} {'faster' if change < 0 else 'slower'} than "
            "the earlier half for their work: " + ("still speeding up (calibrate over more steps to time past it)"
                                                   if change < 0 else "slowing down"))


def _run_twice(planned: Sequence[tuple[str, list[str], int]], folder: Path, env: Mapping[str, str],
               say: Callable[[str], None], *, scratch: bool, cwd: Path | None = None) -> list[TimedRun]:
    """Run each ``(name, argv, max_steps)`` in turn, in ``cwd`` (None: ``folder``), each told its own
    output folder in ``TRAINFIT_OUTPUT`` (``folder/trainer-N-steps``, removed after it). A run in
    ``cwd`` is your own trainer, which need not print a ``train_runtime``."""
    runs: list[TimedRun] = []
    try:
        for number, (name, argv, max_steps) in enumerate(planned, start=1):
            say(f"run {number} of 2: {name} for {max_steps} steps (log: {folder / f'calibrate-{max_steps}-steps.log'})")
            told = {**env, "TRAINFIT_OUTPUT": str(folder / f"trainer-{max_steps}-steps")}
            runs.append(run_timed(name, argv, max_steps, folder, told, _prefixed(say, f"run {number} of 2: "),
                                  fallback=FALLBACK_HINT, cwd=cwd, needs_runtime=cwd is None))
    except TrainfitError:
        raise  # the log it names stays
    except BaseException:  # Ctrl-C: the runs are killed, their partial logs of no use
        if scratch:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    return runs


def _seconds_per_step(runs: Sequence[TimedRun], short: int, steps: int, folder: Path,
                      say: Callable[[str], None]) -> float:
    """One optimizer step's seconds: from the longer run's progress bar past its first ``short``
    steps, else from the two runs' ``train_runtime`` difference (their launch-to-exit difference
    where a trainer printed none)."""
    timer = "train_runtime" if all(r.train_runtime_s is not None for r in runs) else "launch-to-exit time"
    took = [r.train_runtime_s if timer == "train_runtime" and r.train_runtime_s is not None else r.wall_s for r in runs]
    by_runtimes = (took[1] - took[0]) / steps
    say(f"{steps} steps: {by_runtimes:.4g} s a step by the runs' {timer} difference")
    seconds = bar_seconds_per_step(runs[1].step_arrivals, short)
    if seconds is not None and seconds > 0:  # not all at once (output that arrived in one chunk)
        say(f"{steps} steps: {seconds:.4g} s a step by the {short + steps}-step run's progress bar (the figure)")
        return seconds
    if by_runtimes <= 0:
        raise TrainfitError(f"the {short + steps}-step run took no longer than the {short}-step one by their {timer} "
                            f"({took[1]:g} s against {took[0]:g} s), and "
                            f"its progress bar showed too few steps to time them within the run (logs: {folder})",
                            f"calibrate over more steps (e.g. {max(50, 10 * steps)}), or {FALLBACK_HINT}")
    return by_runtimes


def _prefixed(say: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    return lambda line: say(prefix + line)
