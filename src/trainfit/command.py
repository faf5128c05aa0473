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
from pathlib import Path
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


TEMPLATE_EXTRAS = ("effective_batch_size", "epochs")
"""Placeholders besides the knobs: ``batch_size x gradient_accumulation_steps`` and ``tune.epochs``
(the epochs the runtime estimate is for)."""


def render_template(template: str, params: Params, epochs: float = 1.0, max_length: int | None = None) -> str:
    """``max_length``: the length the probe truncated at (for ``{max_length}`` when the knob is
    null: the longest sample, not an empty argument)."""
    values: dict[str, Any] = params.to_dict()
    values.update(effective_batch_size=params.effective_batch_size, epochs=f"{epochs:g}")
    if max_length is not None:
        values["max_length"] = max_length
    problem = template_problem(template, values)
    if problem:
        raise TrainfitError(f"command_template {problem}", "fix tune.command_template")
    return template.format_map({k: "" if v is None else v for k, v in values.items()})


_LOADERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "text": "text"}
"""``datasets`` loaders for the data formats trainfit reads (TSV and save_to_disk folders have none)."""


def is_trl_command(factory: str | None, command_template: str | None) -> bool:
    """Is the training command a ``trl sft`` one (no user template, a Hugging Face model)? Takes
    the two keys, so a spec being validated can ask too."""
    return not command_template and factory is None


def writes_trl(spec: Spec) -> bool:
    return is_trl_command(spec.model.factory, spec.tune.command_template)


def trl_data_config(spec: Spec) -> dict[str, Any] | None:
    """The ``datasets:`` section of a TRL config file that loads the spec's data file. TRL's
    ``--dataset_name`` takes Hub names and folders, not a file; None where no loader fits or the
    command is not a ``trl sft`` one."""
    if spec.data is None or not writes_trl(spec):
        return None
    from trainfit.data.readers import data_files, detect_format

    loader = _LOADERS.get(detect_format(Path(spec.data.path), spec.data.format))
    files = [str(f) for f in data_files(spec.data.path)]  # shards: the very files trainfit counted, in order
    return None if loader is None else {"datasets": [{"path": loader, "data_files": files[0] if len(files) == 1
                                                      else files}]}


def trl_args(params: Params, max_length: int | None = None, cpu: bool = False) -> list[str]:
    """TRL ``sft`` flags for every knob, each one explicit: TRL's own defaults differ from the
    probe's (bf16 on unless told, gradient checkpointing on, max_length 1024, fp32 LoRA base).
    ``max_length``: the length the probe truncated at (see ``LengthStats.truncation_length``: the
    dataset's longest sample when ``params.max_length`` is null, never past the model's positions);
    None: ``params.max_length``. ``cpu``: probed on a CPU, where TF32 does nothing and transformers
    refuses ``--tf32 true``."""
    args = ["--per_device_train_batch_size", str(params.batch_size),
            "--gradient_accumulation_steps", str(params.gradient_accumulation_steps)]
    max_length = max_length if max_length is not None else params.max_length
    if max_length is not None:
        args += ["--max_length", str(max_length)]
    if params.padding == "max_length" and max_length is not None:
        args += ["--pad_to_multiple_of", str(max_length)]
    half = params.precision in ("bf16", "fp16")
    # LoRA trains adapters over a frozen base held in the compute dtype; full fine-tuning keeps fp32 weights.
    dtype = {"bf16": "bfloat16", "fp16": "float16"}[params.precision] if half and params.lora_r else "float32"
    args += ["--bf16", _flag(params.precision == "bf16"), "--fp16", _flag(params.precision == "fp16"),
             "--dtype", dtype, "--tf32", _flag(params.tf32 and not cpu),
             "--gradient_checkpointing", _flag(params.gradient_checkpointing),
             "--attn_implementation", params.attention, "--optim", _OPTIM[params.optimizer]]
    if params.compile != "off":
        args += ["--torch_compile", "true"]
        if params.compile != "default":
            args += ["--torch_compile_mode", params.compile]
    if params.lora_r is not None:
        from trainfit.workloads.lora import trl_lora_args

        args += trl_lora_args(params)
    return args


