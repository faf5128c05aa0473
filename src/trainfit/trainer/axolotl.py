"""The best config as an Axolotl config fragment (``axolotl.yaml``).

Read from the same trainer settings as ``training_args.json`` (:func:`trainer_settings`, itself
read from the ``trl sft`` command's flags), so each knob reaches a trainer setting in one place and
this module only renames settings to Axolotl's keys. What Axolotl has no key for, or runs otherwise
than the probe measured, is said in a comment: nothing is dropped without a word.

Keys as Axolotl 0.19's config schema (``axolotl/utils/schemas``) names them; tests/test_axolotl.py
validates written fragments with that schema where axolotl is installed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainfit.errors import TrainfitError
from trainfit.params import Params
from trainfit.spec import Spec
from trainfit.spec.model_config import load_config
from trainfit.trainer.command import MODEL_PLACEHOLDER, trainer_settings
from trainfit.workloads.lora import ALL_LINEAR

AXOLOTL_FILE = "axolotl.yaml"
AXOLOTL_VERSION = "0.19"
"""The Axolotl release whose config schema the keys follow (and the tests validate against)."""

RENAMED = {
    "per_device_train_batch_size": "micro_batch_size", "gradient_accumulation_steps": "gradient_accumulation_steps",
    "max_length": "sequence_len", "packing": "sample_packing", "bf16": "bf16", "fp16": "fp16", "tf32": "tf32",
    "activation_checkpointing": "gradient_checkpointing",
    "gradient_checkpointing": "gradient_checkpointing",  # transformers before its rename
    "attn_implementation": "attn_implementation",
    "torch_compile": "torch_compile", "torch_compile_mode": "torch_compile_mode", "optim": "optimizer",
    "learning_rate": "learning_rate", "lr_scheduler_type": "lr_scheduler", "warmup_steps": "warmup_steps",
    "weight_decay": "weight_decay", "max_grad_norm": "max_grad_norm", "num_train_epochs": "num_epochs",
    "r": "lora_r", "lora_dropout": "lora_dropout", "target_parameters": "lora_target_parameters",
    "dataloader_num_workers": "dataloader_num_workers", "dataloader_pin_memory": "dataloader_pin_memory",
    "dataloader_prefetch_factor": "dataloader_prefetch_factor",
}
"""A trainer setting (``training_args.json``'s name, peft's for LoRA) -> the Axolotl key of the same value."""

HANDLED = {"train_sampling_strategy", "pad_to_multiple_of", "packing_strategy", "dtype", "use_cpu",
           "activation_offloading", "lora_alpha", "target_modules", "task_type", "bias", "quantization_config",
           "dataloader_persistent_workers"}
"""Settings written by a rule of their own below (``task_type`` and ``bias`` are Axolotl's own:
the model's task, no bias trained)."""

ORDER = ("base_model", "sequence_len", "sample_packing", "pad_to_sequence_len", "pad_to_multiple_of",
         "micro_batch_size", "gradient_accumulation_steps", "group_by_length", "bf16", "fp16", "tf32",
         "gradient_checkpointing", "activation_offloading", "attn_implementation", "torch_compile",
         "torch_compile_mode", "optimizer", "dataloader_num_workers", "dataloader_pin_memory",
         "dataloader_prefetch_factor", "adapter", "load_in_4bit", "load_in_8bit", "bnb_config_kwargs", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
         "lora_target_linear", "lora_target_parameters", "plugins", "liger_rope", "liger_rms_norm",
         "liger_glu_activation", "liger_layer_norm", "liger_fused_linear_cross_entropy", "learning_rate",
         "lr_scheduler", "warmup_steps", "warmup_ratio", "weight_decay", "max_grad_norm", "num_epochs")
"""The order the keys are written in: the data's shape, the step, the adapters, the schedule."""

LIGER_KEYS = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_layer_norm",
              "liger_fused_linear_cross_entropy")
"""The Liger plugin's switches for what the transformers Trainer's ``use_liger_kernel`` applies
(each where the model has the layer; the fused cross-entropy, not the plain one)."""

