"""The training values of a real run: what it sets that a step's cost does not depend on (the
learning rate and its schedule, weight decay, clipping) and the services its metrics reach.

One record, :class:`TrainValues`, is the spec's ``train:`` section; ``compare``'s configs set the
same keys over it (:data:`TRAINING_KEYS`), the ``trl sft`` command carries them as flags
(:meth:`TrainValues.trl_args`), and ``trainfit train``'s own loop for a factory model trains by them
(:meth:`TrainValues.schedule`). The defaults are TRL's ``SFTConfig``'s, so a spec without the
section trains as ``trl sft`` does when told nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainfit.errors import TrainfitError

SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup")

REPORTERS = ("tensorboard", "wandb", "mlflow")
"""The services a run's metrics may reach (``train.report_to``), by the trainers' own names."""

MAX_GRAD_NORM = 1.0
"""The trainers' default ``max_grad_norm`` (transformers ``TrainingArguments``, TRL's ``SFTConfig``)."""

TRAINING_KEYS: dict[str, str] = {
    "learning_rate": "the peak learning rate (default 2e-5, TRL's)",
    "lr_scheduler_type": f"the learning rate's schedule: {', '.join(SCHEDULERS)} (default linear; transformers' "
                         "constant has no warmup, constant_with_warmup has)",
    "warmup_steps": "optimizer steps of linear warmup (default 0)",
    "warmup_ratio": "warmup as a share of the run's steps, 0-1 (instead of warmup_steps; a comparison gives it to TRL as "
                    "steps, the written command as the installed transformers takes a ratio)",
    "weight_decay": "AdamW's weight decay (default 0)",
    "max_grad_norm": "gradients clipped to this total norm (default 1.0)",
}
"""The training values a compare config or the ``train:`` section sets, and what each means."""


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """The training values resolved for one run of ``total_steps`` optimizer steps (the warmup in
    steps), as a training loop applies them."""

    learning_rate: float = 2e-5
    lr_scheduler_type: str = "linear"
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = MAX_GRAD_NORM
    total_steps: int = 1

    def factor(self, step: int) -> float:
        """The learning rate's multiplier at optimizer step ``step`` (0-based), as transformers'
        schedules of the same names compute it."""
        if self.lr_scheduler_type == "constant":
            return 1.0
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        if self.lr_scheduler_type == "constant_with_warmup":
            return 1.0
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        if self.lr_scheduler_type == "cosine":
            return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
        return max(0.0, 1.0 - progress)


@dataclass(frozen=True, kw_only=True)
class TrainValues:
    """The spec's ``train:`` section: the values a real run trains by (:data:`TRAINING_KEYS`) and
    where its metrics go. Left out, each is TRL's ``SFTConfig`` default."""

    learning_rate: float = 2e-5
    lr_scheduler_type: str = "linear"
    """linear | cosine | constant (no warmup, as transformers' has none) | constant_with_warmup."""
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    """Warmup as a share of the run's steps (instead of ``warmup_steps``)."""
    weight_decay: float = 0.0
    max_grad_norm: float = MAX_GRAD_NORM
    report_to: tuple[str, ...] = ()
    """tensorboard | wandb | mlflow: the services the run's loss, learning rate and on-track figures
    reach, through their own libraries, under the trainers' names (``train/loss``...)."""

    @classmethod
    def of(cls, raw: Mapping[str, Any]) -> TrainValues:
        """The values of a JSON record of them (``summary.json``'s spec, ``train.json``): empty, the defaults."""
        values: dict[str, Any] = {k: tuple(v) if k == "report_to" else v for k, v in raw.items()}
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "report_to": list(self.report_to)}

    def with_flags(self, argv: Sequence[str]) -> TrainValues:
        """These values with ``trl sft``'s flags of the same names over them (``--learning_rate 1e-4
        --report_to tensorboard``): what a factory run takes after ``--``, as a ``trl sft`` run does.
        Raises a :class:`~trainfit.errors.TrainfitError` naming a flag it does not take or a bad value."""
        given: dict[str, Any] = {}
        key = None
        for word in argv:
            if word.startswith("--"):
                key = word[2:].partition("=")[0]
                if key not in (*TRAINING_KEYS, "report_to"):
                    raise TrainfitError(f"{word}: a factory model's run takes only its training values after --",
                                        f"give --{' VALUE, --'.join(TRAINING_KEYS)} VALUE or --report_to "
                                        f"{'|'.join(REPORTERS)} (--max-steps caps the steps)")
                given[key] = [] if key == "report_to" else None
                if "=" in word:
                    given[key] = _flag_value(key, word.partition("=")[2], given[key])
            elif key is None:
                raise TrainfitError(f"{word!r} after -- is no flag's value", "give --NAME VALUE pairs")
            else:
                given[key] = _flag_value(key, word, given[key])
        problems = [f"--{k} {bad}" for k, v in given.items() if (bad := check_training(k, v))]
        if problems:
            raise TrainfitError(problems[0], "fix the value after --")
        values = {k: v for k, v in given.items() if k != "report_to"}
        out = self.over(values)
        return dataclasses.replace(out, report_to=tuple(dict.fromkeys(given["report_to"]))) if "report_to" in given else out

    def over(self, values: Mapping[str, Any]) -> TrainValues:
        """These values with ``values`` (a compare config's, checked by :func:`check_training`) over them:
        a warmup given one way replaces the other."""
        typed = {"warmup_steps": int, "lr_scheduler_type": str}
        changes = {k: typed.get(k, float)(v) for k, v in values.items()}
        if "warmup_steps" in changes and "warmup_ratio" not in changes:
            changes["warmup_ratio"] = 0.0
        elif "warmup_ratio" in changes and "warmup_steps" not in changes:
            changes["warmup_steps"] = 0
        return dataclasses.replace(self, **changes)

    def warmup(self, total_steps: int) -> int:
        """The warmup in optimizer steps for a run of ``total_steps``."""
        return self.warmup_steps or math.ceil(self.warmup_ratio * total_steps)

    def schedule(self, total_steps: int) -> Schedule:
        return Schedule(learning_rate=self.learning_rate, lr_scheduler_type=self.lr_scheduler_type,
                        warmup_steps=self.warmup(total_steps), weight_decay=self.weight_decay,
                        max_grad_norm=self.max_grad_norm, total_steps=total_steps)

    def trl_args(self, total_steps: int | None = None, against: TrainValues | None = None) -> list[str]:
        """The ``trl sft`` flags of the values that differ from ``against`` (default: TRL's defaults,
        so none at them: the command as before; a command's own values, for the flags that change
        them). ``total_steps``: the run's, where known, to give a warmup ratio as steps, which every
        transformers release takes; else the ratio as the installed one takes it."""
        default = against or TrainValues()
        words: list[str] = []
        for key in ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "max_grad_norm"):
            value = getattr(self, key)
            before = getattr(default, key)
            if key == "warmup_steps" and total_steps is not None:
                value, before = self.warmup(total_steps), default.warmup(total_steps)
            if value != before:
                words += [f"--{key}", f"{value:g}" if isinstance(value, float) else str(value)]
        if self.warmup_ratio != default.warmup_ratio and total_steps is None:
            words += [_ratio_flag(), f"{self.warmup_ratio:g}"]
        if self.report_to != default.report_to:
            words += ["--report_to", *(self.report_to or ("none",))]
        return words


