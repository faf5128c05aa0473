"""The next round's other moves (guide 001's: LoRA rank +-25%, the batch, loss weights,
regularization), each where the comparison's evidence supports it.

A move needs a clean comparison. The best config and a finished rival differ in one setting alone,
and the best holds the edge of the values tried:

- at the highest value, clearly better than its rivals there (not the same result), more may
  help: try past it;
- at the lowest value, at least as good (the best ranks first), less may do as well for less:
  try below it.

The learning rate has its own rule (:mod:`trainfit.compare.suggest`). The settings moved are
the LoRA rank and dropout, the batch, weight decay and clipping, and a factory model's own numeric
keys (a loss weight, a regularizer's rate); not the other training values (the warmup's have no
such edge). The rank moves by 25%, the batch by 2x, the rest by 25%.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainfit.compare.curves import final_loss, same_result
from trainfit.compare.runs import ConfigRun, Suggestion
from trainfit.params import KNOBS
from trainfit.spec.training import TRAINING_KEYS, TrainValues

MOVED = {"lora_r": 1.25, "lora_dropout": 1.25, "batch_size": 2.0, "gradient_accumulation_steps": 2.0,
         "weight_decay": 1.25, "max_grad_norm": 1.25}
"""The built-in settings a move changes, and by what factor; a factory's own numeric keys move by 1.25."""
WHOLE = ("lora_r", "batch_size", "gradient_accumulation_steps")
BELOW_ONE = ("lora_dropout",)
"""Settings whose values lie below 1: a move past it is none."""


def edge_moves(best: str, given: dict[str, dict[str, Any]], runs: dict[str, ConfigRun], order: list[str],
               defaults: Mapping[str, Any]) -> list[Suggestion]:
    """A move for each setting the best holds at the edge of the values tried (see the module);
    ``order``: the finished configs, best first; ``defaults``: the spec's params, which a config
    inherits where it names no value."""
    defaults = {**TrainValues().to_json(), **defaults}
    out = []
    for key in sorted({k for n in order for k in given[n] if k in MOVED or k not in KNOBS and k not in TRAINING_KEYS}):
        tried = {n: v for n in order if (v := _number(given[n].get(key, defaults.get(key)))) is not None}
        rivals = [n for n in tried if n != best and _alike(given[n], given[best], key, defaults)]
        if best not in tried or not rivals:
            continue
        value, values = tried[best], set(tried.values())
        up = value == max(values) and all(not same_result(runs[best], runs[n]) for n in rivals)
        if not up and value != min(values):
            continue
        factor = MOVED.get(key, 1.25)
        new = value * factor if up else value / factor
        new = max(1, round(new)) if key in WHOLE else float(f"{new:.3g}")
        if new == value or new in values or key in BELOW_ONE and new >= 1:
            continue  # tried already, or past its range (a dropout of 1 drops everything)
        name = f"{best}_{key}_{new:g}"
        evidence = "; ".join(f"{n} ({key}={tried[n]:g}): final loss {final_loss(runs[n]):.4g}" for n in [best, *rivals])
        says = (f"{best} was the best at the {'highest' if up else 'lowest'} {key} tried ({value:g}), "
                f"{'clearly ahead of' if up else 'as good as or better than'} the configs that differ from it in "
                f"{key} alone: try {new:g}")
        out.append(Suggestion(says=says, evidence=evidence, configs={name: {**given[best], key: new}}))
    return out


def _number(value: Any) -> float | None:
    """``value`` where it is a number (not a bool); None otherwise."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _alike(a: Mapping[str, Any], b: Mapping[str, Any], key: str, defaults: Mapping[str, Any]) -> bool:
    """Do configs ``a`` and ``b`` set the same values, ``key`` aside (a setting left out at its default)?"""
    return all(a.get(k, defaults.get(k)) == b.get(k, defaults.get(k)) for k in {*a, *b} - {key})