LEGACY_ATTENTION = {"flash_attention_2": "flash_attention", "sdpa": "sdp_attention", "eager": "eager_attention"}
"""Axolotl before 0.17 took the attention as one of these flags (``flash_attention: true``)."""


@dataclass(frozen=True, kw_only=True)
class AxolotlFragment:
    """The best config in Axolotl's keys, with what its keys cannot say."""

    keys: dict[str, Any]
    """Axolotl config keys and their values, in :data:`ORDER`."""
    comments: dict[str, list[str]]
    """Per key, the comments written above it: where Axolotl runs it otherwise than measured."""
    notes: list[str]
    """What Axolotl has no key for, written after the keys."""

    def to_yaml(self, header: str) -> str:
        """``axolotl.yaml``: ``header`` (comment lines), how to use the fragment, then each key
        under its comments, then the notes."""
        lines = [header, f"# The config above in Axolotl's keys (Axolotl {AXOLOTL_VERSION}'s config schema). A "
                         "fragment: add datasets: (Axolotl requires one) and output_dir:, then axolotl train axolotl.yaml"]
        for key, value in self.keys.items():
            lines += [f"# {c}" for c in self.comments.get(key, [])]
            lines.append(yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=False).rstrip("\n"))
        lines += [f"# note: {n}" for n in self.notes]
        return "\n".join(lines) + "\n"


def axolotl_fragment(spec: Spec, params: Params, *, max_length: int | None = None,
                     cpu_threads: int | None = None, model_dir: Path | None = None) -> AxolotlFragment | None:
    """The Axolotl config of ``params`` for the spec's Hugging Face model (None for a factory's
    model, which Axolotl cannot load). ``max_length``, ``cpu_threads`` and ``model_dir`` as for
    the training command (``command_inputs``)."""
    if spec.model.factory is not None:
        return None
    settings = trainer_settings(params, spec.tune.epochs, values=spec.train, max_length=max_length,
                                cpu_threads=cpu_threads)
    keys: dict[str, Any] = {"base_model": spec.model.path or (str(model_dir) if model_dir else MODEL_PLACEHOLDER),
                            "sample_packing": False, "group_by_length": False, "torch_compile": False}
    comments: dict[str, list[str]] = {}
    notes: list[str] = []
    if keys["base_model"] == MODEL_PLACEHOLDER:
        comments["base_model"] = ["this spec builds a random-init model from model.config: save it as a folder "
                                  "(AutoModelForCausalLM.from_config(...).save_pretrained) and name it here"]
    merged = {**settings["training_arguments"], **settings["model_init_kwargs"], **settings["sft"],
              **(settings["lora"] or {})}
    for name, value in merged.items():
        if name in RENAMED:
            keys[RENAMED[name]] = value
        elif name not in HANDLED:
            notes.append(f"{name}: {value}: Axolotl has no key for this trainer setting")
    if merged.get("train_sampling_strategy") == "group_by_length":
        keys["group_by_length"] = True
    if merged.get("activation_offloading") and keys["gradient_checkpointing"]:
        keys["activation_offloading"] = True
    elif merged.get("activation_offloading"):
        notes.append("activation_offloading: true was measured without gradient checkpointing (TRL's offloading of "
                     "every saved activation); Axolotl's activation_offloading requires gradient_checkpointing: set "
                     "both for another trade of memory and speed than measured")
    comments["learning_rate"] = ["trainfit tunes no schedule: these are the trl sft command's (the spec's train: "
                                 "section over TRL's SFTConfig defaults, as in training_args.json), set because "
                                 "Axolotl's own differ (cosine)"]
    if spec.train.warmup_ratio and not spec.train.warmup_steps:  # Axolotl takes a ratio by its own name
        keys.pop("warmup_steps", None)
        keys["warmup_ratio"] = spec.train.warmup_ratio
    _padding(params, keys, comments)
    _precision(params, merged, cpu_threads, comments)
    if settings["lora"] is not None:
        _lora(spec, params, settings["lora"], keys, comments)
        _quantization(params, keys)
    _loader(params, keys, notes)
    _processes(params, notes)
    _loss(spec, params, keys, notes)
    if params.packing:
        comments["sample_packing"] = ["Axolotl packs each batch into one row of up to micro_batch_size x "
                                      "sequence_len tokens, as measured, but with its own multipack sampler, not "
                                      "TRL's best-fit decreasing (packing_strategy: bfd): its rows fill otherwise, "
                                      "so its samples a step, and its speed, may differ"]
    if keys.get("attn_implementation") in LEGACY_ATTENTION:
        comments["attn_implementation"] = [f"Axolotl before 0.17 takes "
                                           f"{LEGACY_ATTENTION[keys['attn_implementation']]}: true instead"]
    ordered = {k: keys[k] for k in sorted(keys, key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER))}
    return AxolotlFragment(keys=ordered, comments=comments, notes=notes)


