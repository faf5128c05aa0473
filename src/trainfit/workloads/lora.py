"""LoRA as the probe applies it and as ``trl sft`` will: one reading of the ``lora_*`` knobs.

Names follow peft's matching: a list entry matches a module (or parameter) whose dotted name ends
with it; a lone string is a regular expression over the whole dotted name, except the shorthand
``all-linear``. A single module name is therefore passed as a one-entry list here and as the
equivalent expression to TRL, which turns a one-entry ``--lora_target_modules`` into a string.
"""

from __future__ import annotations

import re
from typing import Any

from trainfit.params import Params

ALL_LINEAR = "all-linear"


def _names(value: tuple[str, ...] | str | None) -> list[str] | str | None:
    if value is None or value == ALL_LINEAR:
        return value
    return [value] if isinstance(value, str) else list(value)


def _rank(params: Params) -> int:
    """``lora_r`` of a LoRA config (the callers here are only reached with one set)."""
    if params.lora_r is None:
        raise ValueError("not a LoRA config: lora_r is None")
    return params.lora_r


def lora_alpha(params: Params) -> float:
    return params.lora_alpha if params.lora_alpha is not None else 2 * _rank(params)


def lora_kwargs(params: Params) -> dict[str, Any]:
    """peft ``LoraConfig``'s arguments for ``params``: the adapters the probe trains."""
    kwargs: dict[str, Any] = {"r": _rank(params), "lora_alpha": lora_alpha(params), "lora_dropout": params.lora_dropout,
                              "target_modules": _names(params.lora_target_modules)}
    targets = _names(params.lora_target_parameters)
    if targets is not None:  # peft >= 0.17 only: passed only when asked for, as TRL does
        kwargs["target_parameters"] = targets
    return kwargs


def lora_config(params: Params, **extra: Any) -> Any:
    """peft's ``LoraConfig`` for ``params`` (``extra``: e.g. ``task_type``)."""
    from peft import LoraConfig

    # peft annotates lora_alpha as an int, but only divides it by r: the knob's float works as it is.
    return LoraConfig(**lora_kwargs(params), **extra)


def trl_lora_args(params: Params) -> list[str]:
    """``trl sft`` arguments for the same adapters as :func:`lora_config`. TRL's ``--lora_alpha`` is
    an int, the knob a float: a whole alpha is written as one (``16``, not ``16.0``); the spec refuses
    a fraction for ``trl sft`` (checked when the spec is loaded)."""
    alpha = lora_alpha(params)
    args = ["--use_peft", "true", "--lora_r", str(params.lora_r),
            "--lora_alpha", str(int(alpha)) if float(alpha).is_integer() else str(alpha),
            "--lora_dropout", str(params.lora_dropout)]
    modules = _names(params.lora_target_modules)
    if isinstance(modules, list) and len(modules) == 1:
        modules = rf"(.*\.)?{re.escape(modules[0])}"  # TRL makes a one-entry list a string: a regex to peft
    if modules is not None:
        args += ["--lora_target_modules", *([modules] if isinstance(modules, str) else modules)]
    parameters = _names(params.lora_target_parameters)
    if parameters is not None:
        args += ["--lora_target_parameters", *parameters]
    return args
