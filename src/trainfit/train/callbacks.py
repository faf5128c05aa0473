"""What ``trainfit train`` adds to a Hugging Face ``Trainer``, as ``TrainerCallback``s: a checkpoint
on a time interval (complete-marked, rotated: :mod:`trainfit.train.checkpoints`), a clean stop with
a checkpoint on SIGTERM or before a deadline, a JSON-lines log of the run, and the record of its
batches (``--record-batches``).

Each decision is a small pure piece (:class:`Interval`, :func:`deadline_near`) the callbacks call
at a step's end, so it is tested without a trainer.
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainfit.devices import process_peak_memory
from trainfit.errors import Terminated
from trainfit.files import open_own
from trainfit.train.monitor import trainer_callback_base
from trainfit.train.checkpoints import mark_complete, rotate
from trainfit.trainer.trainer_output import EPOCH_MARK


@dataclass
class Interval:
    """Time since the last checkpoint (or the start): a save is due every ``every_s`` seconds."""

    every_s: float
    last: float

    def due(self, now: float) -> bool:
        return now - self.last >= self.every_s


def deadline_near(now: float, deadline: float, step_s: float, save_s: float, eval_s: float = 0.0) -> bool:
    """Whether one more step and a checkpoint save (``step_s``, ``save_s``: their times so far),
    after the evaluation pass due first (``eval_s``: its time; 0: none is due), would end past
    ``deadline`` (all in seconds on one clock): then stop now, with a save and no evaluation."""
    return now + eval_s + step_s + save_s >= deadline


def past_epochs(args: Any, state: Any) -> int | None:
    """The epochs a run's ``max_steps`` take where they are more than its ``num_train_epochs`` (the
    trainer's names; ``state.num_train_epochs``: the epochs its steps reach, the last maybe partial),
    else None. ``max_steps`` decides, in trainfit's loop as in the Hugging Face trainer: the run is
    not cut at the epochs' end, and says so."""
    asked, reached = getattr(args, "num_train_epochs", None), getattr(state, "num_train_epochs", None)
    if getattr(args, "max_steps", -1) <= 0 or asked is None or reached is None or reached > 10**9:  # an iterable
        return None
    return int(reached) if reached > math.ceil(asked) else None