def _padding(params: Params, keys: dict[str, Any], comments: dict[str, list[str]]) -> None:
    """Axolotl pads every batch to ``sequence_len`` (rounded up to ``pad_to_multiple_of``) with
    ``pad_to_sequence_len: true``; unset, to a multiple of ``pad_to_multiple_of`` (64 when none,
    and ``sequence_len`` when packing); false, to the batch's longest, the multiple ignored
    (``axolotl/core/builders/causal.py``)."""
    fixed = params.padding == "max_length"
    if params.pad_to_multiple_of is not None:
        keys["pad_to_multiple_of"] = params.pad_to_multiple_of
    if fixed or params.pad_to_multiple_of is None or params.packing:
        keys["pad_to_sequence_len"] = fixed
    if params.packing and not fixed:
        comments["pad_to_sequence_len"] = ["false, as measured (a packed row as long as its samples); Axolotl warns "
                                           "that it recommends true with sample_packing, which pads each row up to "
                                           "a multiple of sequence_len: fixed shapes, more padding than measured"]
        if params.pad_to_multiple_of is not None:
            comments["pad_to_sequence_len"].append(f"the rows are not rounded up to a multiple of "
                                                   f"{params.pad_to_multiple_of} (pad_to_multiple_of), as measured: "
                                                   "Axolotl rounds only rows padded to sequence_len")


def _precision(params: Params, merged: dict[str, Any], cpu_threads: int | None,
               comments: dict[str, list[str]]) -> None:
    """Where Axolotl's weights differ from those measured, and a CPU's probe."""
    if params.precision != "fp32" and params.lora_r is None:
        comments[params.precision] = [
            f"Axolotl loads the weights in {params.precision} when this is on, full fine-tuning included; "
            f"trainfit measured {merged.get('dtype', 'float32')} weights under {params.precision} autocast (as the "
            "trl sft command trains): Axolotl's weights, gradients and optimizer state take less memory than measured, "
            f"and it trains {params.precision} weights"]
    if cpu_threads is not None:
        comments["tf32"] = ["false: the config was measured on a CPU, where TF32 does nothing; Axolotl trains on "
                            "a GPU: probe there, speed and memory differ"]


def _lora(spec: Spec, params: Params, lora: dict[str, Any], keys: dict[str, Any],
          comments: dict[str, list[str]]) -> None:
    """``adapter: lora``; ``lora_alpha`` an integer, as Axolotl's is; the modules by name,
    ``lora_target_linear`` for ``all-linear``, peft's default for the model named (Axolotl has no
    default: it adapts nothing)."""
    keys["adapter"] = "lora"
    comments["adapter"] = ["Axolotl turns on its own LoRA kernels where it can (lora_mlp_kernel, lora_qkv_kernel, "
                           "lora_o_kernel), which trainfit did not measure (peft's LoRA): set them false to train "
                           "as measured"]
    alpha = lora["lora_alpha"]
    if float(alpha).is_integer():
        keys["lora_alpha"] = int(alpha)
    else:
        comments["adapter"].append(f"lora_alpha: {alpha} was measured; Axolotl's lora_alpha is an integer: set "
                                   "the nearest (a different scaling of the adapters)")
    modules = lora["target_modules"]
    if modules == ALL_LINEAR:
        keys["lora_target_linear"] = True
    elif modules is not None:
        keys["lora_target_modules"] = modules
    else:
        default = _peft_default_modules(spec)
        if default is None:
            comments["adapter"].append("lora_target_modules: peft's default for the model was measured, which "
                                       "peft does not know for it: name the modules")
        else:
            keys["lora_target_modules"] = default
            comments["lora_target_modules"] = ["peft's default for the model (lora_target_modules: null), "
                                               "which Axolotl does not apply"]


