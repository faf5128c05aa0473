"""The training configuration a probe runs: every knob trainfit can turn.

``Params`` is the single record of one configuration. The probe applies it, the search varies it,
the report prints it and the command builder turns it into a launch command, so a knob is
declared exactly once, here: as a field of ``Params`` made with ``knob(...)`` (its type, default,
values and meaning together). ``KNOBS`` is read from those fields.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from trainfit.errors import Problem, SpecError
from trainfit.trl_words import WITH_OTHER_KNOBS, TrlWords, trl_compile, trl_flag, trl_mapped, trl_when_on

PRECISIONS = ("fp32", "bf16", "fp16")
ATTENTIONS = ("eager", "sdpa", "flash_attention_2")
COMPILE_MODES = ("off", "default", "reduce-overhead", "max-autotune")
OPTIMIZERS = ("adamw", "adamw_fused", "adamw_8bit")
PADDINGS = ("longest", "max_length")
LOSSES = ("auto", "model", "fused", "liger")
QUANTIZATIONS = ("none", "4bit", "8bit")
PARALLELS = ("none", "ddp", "fsdp")
QUANT_TYPES = ("nf4", "fp4")
LORA_OPTIONS = ("lora_alpha", "lora_target_modules", "lora_target_parameters")
"""The LoRA knobs that mean something only with a rank (``lora_r``)."""
MAX_BATCH = 2**20
"""The largest batch size (and accumulation) a spec may ask for: far beyond any device's micro-batch,
and small enough that the probe's list of worst-case lengths stays a few MB."""


