"""The knobs a workload applies to a built model, in one place and one order for every workload:
gradient checkpointing first, then LoRA (peft wraps the checkpointed model, as ``trl sft`` does).
What a model is built with (attention kernel, weight dtype) is the workload's own; what each
training step does (precision, optimizer, compile, TF32) is ``step.py``'s (in this package)."""

from __future__ import annotations

import warnings
from collections.abc import Collection
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.params import Params
from trainfit.workloads.lora import lora_config


def apply_knobs(model: Any, params: Params, *, handles: Collection[str] = (), **lora_extra: Any) -> Any:
    """``model`` with gradient checkpointing and LoRA applied as ``params`` asks, except the knobs
    in ``handles`` (a factory that applied them itself). Returns the model to train (peft's wrapper
    with LoRA). ``lora_extra``: more of peft's ``LoraConfig`` (e.g. ``task_type``)."""
    if params.gradient_checkpointing and "gradient_checkpointing" not in handles:
        enable_checkpointing(model)
    if params.lora_r is not None and "lora_r" not in handles:
        model = add_lora(model, params, **lora_extra)
    return model


def enable_checkpointing(model: Any) -> None:
    """Non-reentrant activation checkpointing (it works with frozen inputs, as under LoRA, without
    extra hooks), through whichever of transformers' spellings the model has."""
    enable = getattr(model, "activation_checkpointing_enable", None) or \
        getattr(model, "gradient_checkpointing_enable", None)
    if enable is None:
        raise TrainfitError("gradient_checkpointing=true but the model has no gradient_checkpointing_enable()",
                            "apply it in the factory and add 'gradient_checkpointing' to handles")
    for kwargs in ({"activation_checkpointing_kwargs": {"use_reentrant": False}},
                   {"gradient_checkpointing_kwargs": {"use_reentrant": False}}, {}):
        try:
            enable(**kwargs)
            return
        except TypeError:  # an older spelling of the arguments, or a custom model's method that takes none
            continue
    enable()  # the last spelling's own error, if it has one


def switch_checkpointing(model: Any, on: bool) -> None:
    """Turn a built model's activation checkpointing on or off in place (a kept model probed at the
    other value, ``Knob.switched``): on as :func:`enable_checkpointing` does, off through transformers'
    disable (peft's wrapper passes both to the model it wraps). A fresh model and a switched one
    recompute the same layers (tests/test_probe.py)."""
    if on:
        enable_checkpointing(model)
        return
    disable = getattr(model, "activation_checkpointing_disable", None) or \
        getattr(model, "gradient_checkpointing_disable", None)
    if disable is None:
        raise TrainfitError("gradient_checkpointing cannot be turned off on this model: it has no "
                            "gradient_checkpointing_disable()", "set probe.reuse_model: false")
    disable()


def add_lora(model: Any, params: Params, **extra: Any) -> Any:
    """peft's LoRA on ``model`` (see :func:`trainfit.workloads.lora.lora_config`)."""
    from peft import get_peft_model

    try:
        with warnings.catch_warnings():  # peft reads transformers' deprecated property: noise in every log
            warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
            return get_peft_model(model, lora_config(params, **extra))
    except ValueError as err:
        raise TrainfitError(
            f"LoRA could not be applied: {err}",
            "set params.lora_target_modules: 'all-linear' (every linear layer but the output head), "
            f"or a list of this model's linear layers: {', '.join(linear_names(model))}") from None


def linear_names(model: Any) -> list[str]:
    """The distinct names of a model's linear layers, as ``lora_target_modules`` takes them."""
    import torch

    names: dict[str, None] = {}
    for qualified, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D":  # GPT-2's linear
            names[qualified.rsplit(".", 1)[-1]] = None
    return list(names)
