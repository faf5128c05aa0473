"""Is a run on track to finish inside its plan's window? ``OnTrackCallback`` answers while a
Hugging Face ``Trainer`` runs:

    callback = trainfit.OnTrackCallback(plan="RUN_DIR/plan.json")
    trainer = callback.watch(Trainer(..., callbacks=[callback]))  # watch: the batches' work, the trainer's logs

Every ``every_s`` seconds it projects the finish from the steps done so far (their measured pace,
pooled with the plan's calibrated pace, each weighed by the real steps behind it), compares it with the plan's ETA
and window, prints one line (stderr), and keeps the latest status in ``on_track.json`` beside the
plan. The check itself (:class:`OnTrack`) needs no trainer.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainfit.files import write_atomically
from trainfit.format import format_duration as dur
from trainfit.json_record import Record
from trainfit.plan import Plan
from trainfit.probe.estimate import StepCost
from trainfit.search.ranking import micro_batches


@dataclass(frozen=True, kw_only=True)
class Status(Record):
    """Where a run stands against its plan."""

    step: int
    max_steps: int
    elapsed_s: float
    projected_s: float
    """The whole run's time at the pace of the steps done so far, pooled with the plan's where a
    calibration of its config measured it (see :meth:`OnTrack.pooled`)."""
    planned_s: float
    """The plan's ETA, for a run of ``max_steps`` steps (see ``plan_steps``)."""
    window_s: float
    state: str
    """``on track`` (projected inside the plan's interval), ``slower than planned`` (past it, inside
    the window) or ``will miss the window``."""
    steps_that_fit: int | None = None
    """When it will miss the window: the steps that end inside it at this pace."""
    epochs_that_fit: float | None = None
    own_pace_projected_s: float | None = None
    """The whole run's time at the pace of this run's steps alone (None: no calibrated pace was
    pooled, so ``projected_s`` is that)."""
    plan_steps: int | None = None
    """The plan's own steps where this run's ``max_steps`` differs (``train --max-steps``): its
    ETA is then priced for ``max_steps`` steps. None: the run is the plan's."""
    at: float = 0.0
    """When it was reported (epoch seconds): the projected end as a clock time is ``at`` plus the
    time left (0: not recorded, an on_track.json from before it was kept)."""
    startup_left_out_s: float | None = None
    """This run's start-up (its launch to the trainer's start), left out of ``elapsed_s`` and the
    projection because the plan prices none (not calibrated): like is compared with like. None:
    counted on both sides (a calibrated plan), or not known."""

    @property
    def left_s(self) -> float:
        """The time the run has left, at the projected pace."""
        return max(0.0, self.projected_s - self.elapsed_s)

    @property
    def steps_per_hour(self) -> float:
        """The pace of the steps to come as projected (every step's, once none is left)."""
        if self.step < self.max_steps and self.left_s > 0:
            return (self.max_steps - self.step) / self.left_s * 3600
        return self.step / self.elapsed_s * 3600 if self.elapsed_s > 0 else 0.0

    def ends_at(self) -> str | None:
        """The projected end as a local clock time (with the day past 24 hours), None when not known."""
        if not self.at:
            return None
        end = self.at + self.left_s
        return time.strftime("%H:%M" if self.left_s < 86_400 else "%a %d %b %H:%M", time.localtime(end))

    def figures(self, *, final: bool = False) -> dict[str, float]:
        """The run's standing as the trainer's logs carry it to every ``report_to`` service (W&B,
        TensorBoard, MLflow...), under the in-house planner's names: ``training/elapsed_hours``,
        ``training/remaining_hours``, ``training/on_track`` (1 or 0) as the run goes; ``final``:
        also ``optimization/estimated_hours`` (the plan's ETA), ``optimization/actual_hours`` and
        ``optimization/time_accuracy`` (the estimate over the actual, in percent: 100 is exact)."""
        out = {"training/elapsed_hours": self.elapsed_s / 3600, "training/remaining_hours": self.left_s / 3600,
               "training/on_track": float(self.state == "on track"),
               "training/progress_percent": 100 * self.step / self.max_steps if self.max_steps else 0.0,
               "training/steps_per_hour": self.steps_per_hour}
        if final:
            out |= {"optimization/estimated_hours": self.planned_s / 3600, "optimization/actual_hours": self.elapsed_s / 3600,
                    "optimization/time_accuracy": 100 * self.planned_s / self.elapsed_s if self.elapsed_s > 0 else 0.0}
        return out

    @property
    def line(self) -> str:
        planned = dur(self.planned_s) + (f" for a run of {self.max_steps:,} steps, the plan's {self.plan_steps:,}"
                                         if self.plan_steps is not None else "")
        progress = f" ({self.step / self.max_steps:.0%})" if self.max_steps else ""
        clock = f", ends ~{end}" if (end := self.ends_at()) is not None else ""
        line = (f"{self.state}: step {self.step:,}/{self.max_steps:,}{progress}, {dur(self.elapsed_s)} elapsed, "
                f"{self.steps_per_hour:,.0f} steps/h, {dur(self.left_s)} left{clock}; projected "
                f"{dur(self.projected_s)} (planned {planned}, window {dur(self.window_s)})")
        if self.startup_left_out_s is not None:
            line += (f"; the start-up ({dur(self.startup_left_out_s)}) is left out, as the plan prices none "
                     "(plan --calibrate measures it)")
        if self.steps_that_fit is not None:
            line += (f"; at this pace {self.steps_that_fit:,} steps fit ({self.epochs_that_fit:.2f} epochs): stop "
                     f"there (--max-steps {self.steps_that_fit}, or --deadline to stop with a checkpoint before the "
                     "window ends), or shorten the run (trainfit plan's options)")
        return line