@dataclass(frozen=True, kw_only=True)
class Knob:
    """How one built-in knob is typed and what it means for training."""

    name: str
    kind: str  # "int", "float", "bool", "choice", "modules"
    doc: str
    choices: tuple[Any, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    changes_learning: bool = False
    """True when two values of this knob train a different model (not only a faster one)."""
    batch_shape: bool = False
    """True when the knob only shapes the batches: a built model can be probed at another value."""
    prior: Mapping[str, tuple[Any, ...]] | None = None
    """The order ``auto`` tries the values in, per device type (``cuda``, ``cpu``): which usually
    wins there first. A prior only orders the search; measurements decide."""
    no_prior: str | None = None
    """Why the knob has no device prior (a knob has a prior or says why not)."""
    off: Any = None
    """The value ``trainfit ablate``'s baseline sets, every technique off (when ``ablated``)."""
    ablated: bool = False
    """The knob is a technique ``trainfit ablate`` turns off in its baseline (to :attr:`off`)."""
    trl: TrlWords | str | None = None
    """The knob's ``trl sft`` flags for a value (see :func:`trl_flag`), or :data:`WITH_OTHER_KNOBS`:
    ``trainer/command.trl_args`` writes it with the knobs or facts its flags depend on."""
    no_trl: str | None = None
    """Why the knob reaches no ``trl sft`` flag (a knob has flags or says why not)."""
    memory_only: bool = False
    """Its ``true`` only trades speed for memory (nothing learned changes): ``auto`` probes it only at
    a batch the same config without it cannot fit."""
    switched: bool = False
    """A built Hugging Face model is switched to another value in place, no rebuild (gradient
    checkpointing: transformers' enable and disable): its worker keeps the model (:func:`model_values`)."""


def split_modules(text: str) -> str | tuple[str, ...]:
    """``"q_proj, v_proj"`` -> ``("q_proj", "v_proj")``; one name (``all-linear``) stays a string."""
    if "," not in text:
        return text
    return tuple(v.strip() for v in text.split(",") if v.strip())


T = TypeVar("T")

_OFF_UNSET = object()


def knob(default: T, *, kind: str, doc: str, choices: tuple[Any, ...] = (), minimum: float | None = None,
         maximum: float | None = None, nullable: bool = False, changes_learning: bool = False,
         batch_shape: bool = False, prior: Mapping[str, tuple[Any, ...]] | None = None, no_prior: str | None = None,
         off: Any = _OFF_UNSET, trl: TrlWords | str | None = None, no_trl: str | None = None,
         memory_only: bool = False, switched: bool = False) -> T:
    """A ``Params`` field that is a built-in knob: ``default``, and a ``Knob`` of the other arguments in
    the field's metadata (unnamed: ``KNOBS`` names it after the field). Typed as ``default``, as
    ``dataclasses.field`` is, so the field keeps its declared type. Defaults are immutable (None,
    numbers, strings, tuples); ``dataclass`` rejects a list or dict default when ``Params`` is built.
    Exactly one of ``prior`` (see :func:`on_every_device`) and ``no_prior`` (the reason) is given,
    and exactly one of ``trl`` (its ``trl sft`` flags: :func:`trl_flag`, :func:`trl_when_on`,
    :func:`trl_mapped`, or :data:`WITH_OTHER_KNOBS`) and ``no_trl`` (why none); ``off``: the
    ablation baseline's value, for a knob that is a technique; ``memory_only``: its ``true`` only
    trades speed for memory; ``switched``: a built model takes another value in place."""
    if (prior is None) == (no_prior is None):
        raise TypeError(f"knob({default!r}, ...): give a device prior or the reason for none (no_prior=...), one of them")
    if (trl is None) == (no_trl is None):
        raise TypeError(f"knob({default!r}, ...): give its trl sft flags or the reason for none (no_trl=...), one of them")
    spec = Knob(name="", kind=kind, doc=doc, choices=choices, minimum=minimum, maximum=maximum,
                nullable=nullable, changes_learning=changes_learning, batch_shape=batch_shape, prior=prior,
                no_prior=no_prior, off=None if off is _OFF_UNSET else off, ablated=off is not _OFF_UNSET, trl=trl,
                no_trl=no_trl, memory_only=memory_only, switched=switched)
    return field(default=default, metadata={"knob": spec})


def on_every_device(order: tuple[Any, ...]) -> dict[str, tuple[Any, ...]]:
    """A prior that is the same on a GPU and a CPU."""
    return {"cuda": order, "cpu": order}


LEARNED = "changes what is learned"
"""The reason a knob the user chooses for what it trains has no speed prior."""


def model_values(values: Mapping[str, Any], *, switched: bool = False) -> dict[str, Any]:
    """``values`` without the knobs that only shape batches: what a built model depends on. With
    ``switched`` (a Hugging Face model, which the worker switches in place) without the
    :attr:`Knob.switched` knobs too."""
    return {k: v for k, v in values.items()
            if not (k in KNOBS and (KNOBS[k].batch_shape or switched and KNOBS[k].switched))}


def memory_grows(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """True when ``after`` needs no less memory than ``before``: batches no smaller (batch size,
    max_length (None = the dataset's longest), the multiple lengths are padded to, and packing: a
    packed batch holds full rows), and gradient checkpointing not turned on (it keeps fewer
    activations). A CPU worker reuses its model only in this direction: after a larger batch, a CPU
    process measured up to 6% more peak memory than a fresh one (docs/benchmarks.md, model reuse)."""
    def length(v: Mapping[str, Any]) -> float:
        return float("inf") if v.get("max_length") is None else v["max_length"]

    def multiple(v: Mapping[str, Any]) -> int:
        return v.get("pad_to_multiple_of") or 1

    # Rounded to a multiple of the earlier one, no padded length is shorter than it was.
    return (after.get("batch_size", 1) >= before.get("batch_size", 1) and length(after) >= length(before)
            and multiple(after) % multiple(before) == 0 and bool(after.get("packing")) >= bool(before.get("packing"))
            and bool(after.get("gradient_checkpointing")) <= bool(before.get("gradient_checkpointing")))


@dataclass(frozen=True, kw_only=True)
class Params:
    """One training configuration. Defaults are the safe, plain choice on any device.

    Every field but ``extra`` is a built-in knob, declared with ``knob(default, ...)``: its ``doc``
    is the field's documentation (tests/test_knobs.py checks that no field goes without one)."""

    batch_size: int = knob(1, kind="int", minimum=1, maximum=MAX_BATCH, batch_shape=True,
        trl=trl_flag("--per_device_train_batch_size"),
        no_prior="climbed one step at a time within each family, not ordered by a prior",
        doc="samples per micro-batch on one device")
    gradient_accumulation_steps: int = knob(1, kind="int", minimum=1, maximum=MAX_BATCH, batch_shape=True,
        trl=trl_flag("--gradient_accumulation_steps"),
        no_prior="derived from tune.target_effective_batch, or the user's: it sets what is learned",
        doc="micro-batches per optimizer step; effective batch = batch_size x this x the processes (nproc_per_node x nnodes)")
    max_length: int | None = knob(None, kind="int", minimum=1, nullable=True, changes_learning=True, batch_shape=True,
        trl=WITH_OTHER_KNOBS,
        no_prior="changes what is learned: the user's choice, not a speed preference",
        doc="longest sequence (positions) a sample may have; longer samples are truncated. "
            "null = the dataset's longest sample")
    lora_r: int | None = knob(None, kind="int", minimum=1, nullable=True, changes_learning=True, no_prior=LEARNED,
        trl=WITH_OTHER_KNOBS,
        doc="LoRA rank; null = full fine-tuning")
    lora_alpha: float | None = knob(None, kind="float", minimum=0, nullable=True, changes_learning=True, no_prior=LEARNED,
        trl=WITH_OTHER_KNOBS,
        doc="LoRA scaling numerator; null = 2 x lora_r")
    lora_dropout: float = knob(0.0, kind="float", minimum=0, maximum=1, changes_learning=True, no_prior=LEARNED,
        trl=WITH_OTHER_KNOBS,
        doc="dropout on the LoRA input; 0 avoids an extra activation copy")
    lora_target_modules: tuple[str, ...] | str | None = knob(None, kind="modules", nullable=True, changes_learning=True,
        no_prior=LEARNED, trl=WITH_OTHER_KNOBS,
        doc="module names to adapt (list), 'all-linear', or null for peft's default")
    lora_target_parameters: tuple[str, ...] | str | None = knob(
        None, kind="modules", nullable=True, changes_learning=True, no_prior=LEARNED, trl=WITH_OTHER_KNOBS,
        doc="parameters to adapt besides modules, e.g. a mixture of experts' stacked experts "
            "[mlp.experts.gate_up_proj, mlp.experts.down_proj] (peft target_parameters)")
    quantization: str = knob("none", kind="choice", choices=QUANTIZATIONS, changes_learning=True, off="none",
        no_prior=LEARNED, trl=WITH_OTHER_KNOBS,
        doc="hold the frozen LoRA base in 4 or 8 bits (QLoRA, bitsandbytes: CUDA only); adapters train on "
            "top in the compute dtype. Needs lora_r")
    bnb_4bit_quant_type: str = knob("nf4", kind="choice", choices=QUANT_TYPES, changes_learning=True, no_prior=LEARNED,
        trl=WITH_OTHER_KNOBS, doc="the 4-bit data type with quantization: 4bit (NormalFloat or float)")
    bnb_double_quant: bool = knob(False, kind="bool", changes_learning=True, no_prior=LEARNED, trl=WITH_OTHER_KNOBS,
        doc="quantize the 4-bit quantization constants too (~0.4 bit a parameter less; TRL's use_bnb_nested_quant)")
    gradient_checkpointing: bool = knob(False, kind="bool", prior=on_every_device((False, True)), off=False,
        trl=WITH_OTHER_KNOBS, memory_only=True, switched=True,
        doc="recompute activations in backward: less memory, ~20-40% more compute")
    activation_offloading: bool = knob(False, kind="bool", off=False, memory_only=True,
        prior=on_every_device((False, True)), trl=trl_when_on("--activation_offloading", "true"),
        doc="move the activations a backward needs to pinned CPU memory during forward and back for "
            "backward, overlapped on a side stream (TRL's activation offloading, the output head's "
            "kept): less GPU memory for the copies' time; CUDA only")
    precision: str = knob("fp32", kind="choice", choices=PRECISIONS, changes_learning=True, off="fp32",
        trl=WITH_OTHER_KNOBS,
        prior={"cuda": ("bf16", "fp16", "fp32"), "cpu": ("fp32", "bf16", "fp16")},
        doc="fp32, or mixed precision bf16/fp16 (autocast; fp16 adds a loss scaler)")
    attention: str = knob("sdpa", kind="choice", choices=ATTENTIONS, off="eager", trl=trl_flag("--attn_implementation"),
        prior={"cuda": ("flash_attention_2", "sdpa", "eager"), "cpu": ("sdpa", "eager", "flash_attention_2")},
        doc="attention kernel (Hugging Face attn_implementation)")
    compile: str = knob("off", kind="choice", choices=COMPILE_MODES, off="off", trl=trl_compile,
        prior=on_every_device(("off", "default", "max-autotune", "reduce-overhead")),
        doc="torch.compile mode; pair with padding: max_length to avoid recompiles")
    tf32: bool = knob(False, kind="bool", off=False, prior={"cuda": (True, False), "cpu": (False, True)},
        trl=WITH_OTHER_KNOBS,
        doc="allow TF32 matmuls and cuDNN convolutions on Ampere+ GPUs (no effect on CPU)")
    optimizer: str = knob("adamw", kind="choice", choices=OPTIMIZERS, changes_learning=True, off="adamw",
        trl=trl_mapped("--optim", {"adamw": "adamw_torch", "adamw_fused": "adamw_torch_fused", "adamw_8bit": "adamw_bnb_8bit"}),
        prior=on_every_device(("adamw_fused", "adamw", "adamw_8bit")),
        doc="adamw (torch), adamw_fused (torch fused kernel), adamw_8bit (bitsandbytes)")
    padding: str = knob("longest", kind="choice", choices=PADDINGS, batch_shape=True, off="longest", trl=WITH_OTHER_KNOBS,
        prior=on_every_device(("longest", "max_length")),
        doc="pad each batch to its longest sample, or every batch to max_length")
    pad_to_multiple_of: int | None = knob(None, kind="int", minimum=1, nullable=True, batch_shape=True, off=None,
        trl=WITH_OTHER_KNOBS,
        no_prior="an integer of the user's (8, 64...): searched values keep the spec's order; which rounding pays "
                 "depends on the device's kernels, measured",
        doc="round each batch's padded length up to a multiple of this (TRL's and transformers' "
            "pad_to_multiple_of): far fewer distinct batch shapes (a GPU's kernel choice, allocator, "
            "compile) for a little more padding; with padding: max_length, max_length rounds up to it. "
            "null = no rounding")
    group_by_length: bool = knob(False, kind="bool", batch_shape=True, off=False, prior=on_every_device((True, False)),
        trl=trl_when_on("--train_sampling_strategy", "group_by_length"),  # transformers 5 (4.x: --group_by_length)
        doc="batch samples of similar length together (the Hugging Face trainer's length-grouped "
            "sampler): less padding with padding: longest; the order stays random between groups")
    packing: bool = knob(False, kind="bool", batch_shape=True, changes_learning=True, off=False,
        trl=trl_when_on("--packing", "true", "--packing_strategy", "bfd"),  # bfd turns on the padding-free collator
        no_prior="changes what is learned (a packed step holds more samples): searched values keep the spec's order",
        doc="pack samples into rows of max_length (TRL's packing, best-fit decreasing) and train each "
            "batch padding-free, as one row with each sample's positions restarting (flash_attention_2 "
            "attends per sample; sdpa and eager through a block-diagonal mask): no padding, and fewer, "
            "fuller steps; batch_size counts packed rows, so a step holds more samples")
    loss: str = knob("auto", kind="choice", choices=LOSSES,
        no_trl="trl sft always computes the loss with TRL's fused LM head (the spec refuses loss: model with it)",
        no_prior="the training command decides it (loss: auto); searched values keep the spec's order",
        doc="how a Hugging Face model's loss is computed: model = its own forward, full logits "
            "(transformers Trainer, most loops); fused = TRL's fused LM head, log-probs in tiles "
            "without the full logits (trl sft); liger = Liger-Kernel's fused linear cross-entropy and layer "
            "kernels, as a transformers Trainer's use_liger_kernel applies them (CUDA; pip install liger-kernel); "
            "auto = as the training command does")
    nproc_per_node: int = knob(1, kind="int", minimum=1, maximum=64, trl=WITH_OTHER_KNOBS,
        no_prior="the devices the run may use: searched values keep the spec's order",
        doc="processes (one a device) the run trains on, started by torchrun; more than 1 needs parallel")
    nnodes: int = knob(1, kind="int", minimum=1, maximum=1024, trl=WITH_OTHER_KNOBS,
        no_prior="the machines the run may use: searched values keep the spec's order",
        doc="machines the run trains on, nproc_per_node processes each (accelerate launch --num_machines); "
            "the probe measures one machine, and the speeds assume the others add theirs alike")
    parallel: str = knob("none", kind="choice", choices=PARALLELS, trl=WITH_OTHER_KNOBS,
        no_prior="whether the model's weights, gradients and optimizer state fit one device decides: measured",
        doc="how nproc_per_node processes share the training: ddp (a whole copy of the model each, "
            "gradients all-reduced), fsdp (FSDP2's fully_shard: each process holds a shard of the "
            "weights, gradients and optimizer state, gathered per layer)")
    fsdp_reshard_after_forward: bool = knob(True, kind="bool", trl=WITH_OTHER_KNOBS, memory_only=True,
        prior=on_every_device((False, True)),
        doc="with parallel: fsdp, free each layer's gathered weights after its forward and gather them "
            "again for backward: less memory, more communication")
    fsdp_cpu_offload: bool = knob(False, kind="bool", trl=WITH_OTHER_KNOBS, memory_only=True,
        prior=on_every_device((False, True)),
        doc="with parallel: fsdp, keep each process's shard of the weights, gradients and optimizer state in "
            "host memory and step the optimizer on the CPU (FSDP2's CPUOffloadPolicy; CUDA): the least GPU "
            "memory, the slowest steps")
    num_workers: int = knob(0, kind="int", minimum=0, maximum=256, batch_shape=True, trl=WITH_OTHER_KNOBS,
        no_prior="an integer searched in the spec's order; `auto` in search: gives candidates from this "
                 "machine's cores and RAM",
        doc="data loader worker processes that read and collate batches while the model trains "
            "(torch DataLoader num_workers; 0 = in the training process, between steps)")
    pin_memory: bool = knob(True, kind="bool", batch_shape=True, trl=WITH_OTHER_KNOBS,
        prior=on_every_device((True, False)),
        doc="collate batches into page-locked host memory, so the copy to a GPU is faster and can "
            "overlap (the trainers' default; nothing on a CPU)")
    persistent_workers: bool = knob(False, kind="bool", batch_shape=True, trl=WITH_OTHER_KNOBS,
        no_prior="it pays at each epoch's start, which a probe does not time: searched values keep the spec's order",
        doc="keep the loader's workers alive between epochs instead of starting them again "
            "(with num_workers > 0)")
    prefetch_factor: int | None = knob(None, kind="int", minimum=1, maximum=1024, nullable=True, batch_shape=True,
        trl=WITH_OTHER_KNOBS, no_prior="an integer searched in the spec's order",
        doc="batches each loader worker prepares ahead (with num_workers > 0); null = torch's 2")
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Custom keys passed through to a factory workload (e.g. ``ddpm_batch_mul``)."""

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step over every process: ``batch_size x gradient_accumulation_steps
        x processes`` (Hugging Face's "total train batch size"; under packing, packed rows). What is
        learned depends on it, so ``tune.target_effective_batch`` derives the accumulation from it."""
        return self.batch_size * self.gradient_accumulation_steps * self.processes

    @property
    def processes(self) -> int:
        """The processes the run trains on over all its machines: ``nproc_per_node`` x ``nnodes``."""
        return self.nproc_per_node * self.nnodes

    def padded_length(self, longest: int, max_length: int | None) -> int:
        """Positions each row of a micro-batch is padded to, as the trainer's collator pads it: the
        batch's longest sample (``longest``, already truncated at ``max_length``), or ``max_length``
        under ``padding: max_length``, rounded up to ``pad_to_multiple_of``. TRL's collator rounds
        the longest up past ``max_length`` where it must (``trl/trainer/utils.py`` ``pad``), and
        transformers rounds a fixed ``max_length`` up too (``PreTrainedTokenizerBase._pad``): so
        does this. The one rule for every batch the probe, the eval pass and the command make;
        ``data.batching.simulate_epoch`` applies it to a whole epoch at once."""
        length = max_length if self.padding == "max_length" and max_length is not None else longest
        multiple = self.pad_to_multiple_of
        return length if multiple is None else -(-length // multiple) * multiple

    def batch_length(self, lengths: Sequence[int], max_length: int | None) -> int:
        """Positions of one micro-batch of samples this long (already truncated at ``max_length``), as
        the trainer's collator makes it: each row padded (:meth:`padded_length`), or under ``packing``
        one padding-free row of them all (TRL's ``padding_free`` collator), rounded up to the multiple
        the command passes TRL as ``pad_to_multiple_of`` (``max_length`` itself under ``padding: max_length``)."""
        if not self.packing:
            return self.padded_length(max(lengths), max_length)
        multiple, total = self.packed_multiple(max_length), sum(lengths)
        return total if multiple is None else -(-total // multiple) * multiple

    def packed_multiple(self, max_length: int | None) -> int | None:
        """What a packed micro-batch's one row is rounded up to a multiple of: the command's
        ``pad_to_multiple_of`` (``max_length`` rounded up to it under ``padding: max_length``); None: none."""
        if self.padding == "max_length" and max_length is not None:
            return self.padded_length(max_length, max_length)
        return self.pad_to_multiple_of

    def to_dict(self) -> dict[str, Any]:
        """Flat, JSON-ready view: built-in knobs then custom keys."""
        out = {k: list(v) if isinstance(v := getattr(self, k), tuple) else v for k in KNOBS}
        out.update(self.extra)
        return out

    def replace(self, **changes: Any) -> Params:
        """A copy with some knobs changed; custom keys go to ``extra``."""
        raw = self.to_dict()
        raw.update(changes)
        params, problems = parse_params(raw, allow_custom=True)
        if problems:
            raise SpecError(problems, source="params")
        return params


KNOBS: dict[str, Knob] = {
    f.name: dataclasses.replace(f.metadata["knob"], name=f.name)
    for f in dataclasses.fields(Params)
    if "knob" in f.metadata
}
"""Every built-in knob by name, in ``Params``'s field order (every field but ``extra``)."""


def _check_value(knob: Knob, value: Any, key: str) -> tuple[Any, Problem | None]:
    """Coerce ``value`` for ``knob``; return (value, problem-or-None)."""
    if value is None:
        if knob.nullable:
            return None, None
        return value, Problem(key, "may not be null", f"give a {knob.kind} value")
    if knob.kind == "bool":
        if isinstance(value, bool):
            return value, None
        return value, Problem(key, f"expected true or false, got {value!r}")
    if knob.kind == "choice":
        if value in knob.choices:
            return value, None
        if value is False and "off" in knob.choices:  # YAML reads a bare `off` as False
            return "off", None
        close = difflib.get_close_matches(str(value), [str(c) for c in knob.choices], n=1)
        hint = f"did you mean {close[0]!r}?" if close else None
        return value, Problem(key, f"{value!r} is not one of {', '.join(map(str, knob.choices))}", hint)
    if knob.kind == "modules":
        if isinstance(value, str):  # --set lora_target_modules=q_proj,v_proj is two modules
            return split_modules(value), None
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            return tuple(value), None
        return value, Problem(key, "expected a list of names" + (" or 'all-linear'" if "modules" in key else ""))
    if knob.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return value, Problem(key, f"expected an integer, got {value!r}")
    elif knob.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return value, Problem(key, f"expected a number, got {value!r}")
        if not math.isfinite(value):
            return value, Problem(key, f"must be a finite number, got {value}")
        value = float(value)
    if knob.minimum is not None and value < knob.minimum:
        return value, Problem(key, f"must be >= {knob.minimum:g}, got {value}")
    if knob.maximum is not None and value > knob.maximum:
        return value, Problem(key, f"must be <= {knob.maximum:,}, got {value:,}")
    return value, None


def check_knob(name: str, value: Any, key: str | None = None) -> Problem | None:
    """The problem with setting built-in knob ``name`` to ``value``, or None when it is valid."""
    return _check_value(KNOBS[name], value, key or name)[1]


def parse_params(
    raw: Mapping[str, Any], *, allow_custom: bool, prefix: str = "params"
) -> tuple[Params, list[Problem]]:
    """Validate a mapping of knob values into ``Params``; collect every problem instead of raising.

    Unknown keys are custom keys when ``allow_custom`` (factory workloads), unless they look like
    a typo of a built-in knob; otherwise they are rejected with a did-you-mean.
    """
    problems: list[Problem] = []
    values: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for name, value in raw.items():
        key = f"{prefix}.{name}"
        knob = KNOBS.get(name)
        if knob is None:
            close = difflib.get_close_matches(name, list(KNOBS), n=1, cutoff=0.8 if allow_custom else 0.6)
            if close:
                problems.append(Problem(key, "unknown knob", f"did you mean {close[0]!r}?"))
            elif allow_custom:
                extra[name] = value
            else:
                problems.append(Problem(
                    key, "unknown knob",
                    f"built-in knobs are: {', '.join(KNOBS)}; custom keys need a factory model"))
            continue
        coerced, problem = _check_value(knob, value, key)
        if problem:
            problems.append(problem)
        else:
            values[name] = coerced
    if problems:
        return Params(), problems
    params = Params(**values, extra=extra)
    if params.padding == "max_length" and params.max_length is None:
        problems.append(Problem(f"{prefix}.padding", "padding: max_length needs max_length",
                                "set params.max_length (see `trainfit analyze` for a recommendation)"))
    return params, problems