def _quantization(params: Params, keys: dict[str, Any]) -> None:
    """A 4-bit base is Axolotl's ``adapter: qlora`` with ``load_in_4bit``, its data type and double
    quantization written out (Axolotl's own default is nf4 with double quantization); an 8-bit
    base is ``adapter: lora`` with ``load_in_8bit``."""
    if params.quantization == "8bit":
        keys["load_in_8bit"] = True
    elif params.quantization == "4bit":
        keys.update(adapter="qlora", load_in_4bit=True,
                    bnb_config_kwargs={"bnb_4bit_quant_type": params.bnb_4bit_quant_type,
                                       "bnb_4bit_use_double_quant": params.bnb_double_quant})


def _loader(params: Params, keys: dict[str, Any], notes: list[str]) -> None:
    """The loader's settings, written even where they are the trainers' defaults: Axolotl sets its
    own when none is given (a worker per GPU, 256 batches prefetched each)."""
    keys["dataloader_num_workers"] = params.num_workers
    keys["dataloader_pin_memory"] = params.pin_memory
    if params.num_workers and params.persistent_workers:
        notes.append("dataloader_persistent_workers: true was measured: Axolotl has no key for it (its workers "
                     "start again each epoch)")


def _processes(params: Params, notes: list[str]) -> None:
    """Several processes, which an Axolotl config does not launch: the command that does, as a note."""
    if params.processes == 1:
        return
    how = (f"FSDP2, each transformer block sharded, reshard_after_forward {str(params.fsdp_reshard_after_forward).lower()}"
           f"{', offload_params true' if params.fsdp_cpu_offload else ''} (Axolotl's fsdp_version: 2 and fsdp_config)"
           if params.parallel == "fsdp" else "DDP")
    machines = "" if params.nnodes == 1 else (f", {params.nproc_per_node} on each of {params.nnodes} machines "
                                              f"(--num_machines {params.nnodes} --machine_rank ... --main_process_ip "
                                              "..., docs/cluster.md)")
    notes.append(f"nproc_per_node: {params.nproc_per_node} with parallel: {params.parallel} was measured: launch "
                 f"Axolotl on {params.processes} processes (accelerate launch --num_processes "
                 f"{params.processes} -m axolotl.cli.train axolotl.yaml){machines} with {how}")


def _peft_default_modules(spec: Spec) -> list[str] | None:
    """The modules peft adapts by default in the spec's model type; None where it has none (or
    the model's config cannot be read)."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as defaults

    try:
        model_type = load_config(spec.model).model_type
    except TrainfitError:
        return None
    found = defaults.get(model_type)
    return None if found is None else list(found)


def _loss(spec: Spec, params: Params, keys: dict[str, Any], notes: list[str]) -> None:
    """``loss: liger`` as the Liger plugin; TRL's fused LM head, which Axolotl has no key for, as a note."""
    if params.loss == "liger":
        keys["plugins"] = ["axolotl.integrations.liger.LigerPlugin"]
        keys.update(dict.fromkeys(LIGER_KEYS, True))
    elif params.loss == "fused" or (params.loss == "auto" and spec.uses_trl_sft):
        notes.append("loss: TRL's fused LM head was measured (the log-probs in tiles, never the whole logits): Axolotl "
                     "has no key for it, and its own loss holds the (batch x length x vocab) logits, more memory than "
                     "measured, unless a plugin replaces it (the Liger plugin's liger_fused_linear_cross_entropy, or "
                     "cut_cross_entropy)")
