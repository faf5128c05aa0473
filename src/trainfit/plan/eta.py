"""How long a run takes: the epoch's real work at the measured speed, the trainer's own per-step
cost where it was calibrated, the evaluation passes and the checkpoint saves, each with the spread
it was measured with."""

from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from trainfit.format import format_duration as dur
from trainfit.json_record import Record
from trainfit.plan.inputs import Candidate
from trainfit.probe.measurement import first_sights_of
from trainfit.search.ranking import micro_batches

if TYPE_CHECKING:
    from trainfit.plan.eval_pass import Evaluation
    from trainfit.trainer.calibration import Calibration

SAVE_SAMPLE_BYTES = 256 * 2**20
"""At most this much is written to time a checkpoint save; a larger checkpoint is priced at the
write speed measured on it."""


@dataclass(frozen=True, kw_only=True)
class FirstSights(Record):
    """What meeting new padded lengths costs a run's fresh process (docs/probe.md): the step time
    shares out an epoch's, and a run pays them once."""

    epoch_s: float = 0.0
    """An epoch's, for its ``shapes`` distinct lengths (``Candidate.first_sights_s``) ..."""
    each_s: float = 0.0
    """... of which each later length's (``Candidate.first_sight_s``) ..."""
    shapes: int = 0
    micro_batches: int = 1
    """... met by this many micro-batches a step: a run of fewer micro-batches than lengths meets fewer."""

    def paid_s(self, steps: int) -> float:
        """What a run of ``steps`` optimizer steps pays: the epoch's, less the lengths beyond one a
        micro-batch it trains (a run shorter than an epoch)."""
        return first_sights_of(self.epoch_s, self.each_s, self.shapes, min(self.shapes, steps * self.micro_batches))

    @property
    def first_s(self) -> float:
        """What the first new length a process meets costs (a compiled graph's recompile)."""
        return first_sights_of(self.epoch_s, self.each_s, self.shapes, 1)


@dataclass(frozen=True, kw_only=True)
class Eta(Record):
    """A run's expected duration and its interval, in seconds, with what it is made of."""

    samples: int
    """Samples trained: the dataset (or the subset) times the epochs."""
    steps: int
    train_s: float
    """The optimizer steps at the expected step time (the probe's, plus the calibrated trainer cost)."""
    step_time_s: float
    trainer_overhead_s: float | None
    """The trainer's own time per step measured by calibration; None: not calibrated."""
    startup_s: float | None
    """Launch to first step and last step to exit of ``trainfit train`` (what ``total_s`` is for),
    measured by calibration; None: not calibrated."""
    checkpoints: int
    checkpoint_s: float
    """All saves: their number times one save of this config's checkpoint (:func:`checkpoint_bytes`)
    at the write speed measured on the output folder's disk."""
    total_s: float
    low_s: float
    high_s: float
    spread_rel: float
    """The relative half-width of the training part's interval: the probe's and the calibration's
    measured spreads."""
    evals: int = 0
    """Evaluation passes in the run."""
    eval_s: float = 0.0
    """All passes: their number times one pass timed forward-only (``plan.eval_pass``), within its
    own spread in the interval."""
    command_startup_s: float | None = None
    """The same for the written command (``bash train_command.sh``: ``trl sft`` under ``accelerate
    launch``), measured by calibration; None: not calibrated."""
    first_sights: FirstSights = field(default_factory=FirstSights)
    """What the first sight of an epoch's padded lengths costs: the step time shares it out over one
    epoch, and ``train_s`` counts what the run pays of it once."""

    @property
    def command_total_s(self) -> float | None:
        """The ETA of the written command run as a user runs it (None: not calibrated): ``total_s``
        with the command's start-up in place of ``trainfit train``'s."""
        if self.command_startup_s is None:
            return None
        return self.total_s - (self.startup_s or 0.0) + self.command_startup_s

    def fits(self, window_s: float) -> bool:
        return self.high_s <= window_s

    @property
    def interval(self) -> str:
        """The interval in words: ``low - high``, or ``up to high (...)`` where the training part's
        spread reaches 100%, so its low end (clipped at no training time) bounds nothing, and a
        spread that wide makes its high end rough too."""
        if self.spread_rel < 1:
            return f"{dur(self.low_s)} - {dur(self.high_s)}"
        return (f"up to {dur(self.high_s)}; the measured spread, +-{self.spread_rel:.0%}, gives it no low end, and "
                "the high end is as rough: measure on a quieter machine")

    def for_steps(self, steps: int, *, checkpoint_every_s: float, evaluation: Evaluation | None,
                  epochs: float) -> Eta:
        """This ETA (of a run of ``epochs``) for a run of ``steps`` optimizer steps instead of its
        own, as ``train --max-steps`` makes: the same step time, spread, save and start-up; the
        saves and evaluation passes of that run."""
        if steps == self.steps or not self.steps:
            return self
        return _priced(round(self.samples * steps / self.steps), steps, self.step_time_s,
                       overhead=self.trainer_overhead_s, spread=self.spread_rel,
                       save_s=self.checkpoint_s / max(1, self.checkpoints), startup=self.startup_s,
                       command_startup=self.command_startup_s, checkpoint_every_s=checkpoint_every_s,
                       evaluation=evaluation, epochs=epochs * steps / self.steps, sights=self.first_sights)


