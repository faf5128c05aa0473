"""The training command a user runs, built from the same ``Params`` the probe ran.

With ``tune.command_template`` the user's own trainer is launched (see :mod:`trainfit.template`
for how it is filled). Without one, Hugging Face models get a ``trl sft`` command (TRL's CLI over transformers'
TrainingArguments and peft), whose flags are mapped knob by knob below.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainfit.data.readers import detect_format
from trainfit.data_paths import data_files
from trainfit.errors import TrainfitError
from trainfit.params import KNOBS, Params
from trainfit.spec import Spec
from trainfit.spec.training import TrainValues
from trainfit.template import render_template
from trainfit.trl_words import bool_word, word_value
from trainfit.trainer.accelerate_launch import LAUNCH_FLAGS, SHELL_VALUES, launch_args, shell_word
from trainfit.workloads.hf import save_initial_model
from trainfit.workloads.lora import lora_kwargs, trl_lora_args

if TYPE_CHECKING:
    from trainfit.data.stats import LengthStats
    from trainfit.probe.measurement import Measurement

_LOADERS = {"jsonl": "json", "json": "json", "csv": "csv", "parquet": "parquet", "text": "text"}
"""``datasets`` loaders for the data formats trainfit reads (TSV and save_to_disk folders have none)."""


def trl_data_config(spec: Spec) -> dict[str, Any] | None:
    """The ``datasets:`` section of a TRL config file that loads the spec's data file. TRL's
    ``--dataset_name`` takes Hub names and folders, not a file; None where no loader fits or the
    command is not a ``trl sft`` one."""
    if spec.data is None or not spec.uses_trl_sft:
        return None

    loader = _LOADERS.get(detect_format(Path(spec.data.path), spec.data.format))
    files = [str(f) for f in data_files(spec.data.path)]  # shards: the very files trainfit counted, in order
    return None if loader is None else {"datasets": [{"path": loader, "data_files": files[0] if len(files) == 1
                                                      else files}]}


def trl_args(params: Params, max_length: int | None = None, cpu: bool = False) -> list[str]:
    """TRL ``sft`` flags for every knob, each one explicit: TRL's own defaults differ from the
    probe's (bf16 on unless told, gradient checkpointing on, max_length 1024, fp32 LoRA base). A knob
    declares its own flags (``params.knob(trl=...)``); those declared ``WITH_OTHER_KNOBS`` are written
    here, with what they depend on. ``max_length``: the length the probe truncated at (see
    ``LengthStats.truncation_length``: the dataset's longest sample when ``params.max_length`` is
    null, never past the model's positions); None: ``params.max_length``. ``cpu``: probed on a CPU,
    so the command trains on one too (``--use_cpu true``: transformers refuses bf16 without a GPU
    unless told), where TF32 does nothing and transformers refuses ``--tf32 true``."""
    args = [word for name, k in KNOBS.items() if callable(k.trl) for word in k.trl(getattr(params, name))]
    max_length = max_length if max_length is not None else params.max_length
    if max_length is not None:
        args += ["--max_length", str(max_length)]
    if params.padding == "max_length" and max_length is not None:
        # TRL's collator pads each batch to its longest, rounded up to pad_to_multiple_of: no batch
        # is longer than max_length, so a multiple of the fixed length pads every batch to it.
        args += ["--pad_to_multiple_of", str(params.padded_length(max_length, max_length))]
    elif params.pad_to_multiple_of is not None:
        args += ["--pad_to_multiple_of", str(params.pad_to_multiple_of)]
    half = params.precision in ("bf16", "fp16")
    # LoRA trains adapters over a frozen base held in the compute dtype; full fine-tuning keeps fp32 weights.
    dtype = {"bf16": "bfloat16", "fp16": "float16"}[params.precision] if half and params.lora_r else "float32"
    args += ["--bf16", bool_word(params.precision == "bf16"), "--fp16", bool_word(params.precision == "fp16"),
             "--dtype", dtype, "--tf32", bool_word(params.tf32 and not cpu),
             checkpointing_flag(), bool_word(params.gradient_checkpointing)]
    if cpu:
        args += ["--use_cpu", "true"]
    if params.lora_r is not None:
        args += trl_lora_args(params)
    return args + quantization_args(params) + loader_args(params) + launch_args(params)


def quantization_args(params: Params) -> list[str]:
    """TRL's ``ModelConfig`` flags of a quantized base, which its ``get_quantization_config`` makes
    the ``BitsAndBytesConfig`` of (the compute dtype is ``--dtype``'s)."""
    if params.quantization == "8bit":
        return ["--load_in_8bit", "true"]
    if params.quantization == "4bit":
        return ["--load_in_4bit", "true", "--bnb_4bit_quant_type", params.bnb_4bit_quant_type,
                "--use_bnb_nested_quant", bool_word(params.bnb_double_quant)]
    return []


def loader_args(params: Params) -> list[str]:
    """The data loader's flags, as transformers' ``TrainingArguments`` takes them: pinning, and the
    workers with what applies to workers only (transformers refuses a prefetch factor without
    them, torch persistent workers), left out at ``num_workers: 0``."""
    args = [] if params.pin_memory else ["--dataloader_pin_memory", "false"]
    if params.num_workers == 0:
        return args
    args += ["--dataloader_num_workers", str(params.num_workers)]
    if params.persistent_workers:
        args += ["--dataloader_persistent_workers", "true"]
    if params.prefetch_factor is not None:
        args += ["--dataloader_prefetch_factor", str(params.prefetch_factor)]
    return args


@functools.cache
def checkpointing_flag() -> str:
    """The installed trainer's name for activation checkpointing: ``--activation_checkpointing``
    where transformers has it (5.24 here; ``--gradient_checkpointing`` is its deprecated alias, and
    TRL's default for the alias makes a run warn unless the new name is given), else the older name."""
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "--activation_checkpointing" if "activation_checkpointing" in names else "--gradient_checkpointing"


MODEL_PLACEHOLDER = "<a local model folder: this spec builds a random-init model from a config>"


def build_command(spec: Spec, params: Params, *, max_length: int | None = None, data_config: Path | None = None,
                  cpu_threads: int | None = None, model_dir: Path | None = None) -> str:
    """The command line for ``params``: the user's template, or ``trl sft`` for HF models (see
    :func:`trl_command`)."""
    if spec.tune.command_template:
        return render_template(spec.tune.command_template, params, spec.tune.epochs, max_length)
    return " ".join(shell_word(word) for word in trl_command(
        spec, params, max_length=max_length, data_config=data_config, cpu_threads=cpu_threads, model_dir=model_dir))


def trl_command(spec: Spec, params: Params, *, max_length: int | None = None, data_config: Path | None = None,
                cpu_threads: int | None = None, model_dir: Path | None = None) -> list[str]:
    """The ``trl sft`` command for ``params``, word by word (unquoted).
    ``data_config``: a TRL config file holding :func:`trl_data_config` (see ``write_outputs``).
    ``cpu_threads``: the threads a CPU probe ran with (None: not a CPU probe); ``trl sft`` starts
    ``accelerate launch``, which gives each process one CPU thread unless OMP_NUM_THREADS says
    otherwise (on the 2-vCPU test machine, one thread trained at about half the speed;
    docs/benchmarks.md). ``model_dir``: the random-init model of a ``config:`` spec, saved
    (``trainfit.workloads.hf.save_initial_model``)."""
    if spec.model.factory is not None:
        raise TrainfitError("a custom factory model needs tune.command_template to build its training command",
                            "e.g. command_template: 'python train.py --batch_size {batch_size} ...'")
    model = spec.model.path or (str(model_dir) if model_dir is not None else MODEL_PLACEHOLDER)
    if data_config is not None:
        data = ["--config", str(data_config)]
    else:
        data = ["--dataset_name", "<your dataset: a Hub name or a folder>" if spec.data is None
                else f"<{spec.data.path} as a Hub name or a folder>"]
    if spec.data is not None and isinstance(spec.data.text_field, str):
        data += ["--dataset_text_field", spec.data.text_field]
    threads = [f"OMP_NUM_THREADS={cpu_threads}"] if cpu_threads else []
    # TRL trains 3 epochs unless told: the command trains what the runtime estimate is for.
    return [*threads, "trl", "sft", "--model_name_or_path", model, *data,
            *trl_args(params, max_length, cpu=cpu_threads is not None), *spec.train.trl_args(),
            "--num_train_epochs", f"{spec.tune.epochs:g}", "--output_dir", "trainfit-run"]


def command_notes(spec: Spec, model_dir: Path | None = None) -> list[str]:
    """What the generated ``trl sft`` command cannot express about the model or the data: say so in
    its script. ``model_dir``: as for :func:`trl_command`."""
    if not spec.uses_trl_sft:
        return []
    notes = []
    if spec.model.path is None and model_dir is None:
        notes.append("this spec builds a random-init model from model.config: save it as a folder "
                     "(AutoModelForCausalLM.from_config(...).save_pretrained) and give it to --model_name_or_path")
    elif spec.model.path is None and spec.tokenizer is None:
        notes.append(f"{model_dir} holds no tokenizer (the spec names none: its lengths were counted approximately): "
                     "save the tokenizer you train with there (tokenizer.save_pretrained) before running")
    if spec.data is None:
        return notes
    if trl_data_config(spec) is None:
        notes.append(f"TRL cannot load {spec.data.path} as a file: save it as JSON lines, CSV or Parquet")
    if isinstance(spec.data.text_field, tuple):
        notes.append("TRL reads prompt/completion pairs from columns named 'prompt' and 'completion': "
                     f"rename {', '.join(spec.data.text_field)}")
    if spec.data.messages_field not in (None, "messages"):
        notes.append(f"TRL reads conversations from a column named 'messages': rename {spec.data.messages_field!r}")
    if spec.data.length_field is not None or spec.data.audio_field is not None:
        notes.append("this spec gives lengths, not text: point the command at the text of the dataset")
    return notes


def command_script(spec: Spec, params: Params, header: str, *, max_length: int | None = None,
                   data_config: Path | None = None, cpu_threads: int | None = None,
                   model_dir: Path | None = None) -> str:
    """train_command.sh: ``header``, notes on what the command cannot express, then the command. A
    template is written as filled (its shell syntax intact); a ``trl sft`` command one flag per
    line, passing the script's own arguments on (``bash train_command.sh --max_steps 2``)."""
    template = spec.tune.command_template
    try:
        if template:
            body = render_template(template, params, spec.tune.epochs, max_length)
        else:
            words = trl_command(spec, params, max_length=max_length, data_config=data_config, cpu_threads=cpu_threads,
                                model_dir=model_dir)
            body = " \\\n    ".join([*_split_flags(words), '"$@"'])
    except TrainfitError as err:
        reason = str(err).replace("\n", "\n# ")
        return f"#!/usr/bin/env bash\n{header}\n# No command: {reason}\nexit 1\n"
    notes = command_notes(spec, model_dir)
    if launch_args(params):
        notes.append("accelerate_config.yaml, beside this script, holds the same launch for a script of your own: "
                     "accelerate launch --config_file accelerate_config.yaml train.py")
    if not template:
        notes.append("arguments given to this script go to `trl sft` after the ones here (a later flag wins), "
                     "e.g. bash train_command.sh --max_steps 2 --output_dir /tmp/try")
        if params.nnodes > 1:
            notes.append(f"run this script on each of the {params.nnodes} machines, with MACHINE_RANK (0 to "
                         f"{params.nnodes - 1}), MAIN_PROCESS_IP (rank 0's address) and MAIN_PROCESS_PORT set; "
                         "docs/cluster.md's SLURM job sets them")
        if cpu_threads:
            notes.append(f"OMP_NUM_THREADS={cpu_threads}: the CPU threads the probe used; `accelerate launch` "
                         "(which `trl sft` starts) would give the run one")
        if checkpointing_flag() == "--activation_checkpointing":
            notes.append("--activation_checkpointing: the installed transformers' name for it; an older one (before "
                         "the rename) takes --gradient_checkpointing")
        if cpu_threads is not None and params.parallel == "fsdp" and params.processes > 1:
            notes.append("parallel: fsdp was measured on a CPU (gloo ranks), but accelerate shards with FSDP only on "
                         "GPUs: on a CPU this command trains as multi-CPU DDP, each process a whole copy (more memory "
                         "than measured)")
        if cpu_threads is not None:
            notes.append("--use_cpu true: the config was measured on a CPU, so it trains on one (transformers "
                         "refuses bf16 without a GPU unless told); on a GPU machine drop it and OMP_NUM_THREADS, "
                         "and probe there: speed and memory differ")
    lines = "".join(f"\n# note: {n}" for n in notes)
    return f"#!/usr/bin/env bash\n{header}{lines}\nset -euo pipefail\n{body}\n"


def _split_flags(words: list[str]) -> list[str]:
    """One flag and its values per line, quoted, for a readable script."""
    out: list[str] = []
    for word in words:
        quoted = shell_word(word)
        if word.startswith("--") or not out:
            out.append(quoted)
        else:
            out[-1] += " " + quoted
    return out


TRL_COMMAND = re.compile(r"^(?:OMP_NUM_THREADS=(\d+) )?trl sft (.*)$", re.DOTALL)
"""The ``trl sft`` command trainfit writes, on one line: its CPU threads and its arguments."""


def with_eval_split(words: list[str], folder: Path, eval_args: list[str]) -> list[str]:
    """``trl sft`` ``words`` that read ``folder``'s ``train`` and ``test`` splits instead of the
    ``--config`` data file, and evaluate as ``eval_args`` say (TRL's dataset config concatenates
    its files into one split, so an eval set needs the folder)."""
    at = words.index("--config")
    return [*words[:at], "--dataset_name", str(folder), *words[at + 2:], *eval_args]


def is_trl_command(command: str) -> bool:
    """Whether ``command`` (one line) is the ``trl sft`` command trainfit writes (not a template)."""
    return TRL_COMMAND.match(command.strip()) is not None


def script_command(script: str) -> tuple[str | None, str | None]:
    """A ``train_command.sh``'s command on one line, without the script's own arguments
    (``"$@"``), and None; or None and tune's reason when it wrote no command."""
    no_command = re.search(r"^# No command: (.*)$", script, re.MULTILINE)
    if no_command is not None:
        return None, no_command.group(1)
    body = script.partition("set -euo pipefail\n")[2].strip()
    return body.replace(" \\\n    ", " ").replace(' "$@"', "").strip(), None


def launch_threads(m: Measurement) -> int | None:
    """The CPU threads the training command must ask for: those of a CPU probe (a GPU run's CPU
    side is left to the launcher)."""
    return m.cpu_threads if m.device == "cpu" else None


def command_length(params: Params, stats: LengthStats | None) -> int | None:
    """The truncation length the probe used, for the training command (None without data)."""
    return stats.truncation_length(params.max_length) if stats else None


def command_inputs(params: Params, m: Measurement, stats: LengthStats | None,
                   data_config: Path | None, model_dir: Path | None = None) -> dict[str, Any]:
    """What the training command of a probed config is built from, besides the spec and params:
    the length the probe truncated at, the data config, the CPU threads a CPU probe used, the
    saved random-init model (see :func:`write_outputs`)."""
    return {"max_length": command_length(params, stats), "data_config": data_config,
            "cpu_threads": launch_threads(m), "model_dir": model_dir}


def initial_model(output: Path, spec: Spec) -> Path | None:
    """OUTPUT/model: the random-init model of a ``config:`` spec whose command is ``trl sft``, saved
    once (see ``save_initial_model``); None for another spec, or a model too large to save."""
    if spec.model.config is None or not spec.uses_trl_sft:
        return None
    folder = output.resolve() / "model"
    try:
        saved = save_initial_model(spec.model, spec.tokenizer, folder, spec.probe.seed)
    except (RuntimeError, ValueError, TypeError, ImportError):  # the search goes on; the script says what to save
        return None
    return folder if saved else None


TRAINING_ARGS_FILE = "training_args.json"
MODEL_ARGS = ("attn_implementation", "dtype")
QUANTIZATION_ARGS = {"load_in_4bit": "load_in_4bit", "load_in_8bit": "load_in_8bit",
                     "bnb_4bit_quant_type": "bnb_4bit_quant_type", "use_bnb_nested_quant": "bnb_4bit_use_double_quant"}
"""TRL's quantization flags, by the name ``BitsAndBytesConfig`` gives each."""


def training_arguments(spec: Spec, params: Params, *, max_length: int | None = None,
                       cpu_threads: int | None = None) -> dict[str, Any] | None:
    """The config for a Hugging Face ``Trainer`` of your own (``training_args.json``): the
    :func:`trainer_settings` of ``params`` with the spec's epochs. None where the command is not
    ``trl sft`` (a template of your own, a factory model): its settings are its own."""
    if not spec.uses_trl_sft:
        return None
    return trainer_settings(params, spec.tune.epochs, values=spec.train, max_length=max_length, cpu_threads=cpu_threads)


def trainer_settings(params: Params, epochs: float, *, values: TrainValues = TrainValues(),
                     max_length: int | None = None, cpu_threads: int | None = None) -> dict[str, Any]:
    """The trainer settings of ``params``: the very settings the ``trl sft`` command passes (read
    from its flags, so there is one mapping of the knobs), split by where each goes:
    ``TrainingArguments(**training_arguments)``, the model's ``from_pretrained(**model_init_kwargs)``,
    peft's ``LoraConfig(**lora)`` (null: full fine-tuning) and what TRL's ``SFTConfig`` adds
    (``sft``: the truncation length, packing, padding). ``epochs``: what the runtime estimate is for
    (``tune.epochs``); ``values``: the spec's ``train:`` section, the learning rate and the rest,
    whose defaults are those ``trl sft`` trains with (its ``SFTConfig``'s, which a plain
    ``TrainingArguments`` does not share); ``notes``: what to
    change on another machine. ``max_length`` and ``cpu_threads``: as for :func:`trl_args` (see
    :func:`command_inputs`). Every other export (``training_args.json``, ``axolotl.yaml``) is read
    from this."""
    from transformers import TrainingArguments

    trainer_fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    schedule = TrainValues()  # TRL's SFTConfig defaults: what the trl sft command trains with; values' flags win
    lora = None if params.lora_r is None else {**lora_kwargs(params), "task_type": "CAUSAL_LM", "bias": "none"}
    out: dict[str, Any] = {"training_arguments": {
        "num_train_epochs": epochs, "learning_rate": schedule.learning_rate,
        "lr_scheduler_type": schedule.lr_scheduler_type, "warmup_steps": schedule.warmup_steps,
        "weight_decay": schedule.weight_decay, "max_grad_norm": schedule.max_grad_norm},
        "model_init_kwargs": {}, "sft": {}, "lora": lora,
        "notes": [] if cpu_threads is None else [
            "use_cpu: true and tf32: false: the config was measured on a CPU, so it trains on one; on a GPU machine "
            "drop use_cpu, and probe there: speed and memory differ"]}
    for name, word in flags([*trl_args(params, max_length, cpu=cpu_threads is not None), *values.trl_args()]).items():
        value = word.split() if name == "report_to" else word_value(word)
        if name in MODEL_ARGS:
            out["model_init_kwargs"][name] = value
        elif name in LAUNCH_FLAGS:  # accelerate launch's: the processes, not the trainer
            # a machine's own value (its rank, rank 0's address) is null here: each machine's job sets it
            out.setdefault("launch", {})[name] = None if word in SHELL_VALUES else value if word else True
        elif name in QUANTIZATION_ARGS:  # BitsAndBytesConfig(**quantization_config), as trl sft builds it
            quantized = out["model_init_kwargs"].setdefault("quantization_config", {})
            quantized[QUANTIZATION_ARGS[name]] = value
        elif name in trainer_fields:
            out["training_arguments"][name] = value
        elif name != "use_peft" and not name.startswith("lora_"):
            out["sft"][name] = value
    if params.nnodes > 1:
        out["notes"].append("launch.machine_rank and launch.main_process_ip are null: each machine's own, which "
                            "train_command.sh reads from MACHINE_RANK and MAIN_PROCESS_IP (docs/cluster.md)")
    if params.quantization == "4bit":  # trl sft computes in the weights' dtype
        out["model_init_kwargs"]["quantization_config"]["bnb_4bit_compute_dtype"] = out["model_init_kwargs"]["dtype"]
    return out


def flags(argv: Sequence[str]) -> dict[str, str]:
    """``--flag value`` pairs of ``argv`` (a later flag wins; a flag with no value maps to "")."""
    out: dict[str, str] = {}
    key = None
    for token in argv:
        if token.startswith("--"):
            key = token[2:]
            out[key] = ""
        elif key is not None:
            out[key] = f"{out[key]} {token}".strip()
    return out