class RunLog:
    """A JSON-lines file, one object per event (``{"event": ..., "time": epoch seconds, ...}``),
    each line flushed as written so a crash loses none before it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, event: str, **fields: Any) -> None:
        with open_own(self.path, "a") as f:
            f.write(json.dumps({"event": event, "time": round(time.time(), 3), **fields}) + "\n")


class TrainControl(trainer_callback_base()):  # type: ignore[misc]
    """Saves a checkpoint into the trainer's ``output_dir`` every ``every_s`` seconds and at the last step, keeps the
    newest ``keep`` complete ones, and stops cleanly (saving first) on SIGTERM or when the next
    step and save would pass ``deadline`` (epoch seconds), counting the evaluation pass due before
    them (``eval_s``: one pass's time, the plan's until this process has run one). A stop cancels
    the evaluation due at its step or epoch end, so the save comes first. Logs steps, saves and
    stops to ``log``.

    ``stopped`` says why a run stopped early (None: it did not): a signal's name, ``deadline``, or
    ``diverged`` (a logged loss that is not finite: stopped without a save)."""

    def __init__(self, *, every_s: float, keep: int, log: RunLog, started_at: float,
                 deadline: float | None = None, save_s: float = 0.0, eval_s: float = 0.0,
                 lower_lr: str = "-- --learning_rate X", say: Callable[[str], None] = print) -> None:
        self.keep, self.log, self.say = keep, log, say
        self.lower_lr = lower_lr
        """How this run is given a lower learning rate, for the advice at a loss that is not finite."""
        self.started_at, self.deadline = started_at, deadline
        self.interval = Interval(every_s, time.monotonic())
        self.stopped: str | None = None
        self.at_once = False
        """Stopped without a save (a second Ctrl-C): set by the caller, which caught it."""
        self.signal: str | None = None
        self.save_s = save_s
        """One save's time: the last one this process made (before it, the caller's estimate)."""
        self.save_began = 0.0
        self.saved_step: int | None = None
        self.eval_s = eval_s
        """One evaluation pass's time: the mean of this process's passes (before one, the caller's estimate)."""
        self.evals: list[float] = []
        """This process's evaluation passes' times (s): not the steps' pace."""
        self.step_s = 0.0
        self.saves_s = 0.0
        """This process's saves' time: not the steps' pace."""
        self.began_at: float | None = None
        """When the trainer started in this process (epoch seconds): the start-up ends there."""
        self.first_step: int | None = None
        self.max_steps: int | None = None
        """The run's total steps, as the trainer counted them at its start (None: it has not started)."""
        self.step_began = False
        """A step began in this process: what fails before it may be the checkpoint's loading (the
        Trainer loads the RNG states after the training began, just before the resumed epoch's
        first step); what fails after it is the step's own (an out of memory, a bad batch)."""
        self.segment_began = 0.0

    def listen(self) -> Callable[[], None]:
        """Catch SIGTERM (a cluster's preemption), SIGHUP (the terminal closed) and a first Ctrl-C
        as a request to save and stop at the step's end; before the first step there is nothing to
        save, and they stop at once, as does a second Ctrl-C. Returns the function that restores
        the previous handlers (nothing is caught off the main thread, where Python allows no handler)."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}

        def on_signal(signum: int, frame: Any) -> None:
            name = signal.Signals(signum).name
            if self.first_step is None or (signum == signal.SIGINT and self.signal is not None):
                raise Terminated(signum) if signum != signal.SIGINT else KeyboardInterrupt
            self.signal = name
            self.say(f"trainfit: {name}: saving a checkpoint at the step's end, then stopping"
                     + (" (Ctrl-C again to stop at once, losing the steps since the last checkpoint)"
                        if signum == signal.SIGINT else ""))

        for s in previous:
            signal.signal(s, on_signal)

        def restore() -> None:
            for s, handler in previous.items():
                signal.signal(s, handler)

        return restore

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.interval.last = self.segment_began = time.monotonic()
        self.began_at, self.saves_s = time.time(), 0.0
        self.evals = []
        self.first_step, self.max_steps = int(state.global_step), int(state.max_steps)
        self.saved_step = self.first_step or None  # a resume's checkpoint: never saved over in place
        self.log.write("train_begin", step=self.first_step, max_steps=self.max_steps)
        epochs = past_epochs(args, state)
        if epochs is not None:
            self.say(f"trainfit: {int(state.max_steps):,} steps (max_steps) are more than the "
                     f"{args.num_train_epochs:g} epoch(s) asked for: training goes on over {epochs} epochs, the last "
                     "maybe in part, each in a new order (fewer steps: a smaller --max-steps)")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.step_began = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.monotonic()
        step = int(state.global_step)
        done = step - (self.first_step or 0)
        if done == 1:  # what a resume costs: its launch to here
            self.log.write("first_step", step=step, elapsed_s=round(time.time() - self.started_at, 3))
        self.step_s = max(0.0, now - self.segment_began - sum(self.evals) - self.saves_s) / done if done else 0.0
        stopping = step < state.max_steps and self._stops(step, control)  # a signal at the last step: it ends
        if stopping or self.signal is not None or self.interval.due(now) or step >= state.max_steps:
            self._save(control, now)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An epoch ended: the epoch strategy's evaluation pass runs now, before the next step, so
        the deadline is checked again with it counted; a run that stopped skips it."""
        step = int(state.global_step)
        if self.stopped is None and step < state.max_steps and getattr(control, "should_evaluate", False) \
                and self._stops(step, control) and self.saved_step != step:
            self._save(control, time.monotonic())
        if self.stopped is not None:
            control.should_evaluate = False

    def _stops(self, step: int, control: Any) -> bool:
        """Stop at ``step`` (a signal caught, or the deadline near: the evaluation pass due now, the
        next step and a save would pass it), cancelling the evaluation due: the save comes first."""
        evaluating = bool(getattr(control, "should_evaluate", False))
        reason = self.signal
        if reason is None and self.deadline is not None and deadline_near(
                time.time(), self.deadline, self.step_s, self.save_s, self.eval_s if evaluating else 0.0):
            reason = "deadline"
        if reason is None:
            return False
        self.stopped = reason
        control.should_training_stop = True
        control.should_evaluate = False
        self.say(f"trainfit: {reason}: saving a checkpoint at step {step:,} and stopping")
        self.log.write("stop", step=step, reason=reason)
        return True

    def _save(self, control: Any, now: float) -> None:
        control.should_save = True
        # The trainer logs before it saves: the loss since the last log is seen first, and a loss that is
        # not finite cancels the save (``diverged``) rather than checkpointing the weights it reached.
        control.should_log = True
        self.save_began = now

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None,
                    **kwargs: Any) -> None:
        """An evaluation pass ended (its ``eval_runtime``): the next deadline check counts one at
        this process's mean, and a save it held up is timed from now."""
        runtime = (metrics or {}).get("eval_runtime")
        if isinstance(runtime, (int, float)) and runtime >= 0:
            self.evals.append(float(runtime))
            self.eval_s = sum(self.evals) / len(self.evals)
        if getattr(control, "should_save", False):
            self.save_began = time.monotonic()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        self.log.write("log", step=int(state.global_step), max_steps=int(state.max_steps),
                       elapsed_s=round(time.time() - self.started_at, 3), **(logs or {}), **process_peak_memory())
        loss = (logs or {}).get("loss")
        if isinstance(loss, (int, float)) and not math.isfinite(loss) and self.stopped != "diverged":
            self.diverged(int(state.global_step), loss, control)

    def diverged(self, step: int, loss: float, control: Any) -> None:
        """Stop at a loss that is not finite, without a save: training on would train nothing (every
        later step's loss is NaN too), and the weights it reached are not worth keeping; the last
        checkpoint is from before it."""
        self.stopped = "diverged"
        control.should_training_stop = True
        control.should_save = False  # the step's end may have asked for one (an interval, the last step)
        self.say(f"trainfit: the loss is not finite ({loss}) at step {step:,}: stopping without a save (the last "
                 f"checkpoint is from before it); train again into a new --output with a lower learning rate "
                 f"({self.lower_lr}), or in bf16 rather than fp16")
        self.log.write("stop", step=step, reason="diverged", loss=str(loss))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        mark_complete(folder)
        removed = rotate(folder.parent, self.keep)
        now = time.monotonic()
        self.save_s = now - self.save_began
        self.saves_s += self.save_s
        self.saved_step = int(state.global_step)
        self.interval.last = now
        self.say(f"trainfit: checkpoint at step {state.global_step:,} ({self.save_s:.1f} s): {folder}")
        self.log.write("checkpoint", step=int(state.global_step), path=str(folder), save_s=round(self.save_s, 3),
                       removed=[p.name for p in removed])


class BatchRecord(trainer_callback_base()):  # type: ignore[misc]
    """``--record-batches``: the padded length of each training micro-batch, one a line, as the
    trainer collates it (:meth:`observe`, given to ``trainfit.train.monitor.observe_train_batches``),
    and a line :data:`EPOCH_MARK` where an epoch begins: an epoch's last optimizer step trains the
    micro-batches left over, fewer than the accumulation when they do not divide evenly. With
    dataloader worker processes the batches are not seen, and nothing but the marks is written."""

    def __init__(self, file: IO[str]) -> None:
        self.file = file

    def observe(self, padded_length: int) -> None:
        self.file.write(f"{padded_length}\n")

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.file.write(f"{EPOCH_MARK}\n")