@dataclass(frozen=True)
class Pace:
    """What the steps run so far (in this process) say of the steps to come."""

    seconds: float
    """Their time."""
    steps: int
    work_s: float | None = None
    """What the plan's fitted step cost expected of the very batches they trained on (None: the
    batches were not seen). The pace is then measured against the work done, not the step count:
    with random-order batches of long-tailed lengths the first steps' mix is not the epoch's."""
    eval_s: float = 0.0
    """Of ``seconds``, the evaluation passes' (their ``eval_runtime``): not the steps' pace."""
    evals: int = 0
    sights_s: float = 0.0
    """Of ``work_s``, the plan's first sights of the lengths the batches met first in this process."""

    def since(self, earlier: Pace) -> Pace:
        """The pace of what was done after ``earlier`` (a pace of the same run, taken before)."""
        work = None if self.work_s is None or earlier.work_s is None else self.work_s - earlier.work_s
        return Pace(self.seconds - earlier.seconds, self.steps - earlier.steps, work,
                    eval_s=self.eval_s - earlier.eval_s, evals=self.evals - earlier.evals,
                    sights_s=self.sights_s - earlier.sights_s)


class OnTrack:
    """The check of a run against ``plan``: :meth:`status` at a step."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        coefficients = plan.step_cost
        self.accumulation = micro_batches(plan.config)
        self.cost = None if coefficients is None or plan.model_step_s is None else StepCost(*coefficients)
        calibration = plan.calibration or {}
        same_config = calibration.get("trial") == plan.trial
        self.calibrated_steps = int(calibration.get("steps") or 0) if same_config else 0
        """Real trainer steps of the plan's own config that its pace rests on: a calibration's (0:
        none, one of another config whose cost per micro-batch the plan carried over, or one
        recorded before calibrations named their trial)."""

    def pooled(self, own: float, steps: int) -> float:
        """The pace of the steps to come, relative to the plan's (1: as planned): ``own``, that of
        ``steps`` steps of this run, pooled with the plan's pace, which counts as the calibrated
        steps it rests on. The plan's pace is its estimate from those steps (their trainer cost
        fitted apart from the machine's drift, at least 0), not their raw time. A run of few steps
        so far (the first tenth of a short run) leans on the plan, a long one on its own steps."""
        return (self.calibrated_steps + steps * own) / (self.calibrated_steps + steps)

    def batch_cost(self, padded_length: int) -> float | None:
        """The plan's expected seconds of one micro-batch padded to ``padded_length`` (None: the
        plan has no step cost)."""
        return None if self.cost is None else float(self.cost(float(padded_length))) / self.accumulation

    def first_sight(self, met: int) -> float:
        """The plan's first sight of a length, the process having met ``met`` lengths before it."""
        sights = self.plan.eta.first_sights
        return sights.first_s if met == 0 else sights.each_s

    def warm_step_s(self) -> float | None:
        """The plan's expected step without its share of the epoch's first sights, which a process pays
        once (None: the plan has no expected step)."""
        step, plan = self.plan.model_step_s, self.plan
        if step is None or not plan.eta.steps or not plan.epochs:
            return step
        return max(0.0, step - plan.eta.first_sights.epoch_s * plan.epochs / plan.eta.steps)

    def status(self, step: int, max_steps: int, elapsed_s: float, pace: Pace | None = None, *,
               startup_counted: bool = False, ended: bool = False) -> Status:
        """At ``step`` of ``max_steps``, ``elapsed_s`` into the run: the time of the steps still
        to come at ``pace`` (default: ``elapsed_s`` over ``step`` steps), the checkpoint saves
        and evaluation passes still to come, and the start-up the plan measured unless
        ``elapsed_s`` counts it already (``startup_counted``: timed from the process start),
        against the plan. ``ended``: the training is over (its last pass and save done): nothing
        is left."""
        pace = pace if pace is not None else Pace(elapsed_s, step)
        e = self.plan.eta_for(max_steps) if max_steps else self.plan.eta
        rest = (e.checkpoint_s * (1 - step / max_steps) if max_steps else 0.0)  # the saves to come (done: in the pace)
        rest += self._evals_left(step, max_steps, pace) + (0.0 if startup_counted else e.startup_s or 0.0)
        own_left, pooled_left = self._remaining_s(step, max_steps, pace)
        if ended:
            rest, own_left, pooled_left = 0.0, 0.0, None
        own = elapsed_s + own_left + rest
        projected = own if pooled_left is None else elapsed_s + pooled_left + rest
        state = ("on track" if projected <= e.high_s else "slower than planned" if projected <= self.plan.window_s
                 else "will miss the window")
        fit = None
        if state == "will miss the window" and max_steps > step:
            per_step = (projected - elapsed_s) / (max_steps - step)  # the steps to come, saves included
            fit = step + max(0, int((self.plan.window_s - elapsed_s) / per_step)) if per_step > 0 else None
        return Status(step=step, max_steps=max_steps, elapsed_s=elapsed_s, projected_s=projected,
                      planned_s=e.total_s, window_s=self.plan.window_s, state=state, steps_that_fit=fit,
                      epochs_that_fit=None if fit is None else self.plan.epochs * fit / (self.plan.eta.steps or max_steps),
                      own_pace_projected_s=None if pooled_left is None else own,
                      plan_steps=None if e is self.plan.eta else self.plan.eta.steps, at=time.time())

    def _remaining_s(self, step: int, max_steps: int, pace: Pace) -> tuple[float, float | None]:
        """The steps to come: the plan's expected work of them (its expected step, less what the
        seen batches already did) at the pace the seen batches ran against their expected work;
        without seen batches, at the steps so far's mean time each against the plan's step. Then
        the same at that pace pooled with the plan's (:meth:`pooled`; None: nothing to pool)."""
        left = max(0, max_steps - step)
        model_step = self.plan.model_step_s
        seconds = max(0.0, pace.seconds - pace.eval_s)
        if pace.steps <= 0 or left == 0:
            return 0.0, None
        if not pace.work_s or model_step is None:  # 0: the batches seen were taken for one collated ahead
            own_step, planned_step = seconds / pace.steps, self.plan.eta.step_time_s
            if not self.calibrated_steps or planned_step <= 0:
                return own_step * left, None
            return own_step * left, self.pooled(own_step / planned_step, pace.steps) * planned_step * left
        overhead = self.plan.eta.trainer_overhead_s or 0.0
        ratio = seconds / (pace.work_s + pace.steps * overhead)
        done_before = step - pace.steps  # a resumed run's earlier steps: at the plan's mean
        # This process's steps at the warm step less those done, and the first sights it has still to pay.
        warm = (max_steps - done_before) * (self.warm_step_s() or 0.0) - (pace.work_s - pace.sights_s)
        sights = self.plan.eta.first_sights  # what a run of max_steps meets of them (a shorter run: fewer)
        paid = sights.paid_s(max_steps - done_before)
        planned = max(0.0, warm) + max(0.0, paid - pace.sights_s) + left * overhead
        return ratio * planned, self.pooled(ratio, pace.steps) * planned if self.calibrated_steps else None

    def _evals_left(self, step: int, max_steps: int, pace: Pace) -> float:
        """The evaluation passes still to come in a run of ``max_steps``, each at the mean of the
        passes seen so far (else the plan's timed pass)."""
        ev = self.plan.evaluation
        if ev is None or not max_steps:
            return 0.0
        epochs = (self.plan.epochs * max_steps / self.plan.eta.steps
                  if self.plan.eta.steps and not self.plan.counts_its_run(max_steps) else self.plan.epochs)
        done = step // ev.every if ev.every else int(epochs * step / max_steps)
        left = max(0, ev.passes(max_steps, epochs) - done)
        return left * (pace.eval_s / pace.evals if pace.evals else ev.pass_s)


