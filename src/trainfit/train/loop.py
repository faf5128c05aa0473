"""The training loop of a custom (factory) model: the probe's own :class:`trainfit.workloads.step.TrainStep`
over the real dataset, so what trains is what was measured.

The factory's ``collate`` makes rows into inputs; rows stream in :func:`trainfit.data.order.epoch_rows`'s
reproducible order. An optimizer step takes ``batch_size x gradient_accumulation_steps`` samples
(fewer at an epoch's end) and never spans two epochs. A checkpoint (``checkpoint-STEP``) holds the
model, optimizer, scaler and RNG states and where the data stands (epoch, samples read in it); the
stop and save decisions are :class:`trainfit.train.callbacks.TrainControl`'s, called as the Hugging
Face trainer calls a callback, so both loops stop, save and rotate alike.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from trainfit.data.order import epoch_rows, file_rows
from trainfit.devices import resolve_device_name
from trainfit.errors import TrainfitError
from trainfit.files import write_atomically
from trainfit.params import Params
from trainfit.progress import Progress
from trainfit.spec import Spec
from trainfit.train.checkpoints import unloadable
from trainfit.probe.ranks import distribute
from trainfit.train.loading import loaded_steps, steps_of
from trainfit.train.ranks import Rank, agree, barrier, mean_loss, rank_device, this_rank
from trainfit.workloads import build_workload
from trainfit.workloads.factory import FactoryWorkload
from trainfit.workloads.base import to_device
from trainfit.workloads.step import TrainStep

if TYPE_CHECKING:
    from trainfit.plan.eval_pass import EvalSchedule
    from trainfit.spec.training import Schedule, TrainValues

STATE = "loop_state.json"
LOG_EVERY = 10
"""Steps between loss lines in the log (the Hugging Face trainer's ``logging_steps`` default)."""


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a run stands: optimizer steps done, the epoch, and samples of it already trained on."""

    step: int = 0
    epoch: int = 0
    consumed: int = 0


def plan_steps(samples: int, per_step: int, epochs: float, max_steps: int | None) -> tuple[int, int]:
    """(steps per epoch, total steps): a step per ``per_step`` samples, the last of an epoch
    partial; ``epochs`` may be fractional. ``max_steps``, when given, is the total, over as many
    epochs as it takes, fewer or more than ``epochs``: as the Hugging Face trainer's ``max_steps``
    overrides its ``num_train_epochs``, so a factory run and a ``trl sft`` run stop alike."""
    per_epoch = max(1, math.ceil(samples / per_step))
    return per_epoch, max_steps if max_steps else max(1, math.ceil(per_epoch * epochs))


def save(folder: Path, step_runner: Any, position: Position) -> None:
    """The checkpoint's files (its completion mark is written after, by the caller's control)."""
    import numpy as np
    import torch

    me = this_rank()
    folder.mkdir(parents=True, exist_ok=True)
    if me.rank == 0:  # DDP keeps the weights and the optimizer the same on every rank
        torch.save(plain(step_runner.workload.model).state_dict(), folder / "model.pt")
        torch.save(step_runner.optimizer.state_dict(), folder / "optimizer.pt")
        if step_runner.scaler is not None:
            torch.save(step_runner.scaler.state_dict(), folder / "scaler.pt")
        if step_runner.scheduler is not None:
            torch.save(step_runner.scheduler.state_dict(), folder / "scheduler.pt")
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state(),
           "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    torch.save(rng, folder / _rng_file(me))
    if me.rank == 0:
        write_atomically(folder / STATE, json.dumps(dataclasses.asdict(position)) + "\n")
    barrier()  # every rank's part written before rank 0's control marks it complete


def load(folder: Path, step_runner: Any, device: Any) -> Position:
    """Restore a checkpoint :func:`save` wrote; a file that cannot be read is a clear error."""
    import numpy as np
    import torch

    try:
        plain(step_runner.workload.model).load_state_dict(torch.load(folder / "model.pt", map_location=device))
        step_runner.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location=device))
        if step_runner.scaler is not None:
            step_runner.scaler.load_state_dict(torch.load(folder / "scaler.pt"))
        if step_runner.scheduler is not None:
            step_runner.scheduler.load_state_dict(torch.load(folder / "scheduler.pt"))
        rng = torch.load(folder / _rng_file(this_rank()), weights_only=False)
        raw = json.loads((folder / STATE).read_text())
        position = Position(step=int(raw["step"]), epoch=int(raw["epoch"]), consumed=int(raw["consumed"]))
    except Exception as err:  # a damaged file, or a loop_state.json of valid JSON but the wrong shape
        raise unloadable(folder, err) from err
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    if rng.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return position


def _rng_file(me: Rank) -> str:
    """A rank's random state's file (one process: ``rng_state.pth``, the Hugging Face trainer's name too)."""
    return "rng_state.pth" if me.world == 1 else f"rng_state_{me.rank}.pth"


def plain(model: Any) -> Any:
    """The module under a ``torch.compile`` or DDP wrapper: its weights' names are the model's own."""
    while hasattr(model, "_orig_mod") or type(model).__name__ == "DistributedDataParallel":
        model = getattr(model, "_orig_mod", None) or model.module
    return model


def evaluate(runner: Any, collate: Callable[[list[Any]], Any], evaluation: EvalSchedule, *, fmt: str = "auto",
             on_bad_row: str = "stop") -> dict[str, float]:
    """One pass over the eval set in file order, forward only: the loss per sample over the pass
    and its seconds, under the names the Hugging Face trainer logs them by."""
    began = time.perf_counter()
    total, seen = 0.0, 0
    for micro in steps_of(file_rows(evaluation.path, fmt=fmt, on_bad_row=on_bad_row), evaluation.batch_size, 1):
        rows = micro[0]
        total += runner.evaluate(to_device(collate(rows), runner.device)) * len(rows)
        seen += len(rows)
    if seen == 0:
        raise TrainfitError(f"the eval set {evaluation.path} gave no rows", "check the plan's --eval-data")
    seconds = time.perf_counter() - began
    return {"eval_loss": round(total / seen, 6), "eval_runtime": round(seconds, 4),
            "eval_samples_per_second": round(seen / seconds, 3)}


class _Hooks:
    """What the loop shows its callbacks, as the Hugging Face trainer does (``args``, ``state``,
    ``control``, each event), and when it evaluates: the trainer's step strategy
    (:meth:`EvalSchedule.due`) or its epoch strategy."""

    def __init__(self, callbacks: Sequence[Any], output: Path, steps: tuple[int, int], epochs: float,
                 max_steps: int | None, position: Position, evaluation: EvalSchedule | None, log_every: int,
                 run_eval: Callable[[EvalSchedule], dict[str, float]], device: Any = "cpu") -> None:
        self.callbacks, self.evaluation, self.run_eval, self.log_every = callbacks, evaluation, run_eval, log_every
        self.device = device
        per_epoch, total = steps
        # The trainer's names: what the run was asked for (``args``), and the epochs its steps take (``state``).
        self.args = SimpleNamespace(output_dir=str(output), num_train_epochs=epochs, max_steps=max_steps or -1)
        self.state = SimpleNamespace(global_step=position.step, max_steps=total, epoch=position.epoch,
                                     num_train_epochs=math.ceil(total / per_epoch))
        self.control = SimpleNamespace(should_save=False, should_training_stop=False, should_evaluate=False)

    def call(self, event: str, **kwargs: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, event)(self.args, self.state, self.control, **kwargs)
        if event in ("on_step_end", "on_log", "on_epoch_end"):
            agree(self.control, self.device)  # on several processes: what rank 0's callbacks decided

    def evaluates_at_epoch_end(self) -> bool:
        return self.evaluation is not None and not self.evaluation.every

    def after_step(self, losses: list[float], save_now: Callable[[], None],
                   figures: Callable[[], dict[str, float]]) -> list[float]:
        """What the trainer does after a step, in its order: the step's callbacks (told of the
        evaluation due, which they may cancel: ``control.should_evaluate``), that evaluation, the
        loss line every ``log_every`` steps (with ``figures``: the gradient norm and learning rate,
        as the trainer's), a save when the control asks for one. Returns the losses not yet logged."""
        state = self.state
        self.control.should_evaluate = self.evaluation is not None and self.evaluation.due(state.global_step,
                                                                                           state.max_steps)
        self.call("on_step_end")
        if self.control.should_evaluate:
            self.evaluate()
        # A loss that is not finite is logged at once: the callbacks stop the run there (``TrainControl``).
        if state.global_step % self.log_every == 0 or state.global_step == state.max_steps \
                or not math.isfinite(losses[-1]):
            self.call("on_log", logs={"loss": round(sum(losses) / len(losses), 6), **figures(),
                                      "epoch": round(state.epoch, 4)})
            losses = []
        self.saved(save_now)
        return losses

    def at_epoch_end(self, save_now: Callable[[], None]) -> None:
        """What the trainer does at an epoch's end: the callbacks' ``on_epoch_end`` (told of the
        epoch strategy's evaluation, which they may cancel), that evaluation, a save they ask for."""
        self.control.should_evaluate = self.evaluates_at_epoch_end()
        self.call("on_epoch_end")
        if self.control.should_evaluate:
            self.evaluate()
        self.saved(save_now)

    def saved(self, save_now: Callable[[], None]) -> None:
        if self.control.should_save:
            save_now()
            self.call("on_save")
            self.control.should_save = False

    def evaluate(self) -> None:
        assert self.evaluation is not None
        self.control.should_evaluate = False
        metrics = self.run_eval(self.evaluation)
        self.call("on_evaluate", metrics=metrics)
        self.call("on_log", logs={**metrics, "epoch": round(self.state.epoch, 4)})


def run_loop(spec: Spec, params: Params, *, samples: int, epochs: float, max_steps: int | None, output: Path,
             checkpoint: Path | None, callbacks: Sequence[Any], say: Callable[[str], None],
             evaluation: EvalSchedule | None = None, training: TrainValues | None = None,
             log_every: int = LOG_EVERY) -> tuple[int, int]:
    """Train ``spec``'s factory model with ``params`` for ``epochs`` over its ``samples`` rows (or
    ``max_steps``, over as many epochs as they take), from ``checkpoint`` when given; ``callbacks``
    are called as a Hugging Face trainer calls them. ``evaluation``: its eval set evaluated on its
    schedule, as the trainer's step or epoch strategy does (also after the last step). ``training``:
    the learning rate and the rest (:class:`trainfit.spec.training.TrainValues`; None: the probe's).
    ``log_every``: steps between loss lines. Returns (steps done, total steps); the model's weights
    end in ``output/model.pt``."""
    import torch

    data = spec.data
    assert data is not None
    per_epoch, total = plan_steps(samples, params.effective_batch_size, epochs, max_steps)
    workload, runner, collate, device = _factory_runner(
        spec, params, samples, training.schedule(total) if training else None)
    position = load(checkpoint, runner, device) if checkpoint is not None else Position()
    hooks = _Hooks(callbacks, output, (per_epoch, total), epochs, max_steps, position, evaluation, log_every,
                   lambda e: evaluate(runner, collate, e, fmt=data.format, on_bad_row=data.on_bad_row), device)
    state, control, call = hooks.state, hooks.control, hooks.call
    call("on_train_begin")
    bar = Progress("training", total, unit="steps", done=position.step)
    epoch, consumed, losses, shown = position.epoch, position.consumed, [], ""
    try:
        while state.global_step < total:
            rows = functools.partial(epoch_rows, data.path, seed=spec.probe.seed, epoch=epoch, fmt=data.format,
                                     skip=consumed, on_bad_row=data.on_bad_row)
            for count, inputs in loaded_steps(rows, params, collate, device):
                losses.append(mean_loss(runner.run_inputs(inputs), device))
                consumed += count
                state.global_step += 1
                state.epoch = epoch + consumed / samples
                logged, losses = losses, hooks.after_step(losses, functools.partial(
                    save, output / f"checkpoint-{state.global_step}", runner, Position(state.global_step, epoch, consumed)),
                    runner.figures)
                if logged and not losses:  # a loss line was logged: the console shows it too
                    shown = f", loss {sum(logged) / len(logged):.4g}"
                bar.update(state.global_step, note=f"epoch {state.epoch:.2f}{shown}")
                if control.should_training_stop or state.global_step >= total:
                    break
            else:  # the epoch's rows are all read
                _refuse_empty(consumed, data.path, epoch)
                # A stop here saves where a resume runs the epoch's end again: the evaluation it cancelled.
                hooks.at_epoch_end(functools.partial(save, output / f"checkpoint-{state.global_step}", runner,
                                                     Position(state.global_step, epoch, consumed)))
                if not control.should_training_stop:
                    epoch, consumed = epoch + 1, 0
                    continue
            break
        if hooks.evaluates_at_epoch_end() and state.global_step >= total and consumed:
            hooks.evaluate()  # the last epoch's end (a partial one), as the trainer's epoch strategy does
    finally:
        bar.close(note=f"epoch {state.epoch:.2f}{shown}")
    call("on_train_end")
    if not control.should_training_stop and this_rank().rank == 0:
        torch.save(plain(workload.model).state_dict(), output / "model.pt")
    return int(state.global_step), total


def _refuse_empty(consumed: int, path: Any, epoch: int) -> None:
    """An epoch that gave no rows (every row skipped as bad, or the file emptied since) would loop forever."""
    if consumed == 0:
        raise TrainfitError(f"{path} gave no rows to train on in epoch {epoch + 1}",
                            "check data.path (and data.on_bad_row: every row skipped?)")


def _factory_runner(spec: Spec, params: Params, samples: int,
                    schedule: Schedule | None = None) -> tuple[Any, Any, Callable[[list[Any]], Any], Any]:
    """The factory's workload, the probe's ``TrainStep`` over it, its ``collate`` and the device:
    a clear error for a factory without ``collate`` or data without samples."""
    import torch

    assert spec.data is not None
    device = torch.device(rank_device(resolve_device_name(spec.probe.device)))
    torch.manual_seed(spec.probe.seed)
    workload = build_workload(spec, params, device)
    assert isinstance(workload, FactoryWorkload)
    workload.model = distribute(workload.model, params, device)  # several processes: under DDP, as probed
    collate = workload.custom.collate
    if collate is None:
        raise TrainfitError(f"the factory {spec.model.factory} returns no collate: trainfit has no way to make the "
                            "dataset's rows into the model's inputs",
                            "return trainfit.CustomWorkload(..., collate=lambda rows: inputs) (rows are the data "
                            "file's records as dicts), or train with your own loop")
    if samples < 1:
        raise TrainfitError(f"{spec.data.path} holds no samples to train on (the tune counted {samples})",
                            "check data.path, then tune again")
    return workload, TrainStep(workload, params, device, schedule), collate, device