def checkpoint_bytes(c: Candidate) -> int:
    """What one checkpoint holds, from the memory the probe measured: the optimizer's state, and
    the trained weights (with LoRA the adapters, half the state of AdamW's two moments; else the
    whole model)."""
    optimizer = c.optimizer_gb * 2**30
    weights = optimizer / 2 if c.lora_r else c.model_gb * 2**30
    return int(optimizer + weights)


def write_speed(folder: Path, size: int) -> float:
    """Bytes per second written to ``folder``'s disk and made durable (fsync), as a checkpoint
    save is, timed on ``size`` bytes (at most :data:`SAVE_SAMPLE_BYTES`)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = max(2**20, min(size, SAVE_SAMPLE_BYTES))
    block = os.urandom(min(written, 8 * 2**20))
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".trainfit-save-timing-") as f:
        start = time.perf_counter()
        left = written
        while left > 0:
            left -= f.write(block[:left])
        f.flush()
        os.fsync(f.fileno())
        seconds = time.perf_counter() - start
    return written / seconds


def run_speed(c: Candidate, e: Eta) -> float:
    """The samples/s of config ``c``'s run as ``e`` (its ETA) prices its steps: the model's step, and
    with a calibration the trainer's own cost too. What the plan ranks configs by."""
    return c.samples_per_step / e.step_time_s


def estimate(c: Candidate, samples: int, *, write_bytes_per_s: float, checkpoint_every_s: float,
             calibration: Calibration | None = None, evaluation: Evaluation | None = None,
             epochs: float = 1.0, per_micro_batch_s: float | None = None) -> Eta:
    """The duration of training ``samples`` samples with config ``c``.

    Without a calibration the time is the model's step alone, as the probe measured it over the
    epoch's own batches: a lower bound (a trainer adds its own per-step work). With one, the
    trainer's cost that it measured on top of what the probe expected (of the very batches it
    timed, where it recorded them), per micro-batch, is added to every micro-batch of this config
    too (``Calibration.step_overhead_s``): it is the trainer's, not the model's; and the run's start-up and end (launch to exit less its steps) as calibration measured
    them for ``trainfit train`` (the written command's beside it: ``Eta.command_total_s``). ``evaluation``: the passes a run of ``epochs`` makes, at the price measured for one
    (the trainer's time around a pass is not in it: the run's monitor subtracts the passes' own
    ``eval_runtime``). ``per_micro_batch_s``: this config's own trainer cost per micro-batch, in
    place of the calibration's (a tune that timed several configs: ``TrainerCost.per_micro_batch_for``). The step time shares out the first sight of an epoch's padded lengths
    (``Candidate.first_sights_s``), which a run pays once, whatever its epochs: counted once (less the
    lengths a run shorter than an epoch cannot meet)."""
    steps = math.ceil(samples / c.samples_per_step)
    overhead = startup = command_startup = None
    spread = c.spread_rel
    if calibration is not None:
        overhead = (calibration.step_overhead_s(micro_batches(c.config)) if per_micro_batch_s is None
                    else per_micro_batch_s * micro_batches(c.config))
        if math.isfinite(calibration.spread_rel):  # else unmeasured (too few steps shown): the plan says so
            spread = math.hypot(spread, calibration.spread_rel)
        command_startup = calibration.startup_s
        startup = calibration.train_startup_s if calibration.train_startup_s is not None else command_startup
    return _priced(samples, steps, c.step_time_s + (overhead or 0.0), overhead=overhead, spread=spread,
                   save_s=checkpoint_bytes(c) / write_bytes_per_s, startup=startup, command_startup=command_startup,
                   checkpoint_every_s=checkpoint_every_s, evaluation=evaluation, epochs=epochs,
                   sights=FirstSights(epoch_s=c.first_sights_s, each_s=c.first_sight_s, shapes=c.epoch_shapes,
                                      micro_batches=micro_batches(c.config)))


def _priced(samples: int, steps: int, step: float, *, overhead: float | None, spread: float, save_s: float,
            startup: float | None, command_startup: float | None, checkpoint_every_s: float,
            evaluation: Evaluation | None, epochs: float, sights: FirstSights | None = None) -> Eta:
    """The ETA of ``steps`` optimizer steps of ``step`` seconds (within ``spread``): a save of
    ``save_s`` every ``checkpoint_every_s`` and one at the end, the evaluation passes of a run of
    ``epochs``, and the start-up. ``step`` shares out an epoch's first ``sights``: the run pays
    what it meets of them once."""
    sights = sights or FirstSights()
    train = max(0.0, steps * step - sights.epoch_s * epochs + sights.paid_s(steps))
    saves = max(1, math.ceil(train / checkpoint_every_s))  # one every interval, the last at the end
    checkpoint = saves * save_s
    fixed = checkpoint + (startup or 0.0)
    evals = evaluation.passes(steps, epochs) if evaluation is not None else 0
    eval_s = evals * evaluation.pass_s if evaluation is not None else 0.0
    eval_spread = evaluation.spread_rel if evaluation is not None and math.isfinite(evaluation.spread_rel) else 0.0
    return Eta(samples=samples, steps=steps, train_s=train, step_time_s=step, trainer_overhead_s=overhead,
               startup_s=startup, checkpoints=saves, checkpoint_s=checkpoint, total_s=train + eval_s + fixed,
               low_s=train * max(0.0, 1 - spread) + eval_s * max(0.0, 1 - eval_spread) + fixed,
               high_s=train * (1 + spread) + eval_s * (1 + eval_spread) + fixed, spread_rel=spread, evals=evals,
               eval_s=eval_s, command_startup_s=command_startup, first_sights=sights)
