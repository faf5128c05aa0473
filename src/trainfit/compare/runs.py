"""What one config's training recorded (:class:`ConfigRun`, its ``result.json``) and the trainer
callback that records it (:class:`CurveLog`): every loss and evaluation against the steps' own
time, with a stop for a run that diverges."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from trainfit.monitor import trainer_callback_base
from trainfit.summary import Record

DIVERGED_RISE = 1.1
"""A run diverged when the mean of its last 5 losses passes its first 5's mean by this factor."""


@dataclass(frozen=True, kw_only=True)
class ConfigRun(Record):
    """``result.json`` of one config: how it trained, its curves, speed and memory."""

    name: str
    status: str
    """``finished``, ``diverged`` (stopped early: a non-finite loss, or one rising past its start),
    ``out_of_memory`` or ``failed``."""
    steps: int
    max_steps: int
    samples_per_step: int
    train_s: float
    """The steps' time: from the first step's start to the last's end, evaluations taken out."""
    eval_s: float
    samples_per_second: float | None
    peak_memory_gb: float | None
    """The process's peak: the GPU's allocated peak, or on a CPU its resident peak (model and data included)."""
    losses: list[list[Any]] = field(default_factory=list)
    """``[step, seconds of training so far, loss]`` at every step; a loss that is not finite is null."""
    evals: list[list[float]] = field(default_factory=list)
    """``[step, seconds of training so far, eval loss]`` at every evaluation."""
    diverged_at: int | None = None
    error: str | None = None
    wall_s: float | None = None
    """The config's process, launch to exit: imports, the model's build, the data, the steps, the passes."""

    @classmethod
    def failed(cls, name: str, max_steps: int, error: str, status: str = "failed") -> ConfigRun:
        """A config that did not train (``failed`` or ``out_of_memory``), with why."""
        return cls(name=name, status=status, steps=0, max_steps=max_steps, samples_per_step=0, train_s=0.0,
                   eval_s=0.0, samples_per_second=None, peak_memory_gb=None, error=error[-2000:])


class CurveLog(trainer_callback_base()):  # type: ignore[misc]
    """Records every logged loss and evaluation against the steps' own time, and stops a run whose
    loss is not finite or rises past its start, or whose steps took ``max_seconds``."""

    def __init__(self, name: str = "", say: Any = None, every: int = 0, max_seconds: float | None = None) -> None:
        self.name, self.say, self.every, self.max_seconds = name, say, every, max_seconds
        self.began: float | None = None
        self.eval_s = 0.0
        self.losses: list[list[Any]] = []
        self.evals: list[list[float]] = []
        self.diverged_at: int | None = None

    def seconds(self) -> float:
        return 0.0 if self.began is None else time.perf_counter() - self.began - self.eval_s

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = time.perf_counter()

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None,
                    **kwargs: Any) -> None:
        metrics = metrics or {}
        self.eval_s += float(metrics.get("eval_runtime") or 0.0)
        if "eval_loss" in metrics:
            self.evals.append([int(state.global_step), round(self.seconds(), 4), float(metrics["eval_loss"])])

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:
            return
        loss = float(logs["loss"])
        step = int(state.global_step)
        self.losses.append([step, round(self.seconds(), 4), loss if math.isfinite(loss) else None])
        if self.say is not None and self.every and (step % self.every == 0 or step == int(state.max_steps)):
            last_eval = f", eval loss {self.evals[-1][2]:.4g}" if self.evals else ""
            self.say(f"  {self.name}: step {step}/{state.max_steps}, loss {loss:.4g}{last_eval}")
        if self.max_seconds is not None and self.seconds() >= self.max_seconds:
            control.should_training_stop = True  # --minutes: the same training time for every config
        if self.diverged_at is None and diverged([math.nan if x[2] is None else x[2] for x in self.losses]):
            self.diverged_at = int(state.global_step)
            control.should_training_stop = True


def diverged(losses: list[float]) -> bool:
    """A loss that is not finite, or (past 10 of them) the last 5's mean above the first 5's by
    :data:`DIVERGED_RISE`."""
    if losses and not math.isfinite(losses[-1]):
        return True
    if len(losses) < 10:
        return False
    return sum(losses[-5:]) / 5 > DIVERGED_RISE * sum(losses[:5]) / 5


def peak_memory_gb(device: Any) -> float:
    import torch

    from trainfit.devices import peak_rss_bytes

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return peak_rss_bytes() / 2**30