def _ratio_flag() -> str:
    """transformers 5 takes a warmup ratio as ``--warmup_steps`` below 1 (its ``warmup_ratio`` is gone);
    earlier releases as ``--warmup_ratio``."""
    with contextlib.suppress(ImportError, ValueError):
        import transformers

        if int(transformers.__version__.split(".")[0]) < 5:
            return "--warmup_ratio"
    return "--warmup_steps"


def _flag_value(key: str, word: str, before: Any) -> Any:
    """A flag's word as its value: a number where it reads as one (``1e-4``), a service added to the list."""
    if key == "report_to":
        return [*before, *(w for w in word.split(",") if w and w != "none")]
    with contextlib.suppress(ValueError):
        return int(word)
    with contextlib.suppress(ValueError):
        return float(word)
    return word


def check_training(key: str, value: Any) -> str | None:
    """What is wrong with training value ``key`` set to ``value`` (None: nothing)."""
    if key == "lr_scheduler_type":
        return None if value in SCHEDULERS else f"must be one of {', '.join(SCHEDULERS)}, got {value!r}"
    if key == "report_to":
        bad = [v for v in value if v not in REPORTERS]
        return f"{', '.join(map(repr, bad))}: not one of {', '.join(REPORTERS)}" if bad else None
    if value is None:
        return "has no value"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, got {value!r}"
    if key == "warmup_steps" and (not isinstance(value, int) or value < 0):
        return f"must be a whole number >= 0, got {value!r}"
    if key == "warmup_ratio" and not 0 <= value <= 1:
        return f"must be between 0 and 1, got {value!r}"
    if key in ("learning_rate", "max_grad_norm") and not value > 0:
        return f"must be > 0, got {value!r}"
    if value < 0:
        return f"must be >= 0, got {value!r}"
    return None
