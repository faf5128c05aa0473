"""What one measured process layout says about another before it is probed: the model's weights and
optimizer state are the same tensors whether one process holds them all (no sharing, DDP) or FSDP
splits them over its processes, so a measurement's own parts (``Measurement.memory_parts_bytes``)
give another layout's share of them. That share alone is a lower bound of the other layout's peak
(gradients, activations and the runtime come on top): where it exceeds the budget, no batch of that
layout can fit, and ``auto`` does not probe it (see :func:`trainfit.search.pruned.pruned`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainfit.params import Params

LAYOUT_KNOBS = ("parallel", "nproc_per_node", "fsdp_reshard_after_forward", "fsdp_cpu_offload")
"""The knobs that say how processes share the training: the rest (LoRA, precision, the optimizer,
quantization...) decide how large the weights and the optimizer state are, so a layout is predicted
only from a measurement equal on them."""


def state_shards(params: Params) -> int | None:
    """How many ways a process layout splits the weights and optimizer state on the device: FSDP's
    processes on the machine (the probe's ranks), else 1; None where they are not on the device at
    all (FSDP's CPU offload keeps the shards in host memory)."""
    if params.parallel != "fsdp" or params.nproc_per_node == 1:
        return 1
    return None if params.fsdp_cpu_offload else params.nproc_per_node


def state_bytes_as(measured: Params, parts: Mapping[str, int], target: Params) -> float | None:
    """The weights and optimizer state a process of ``target``'s layout holds on the device, from
    the parts a process of ``measured``'s layout measured (None: no parts, or a layout with them off
    the device). The optimizer's state counts as measured: an optimizer that failed before its first
    step made none, and the figure stays a lower bound."""
    if "model" not in parts:
        return None
    shards_measured, shards_target = state_shards(measured), state_shards(target)
    if shards_measured is None or shards_target is None:
        return None
    return (parts["model"] + parts.get("optimizer", 0)) * shards_measured / shards_target


def same_but_layout(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Are two configs' values equal on every knob but the layout's (and the batch size)?"""
    skip = {*LAYOUT_KNOBS, "batch_size"}
    return all(a.get(k) == b.get(k) for k in {*a, *b} - skip) and any(a.get(k) != b.get(k) for k in LAYOUT_KNOBS)