def _flag(on: bool) -> str:
    return "true" if on else "false"


def build_command(spec: Spec, params: Params, *, max_length: int | None = None,
                  data_config: Path | None = None, cpu_threads: int | None = None) -> str:
    """The command line for ``params``: the user's template, or ``trl sft`` for HF models.
    ``data_config``: a TRL config file holding :func:`trl_data_config` (see ``write_outputs``).
    ``cpu_threads``: the threads a CPU probe ran with (None: not a CPU probe); ``trl sft`` starts
    ``accelerate launch``, which gives each process one CPU thread unless OMP_NUM_THREADS says
    otherwise (on the 2-vCPU test machine, one thread trained at about half the speed;
    docs/benchmarks.md)."""
    if spec.tune.command_template:
        return render_template(spec.tune.command_template, params, spec.tune.epochs, max_length)
    if spec.model.factory is not None:
        raise TrainfitError("a custom factory model needs tune.command_template to build its training command",
                            "e.g. command_template: 'python train.py --batch_size {batch_size} ...'")
    model = spec.model.path or "<a local model folder: this spec builds a random-init model from a config>"
    if data_config is not None:
        data = ["--config", str(data_config)]
    else:
        data = ["--dataset_name", "<your dataset: a Hub name or a folder>" if spec.data is None
                else f"<{spec.data.path} as a Hub name or a folder>"]
    if spec.data is not None and isinstance(spec.data.text_field, str):
        data += ["--dataset_text_field", spec.data.text_field]
    threads = [f"OMP_NUM_THREADS={cpu_threads}"] if cpu_threads else []
    # TRL trains 3 epochs unless told: the command trains what the runtime estimate is for.
    parts = [*threads, "trl", "sft", "--model_name_or_path", model, *data,
             *trl_args(params, max_length, cpu=cpu_threads is not None),
             "--num_train_epochs", f"{spec.tune.epochs:g}", "--output_dir", "trainfit-run"]
    return " ".join(shlex.quote(p) if not p.startswith("<") else f"'{p}'" for p in parts)


def command_notes(spec: Spec) -> list[str]:
    """What the generated ``trl sft`` command cannot express about the data: say so in its script."""
    if not writes_trl(spec) or spec.data is None:
        return []
    notes = []
    if trl_data_config(spec) is None:
        notes.append(f"TRL cannot load {spec.data.path} as a file: save it as JSON lines, CSV or Parquet")
    if isinstance(spec.data.text_field, tuple):
        notes.append("TRL reads prompt/completion pairs from columns named 'prompt' and 'completion': "
                     f"rename {', '.join(spec.data.text_field)}")
    if spec.data.messages_field not in (None, "messages"):
        notes.append(f"TRL reads conversations from a column named 'messages': rename {spec.data.messages_field!r}")
    if spec.data.length_field is not None:
        notes.append("this spec gives lengths, not text: point the command at the text of the dataset")
    return notes


def command_script(spec: Spec, params: Params, header: str, *, max_length: int | None = None,
                   data_config: Path | None = None, cpu_threads: int | None = None) -> str:
    try:
        cmd = build_command(spec, params, max_length=max_length, data_config=data_config, cpu_threads=cpu_threads)
    except TrainfitError as err:
        return f"#!/usr/bin/env bash\n{header}\n# No command: {err}\nexit 1\n"
    launch = [f"OMP_NUM_THREADS={cpu_threads}: the CPU threads the probe used; `accelerate launch` (which "
              "`trl sft` starts) would give the run one"] if cmd.startswith("OMP_NUM_THREADS=") else []
    notes = "".join(f"\n# note: {n}" for n in [*command_notes(spec), *launch])
    body = " \\\n    ".join(_split_flags(cmd))
    return f"#!/usr/bin/env bash\n{header}{notes}\nset -euo pipefail\n{body}\n"


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