def observe_train_batches(trainer: Any, observe: Callable[[int], None]) -> Any:
    """Call ``observe`` with the padded length (``input_ids``' last dimension) of each batch
    ``trainer``'s training data loader collates, in order; returns ``trainer``. Only the training
    loader's batches are seen (an evaluation's loader collates with the plain collator), and not
    those collated in dataloader worker processes."""
    make_loader = trainer.get_train_dataloader

    def counted(features: Any, collate: Any) -> Any:
        batch = collate(features)
        ids = batch.get("input_ids") if hasattr(batch, "get") else None
        if ids is not None and hasattr(ids, "shape"):
            observe(int(ids.shape[-1]))
        return batch

    def train_loader(*args: Any, **kwargs: Any) -> Any:
        plain = trainer.data_collator  # the loader takes its collator when it is made
        trainer.data_collator = functools.partial(counted, collate=plain)
        try:
            return make_loader(*args, **kwargs)
        finally:
            trainer.data_collator = plain

    trainer.get_train_dataloader = train_loader
    return trainer


def load_plan(plan: Plan | str | Path) -> tuple[Plan, Path | None]:
    if isinstance(plan, Plan):
        return plan, None
    path = Path(plan)
    return Plan.from_json(json.loads(path.read_text())), path.parent


def trainer_callback_base() -> type:
    """``transformers.TrainerCallback``, imported when a callback class is defined."""
    from transformers import TrainerCallback

    return TrainerCallback


