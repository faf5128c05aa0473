"""The training command a user runs, built from the same ``Params`` the probe ran.

With ``tune.command_template`` the user's own trainer is launched: ``{knob}`` placeholders are
filled from the configuration (custom keys too), e.g.::

    python -m vibevoice.finetune.train_vibevoice --per_device_train_batch_size {batch_size}
        --gradient_accumulation_steps {gradient_accumulation_steps} --lora_r {lora_r}

Without one, Hugging Face models get a ``trl sft`` command (TRL's CLI over transformers'
TrainingArguments and peft), whose flags are mapped knob by knob below.
"""

from __future__ import annotations

import shlex
import string
from collections.abc import Iterable
from typing import Any

from trainfit.errors import TrainfitError
from trainfit.params import Params
from trainfit.spec import Spec

_OPTIM = {"adamw": "adamw_torch", "adamw_fused": "adamw_torch_fused", "adamw_8bit": "adamw_bnb_8bit"}


def template_fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def template_problem(template: str, names: Iterable[str]) -> str | None:
    """What is wrong with a command template that may use ``names`` (None when nothing is)."""
    names = list(names)
    try:
        missing = [f for f in template_fields(template) if f not in names]
    except ValueError as err:
        return f"is not a valid template ({err}): placeholders are {{knob}}, a literal brace is {{{{ or }}}}"
    if missing:
        return f"uses unknown placeholders: {', '.join(missing)} (available: {', '.join(names)})"
    return None


def render_template(template: str, params: Params) -> str:
    values: dict[str, Any] = params.to_dict()
    values["effective_batch_size"] = params.effective_batch_size
    problem = template_problem(template, values)
    if problem:
        raise TrainfitError(f"command_template {problem}", "fix tune.command_template")
    return template.format_map({k: "" if v is None else v for k, v in values.items()})


def trl_args(params: Params) -> list[str]:
    """TRL ``sft`` / TrainingArguments flags for every knob."""
    args = ["--per_device_train_batch_size", str(params.batch_size),
            "--gradient_accumulation_steps", str(params.gradient_accumulation_steps)]
    if params.max_length is not None:
        args += ["--max_length", str(params.max_length)]
    if params.padding == "max_length" and params.max_length is not None:
        args += ["--pad_to_multiple_of", str(params.max_length)]
    if params.precision in ("bf16", "fp16"):
        args += [f"--{params.precision}"]
    if params.tf32:
        args += ["--tf32", "true"]
    if params.gradient_checkpointing:
        args += ["--gradient_checkpointing"]
    args += ["--attn_implementation", params.attention, "--optim", _OPTIM[params.optimizer]]
    if params.compile != "off":
        args += ["--torch_compile"]
        if params.compile != "default":
            args += ["--torch_compile_mode", params.compile]
    if params.lora_r is not None:
        args += ["--use_peft", "--lora_r", str(params.lora_r),
                 "--lora_alpha", str(params.lora_alpha if params.lora_alpha is not None else 2 * params.lora_r),
                 "--lora_dropout", str(params.lora_dropout)]
        targets = params.lora_target_modules
        if targets is not None:
            args += ["--lora_target_modules", *(list(targets) if isinstance(targets, tuple) else [targets])]
    return args


def build_command(spec: Spec, params: Params) -> str:
    """The command line for ``params``: the user's template, or ``trl sft`` for HF models."""
    if spec.tune.command_template:
        return render_template(spec.tune.command_template, params)
    if spec.model.factory is not None:
        raise TrainfitError("a custom factory model needs tune.command_template to build its training command",
                            "e.g. command_template: 'python train.py --batch_size {batch_size} ...'")
    model = spec.model.path or "<a local model folder: this spec builds a random-init model from a config>"
    data = spec.data.path if spec.data else "<your dataset>"
    parts = ["trl", "sft", "--model_name_or_path", model, "--dataset_name", data, *trl_args(params),
             "--output_dir", "trainfit-run"]
    return " ".join(shlex.quote(p) if not p.startswith("<") else f"'{p}'" for p in parts)


def command_script(spec: Spec, params: Params, header: str) -> str:
    try:
        cmd = build_command(spec, params)
    except TrainfitError as err:
        return f"#!/usr/bin/env bash\n{header}\n# No command: {err}\nexit 1\n"
    body = " \\\n    ".join(_split_flags(cmd))
    return f"#!/usr/bin/env bash\n{header}\nset -euo pipefail\n{body}\n"


def _split_flags(cmd: str) -> list[str]:
    """One flag and its values per line, for a readable script."""
    out: list[str] = []
    for token in shlex.split(cmd):
        quoted = shlex.quote(token)
        if token.startswith("--") or not out:
            out.append(quoted)
        else:
            out[-1] += " " + quoted
    return out
