"""What ``auto`` leaves unprobed, and why: the families (or their smaller batches) a memory-only
knob cannot help, and the process layouts whose state alone cannot fit (``summary.json``'s ``pruned``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainfit.search.auto import AutoStrategy, memory_only
from trainfit.search.trials import Trial


@dataclass(frozen=True)
class Pruned:
    """A family, or its smaller batches, that ``auto`` does not probe, and why."""

    family: dict[str, Any]
    """The knob values of the family (every searched knob but ``batch_size``)."""
    below_batch: int | None
    """Its batches up to this one are skipped (None: the whole family)."""
    reason: str


def pruned(auto: AutoStrategy, history: Sequence[Trial]) -> list[Pruned]:
    """What ``auto`` leaves unprobed for a memory-only knob value, and why (for the summary)."""
    out = []
    for family in auto.families:
        outgrown = auto.outgrown_layout(family, history)
        if outgrown is not None:
            need, t = outgrown
            out.append(Pruned(family=dict(family), below_batch=None, reason=(
                f"its weights and optimizer state alone would take {need / 1024**3:.3g} GiB a process (from "
                f"trial {t.number}'s measured parts, {_layout(auto.space.params(t.values))}), past the "
                f"{(auto.limit_bytes([t], margin=0.0) or 0) / 1024**3:.3g} GiB budget less headroom: "
                "no batch can fit")))
            continue
        lean = auto.lean(family)
        if lean is None or "batch_size" not in auto.space.names or not auto.family_trials(lean, history):
            continue
        knobs = ", ".join(k for k, v in family.items() if memory_only(k, v))
        above = auto.lean_limit(family, history)
        if above is None:
            out.append(Pruned(family=dict(family), below_batch=None, reason=(
                f"without {knobs} the climb ended below the memory limit ({_batches(lean, auto, history)} "
                f"fit): {knobs} only trades speed for memory, so it cannot be faster")))
        elif above and any(b <= above for b in auto.batches):
            out.append(Pruned(family=dict(family), below_batch=above, reason=(
                f"batches up to {above} fit without {knobs}, which only trades speed for memory there")))
    return out


def _layout(params: Any) -> str:
    """How a config's processes share the training, in words for a pruning's reason."""
    if params.parallel == "none" or params.nproc_per_node == 1:
        return "one process"
    return f"parallel: {params.parallel} over {params.nproc_per_node} processes"


def _batches(family: Mapping[str, Any], strategy: AutoStrategy, history: Sequence[Trial]) -> str:
    fits = sorted(b for b, t in strategy.family_trials(family, history).items() if t.feasible)
    return "batch " + ", ".join(map(str, fits)) if fits else "nothing measured"