class OnTrackCallback(trainer_callback_base()):  # type: ignore[misc]
    """A ``transformers.TrainerCallback`` that checks the run against ``plan`` (a ``Plan`` or
    the path of a ``plan.json``) every ``every_s`` seconds and at the end.

    ``started_at``: the run's start in epoch seconds (``time.time()``), when the caller knows it
    (``trainfit train`` does: the first start, so a resumed run counts its earlier parts and its
    start-up; a plan that prices no start-up, uncalibrated, is held against the run less its own,
    said so in the line); None: the time counts from the trainer's start, plus the plan's start-up. The pace
    is that of the steps this process ran, so a resumed run projects from its own steps.
    ``on_status``: also called with each :class:`Status` (``trainfit train`` logs them). Given the
    trainer (:meth:`watch`), each status's figures (:meth:`Status.figures`) also reach its callbacks
    as its own logs do, so every ``report_to`` service receives them."""

    def __init__(self, plan: Plan | str | Path, every_s: float = 60.0, started_at: float | None = None,
                 on_status: Callable[[Status], None] | None = None) -> None:
        loaded, folder = load_plan(plan)
        self.check = OnTrack(loaded)
        self.every_s = every_s
        self.started_at = started_at
        self.on_status = on_status
        self.out = folder / "on_track.json" if folder is not None else None
        self.start: float | None = None
        self.began_at = 0.0
        """When the trainer started (epoch seconds): a run's start-up ends there."""
        self.first_step = 0
        self.last = 0.0
        self.latest: Status | None = None
        self.work_s: float | None = None
        self.met: set[int] = set()
        """The padded lengths this process's batches have met (each new one costs its first sight)."""
        self.sights_s = self.ahead_sight_s = 0.0
        self.ahead_s = 0.0
        self.eval_s = 0.0
        self.evals = 0
        self.warm: Pace | None = None
        """What the process had done at its first step's end (see :meth:`on_step_end`)."""
        self.trainer: Any = None
        """The trainer whose logs get each status's figures (:meth:`watch`)."""
        self.services: Sequence[Any] = ()
        """Callbacks that get each status's figures too: trainfit's loop has no trainer (:mod:`.trackers`)."""

    @classmethod
    def from_environment(cls, every_s: float = 60.0) -> OnTrackCallback | None:
        """The callback of a run ``trainfit train`` started with your ``tune.command_template``
        (``TRAINFIT_PLAN`` and ``TRAINFIT_STARTED_AT`` in the environment); None outside one, or
        without a plan."""
        import os

        plan = os.environ.get("TRAINFIT_PLAN")
        if not plan:
            return None
        started = os.environ.get("TRAINFIT_STARTED_AT")
        return cls(plan, every_s=every_s, started_at=float(started) if started else None)

    def watch(self, trainer: Any) -> Any:
        """Weigh each batch ``trainer``'s training data loader collates by the plan's step cost
        (see :func:`observe_train_batches`), so the pace is measured against the work the batches
        held; returns ``trainer``. accelerate's data loader collates one batch ahead of the one
        that trains: the latest seen is left out until the run ends. Each status's figures then reach
        the trainer's ``report_to`` services too (:meth:`Status.figures`)."""
        self.trainer = trainer
        return observe_train_batches(trainer, self.observe)

    def observe(self, padded_length: int) -> None:
        """A micro-batch padded to ``padded_length`` is about to train."""
        cost = self.check.batch_cost(padded_length)
        sight = 0.0 if padded_length in self.met else self.check.first_sight(len(self.met))
        self.met.add(padded_length)
        if cost is not None:
            self.work_s = (self.work_s or 0.0) + cost + sight
            self.sights_s += sight
            self.ahead_s, self.ahead_sight_s = cost + sight, sight

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.start = self.last = time.monotonic()
        self.began_at = time.time()
        self.first_step = int(state.global_step)  # a resumed run's steps so far
        self.work_s = None
        self.met = set()
        self.sights_s = self.ahead_sight_s = 0.0
        self.ahead_s = 0.0
        self.eval_s, self.evals = 0.0, 0
        self.warm = None

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None,
                    **kwargs: Any) -> None:
        """An evaluation pass ended: its time (``eval_runtime``) is not the steps' pace."""
        self.eval_s += float((metrics or {}).get("eval_runtime") or 0.0)
        self.evals += 1

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.start is None:
            return
        if self.warm is None and int(state.global_step) == self.first_step + 1:
            # This process's first step carries the warm-up (allocations, lazy initialization) that the
            # plan prices once in its start-up: the pace is measured from its end.
            self.warm = self._done(state, ahead=True)
        last = int(state.global_step) >= int(state.max_steps)
        past_warm_up = int(state.global_step) > self.first_step + 1  # the warm-up step alone tells no pace
        if last or (past_warm_up and time.monotonic() - self.last >= self.every_s):
            self._report(state, ahead=True)
            # The figures go to the trainer's services as the run goes and at its last step (not at its end:
            # they close their runs in their own on_train_end, which the trainer calls before this callback's).
            self._to_services(self.latest.figures(final=last) if self.latest else {}, args, state, control)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.start is not None:
            self._report(state, ahead=False, ended=int(state.global_step) >= int(state.max_steps))  # else stopped

    def _to_services(self, figures: dict[str, float], args: Any, state: Any, control: Any) -> None:
        """``figures`` to every callback of the watched trainer's ``on_log`` (its ``report_to``
        services among them), as the trainer's own logs reach them; not through ``trainer.log``,
        which would also take TRL's running metrics (token accuracy...) out of its next loss line;
        and to :attr:`services`."""
        if self.trainer is not None and figures:
            self.trainer.callback_handler.on_log(self.trainer.args, self.trainer.state, self.trainer.control, figures)
        for service in self.services if figures else ():
            service.on_log(args, state, control, logs=figures)

    def _done(self, state: Any, ahead: bool) -> Pace:
        """What this process did until now: since its start, the steps, their batches' expected
        work (less the batch collated ahead, while training goes on) and the passes."""
        assert self.start is not None
        work = None if self.work_s is None else max(0.0, self.work_s - (self.ahead_s if ahead else 0.0))
        return Pace(time.monotonic() - self.start, int(state.global_step) - self.first_step, work,
                    eval_s=self.eval_s, evals=self.evals,
                    sights_s=self.sights_s - (self.ahead_sight_s if ahead else 0.0))

    def _unpriced_startup(self) -> float | None:
        """This run's start-up where the plan prices none (uncalibrated) and the time counts from the
        run's launch: its launch to the trainer's start, left out of the verdict so that both sides
        hold the same (a resumed run's earlier parts are not told apart: None)."""
        if self.check.plan.eta.startup_s is not None or self.started_at is None or self.first_step:
            return None
        return max(0.0, self.began_at - self.started_at)

    def _report(self, state: Any, ahead: bool, ended: bool = False) -> None:
        assert self.start is not None
        self.last = time.monotonic()
        step = int(state.global_step)
        pace = self._done(state, ahead)
        if self.warm is not None and pace.steps > self.warm.steps:  # the pace since the first step's end
            pace = pace.since(self.warm)
        startup = self._unpriced_startup()
        if self.started_at is not None:
            elapsed = time.time() - self.started_at - (startup or 0.0)
        else:  # this process's time, and a resumed run's earlier steps at the plan's step time
            elapsed = self.last - self.start + self.first_step * self.check.plan.eta.step_time_s
        self.latest = dataclasses.replace(self.check.status(step, int(state.max_steps), elapsed, pace,
                                                            startup_counted=self.started_at is not None, ended=ended),
                                          startup_left_out_s=startup)
        from tqdm import tqdm  # type: ignore[import-untyped]

        tqdm.write(f"trainfit: {self.latest.line}", file=sys.stderr)  # above the trainer's bar, not inside it
        if self.on_status is not None:
            self.on_status(self.latest)
        if self.out is not None:
            write_atomically(self.out, json.dumps(self.latest.to_json(), indent=2) + "\n")
