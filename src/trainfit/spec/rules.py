"""Rules across sections: what the training command (`trl sft`, or a ``tune.command_template``)
can run: the loss, the batching, the LoRA options, the template's placeholders."""

from __future__ import annotations

from typing import Any

from trainfit.errors import Problem
from trainfit.params import LORA_OPTIONS, Params
from trainfit.space import SearchSpace
from trainfit.spec.sections import ModelSpec, Spec, TuneSettings, is_trl_command
from trainfit.template import TEMPLATE_EXTRAS, placeholders, template_problem


def trl_problems(model: ModelSpec | None, tune: TuneSettings | None, params: Params | None,
                 space: Any) -> list[Problem]:
    """What a ``trl sft`` command cannot take, said when the spec is loaded rather than after the
    search: TRL's ``--lora_alpha`` is an integer, while the knob is a float (for trainers of one's
    own). ``model``, ``tune``: the spec's sections; ``space``: its ``SearchSpace``, if any."""
    if model is None or tune is None or params is None or not is_trl_command(model.factory, tune.command_template):
        return []
    dim = space.dim("lora_alpha") if space is not None else None
    if dim is not None and dim.is_range:  # a float range proposes fractions, however whole its ends
        floats = not (isinstance(dim.low, int) and isinstance(dim.high, int))
        what = f"a range of floats ({dim.low:g} to {dim.high:g})" if floats else None
    else:
        values = dim.choices if dim is not None else (params.lora_alpha,)
        what = ", ".join(f"{v:g}" for v in values if v is not None and not float(v).is_integer()) or None
    if what is None:
        return []
    key = "params.lora_alpha" if dim is None else "search.lora_alpha"
    return [Problem(key, f"{what}: not a whole number, and trl sft's --lora_alpha takes an integer",
                    "use whole numbers (e.g. 16; a range with integer ends), or a tune.command_template "
                    "for a trainer that takes a float")]


def loss_problems(model: ModelSpec | None, tune: TuneSettings | None, params: Params,
                   space: Any) -> list[Problem]:
    """``loss`` must be one the training command computes: TRL's fused head for ``trl sft``, and
    none at all for a factory model, which computes its own."""
    if model is None or tune is None:
        return []
    dim = space.dim("loss") if space is not None else None
    values = (params.loss, *(dim.choices if dim is not None else ()))
    key = "search.loss" if dim is not None else "params.loss"
    if model.factory is not None and any(v != "auto" for v in values):
        return [Problem(key, "a factory model computes its own loss; loss applies to Hugging Face models",
                        "drop loss, or name a custom key your factory reads")]
    trl = is_trl_command(model.factory, tune.command_template)
    if trl and "model" in values:
        return [Problem(key, "loss: model, but the training command is `trl sft`, which always computes the loss "
                             "with TRL's fused LM head",
                        "use loss: auto or fused, or a tune.command_template for a trainer that computes the "
                        "full logits")]
    if trl and "liger" in values:
        return [Problem(key, "loss: liger, but the training command is `trl sft`, which keeps its own fused LM head "
                             "and applies no Liger cross-entropy (its --use_liger_kernel adds the layer kernels only)",
                        "use loss: auto or fused, or a tune.command_template for a transformers Trainer script "
                        "that takes --use_liger_kernel")]
    return []


def _searchable_values(params: Params, space: Any, name: str) -> tuple[Any, ...]:
    """Every value knob ``name`` can take: its searched values, else its ``params`` value."""
    dim = space.dim(name) if space is not None else None
    return dim.grid_values() if dim is not None else (getattr(params, name),)


def _lora_options_set(params: Params, space: Any) -> list[str]:
    """The LoRA options (besides the rank) that some config of the search sets."""
    return [n for n in LORA_OPTIONS if any(v is not None for v in _searchable_values(params, space, n))]


def lora_problems(params: Params, space: Any) -> list[Problem]:
    """LoRA options need a rank. Checked over the search space, not ``params`` alone: a searched
    ``lora_r: [4, 32]`` gives every config a rank; a ``null`` among them is a full fine-tuning
    config, where the options are simply unused (see :func:`unused_lora_note`)."""
    options = _lora_options_set(params, space)
    if not options or any(r is not None for r in _searchable_values(params, space, "lora_r")):
        return []
    searched = space is not None and space.dim("lora_r") is not None
    return [Problem("search.lora_r" if searched else "params.lora_r",
                    f"LoRA options are set ({', '.join(options)}) but lora_r is null",
                    "set lora_r (e.g. 16) or drop the lora_* keys")]


def quantization_problems(model: ModelSpec | None, params: Params, space: Any) -> list[Problem]:
    """A quantized base (QLoRA) is a Hugging Face model's, under LoRA adapters: a factory quantizes
    its own model, and a base held in 4 or 8 bits cannot be fine-tuned whole (no config of the
    search has a rank). A search with ranks and nulls probes its null ones as errors."""
    quantized = [v for v in _searchable_values(params, space, "quantization") if v != "none"]
    if not quantized:
        return []
    key = "search.quantization" if space is not None and space.dim("quantization") else "params.quantization"
    if model is not None and model.factory is not None:
        return [Problem(key, f"quantization: {quantized[0]} applies to Hugging Face models (bitsandbytes on their "
                             "linear layers), and this is a factory model",
                        "drop quantization, or quantize in the factory and name a custom key it reads")]
    if all(r is None for r in _searchable_values(params, space, "lora_r")):
        return [Problem(key, f"quantization: {quantized[0]} holds the base in {quantized[0]}, which only LoRA "
                             "adapters can train on, and lora_r is null", "set lora_r (e.g. 16), or drop quantization")]
    return []


def parallel_problems(params: Params, space: Any) -> list[Problem]:
    """Processes need a way to share the training: ``nproc_per_node`` (or ``nnodes``) above 1 with
    ``parallel: none`` everywhere would train N copies apart. A search with both probes its unshared
    ones as errors. ``nnodes`` is not searched: every value would be probed on the same one machine."""
    if space is not None and space.dim("nnodes") is not None:
        return [Problem("search.nnodes", "nnodes is searched, and a probe measures one machine whatever it says: "
                                         "its values would differ by assumption, not by measurement",
                        "set params.nnodes to the machines the run will have")]
    many = [f"{knob}: {n} starts {n} {what}" for knob, what in (("nproc_per_node", "processes"), ("nnodes", "machines"))
            for n in _searchable_values(params, space, knob) if n > 1]
    if many and all(p == "none" for p in _searchable_values(params, space, "parallel")):
        return [Problem("params.parallel", f"{many[0]}, and parallel: none gives them nothing to share",
                        "set parallel: ddp or fsdp")]
    return []


def unused_lora_note(spec: Spec) -> str | None:
    """A line for a search whose ``lora_r`` choices include null (full fine-tuning) beside set LoRA options."""
    options = _lora_options_set(spec.params, spec.search)
    if not options or None not in _searchable_values(spec.params, spec.search, "lora_r"):
        return None
    return (f"lora_r=null configs train every weight (full fine-tuning): {', '.join(options)} apply only to "
            "the configs with a rank")


def template_problems(tune: TuneSettings | None, params: Params, space: SearchSpace | None) -> list[Problem]:
    """``tune.command_template`` may name only knobs (set or searched) and the template's extras; a
    custom key may not take an extra's name (the extra would hide it); a packed config needs the
    template to pass ``{packing}`` (else the probe measures steps the trainer never runs)."""
    if tune is None or tune.command_template is None:
        return []

    shadowed = sorted(set(TEMPLATE_EXTRAS) & {*params.extra, *(space.names if space is not None else ())})
    if shadowed:
        where = "search" if space is not None and shadowed[0] in space.names else "params"
        return [Problem(f"{where}.{shadowed[0]}", f"a custom key named {shadowed[0]!r}, which the command template "
                        "fills itself", f"rename it; the template's own placeholders are {', '.join(TEMPLATE_EXTRAS)}")]
    names = [*params.to_dict(), *(space.names if space is not None else ()), *TEMPLATE_EXTRAS]
    problem = template_problem(tune.command_template, dict.fromkeys(names))
    if problem:
        return [Problem("tune.command_template", problem)]
    dim = space.dim("packing") if space is not None else None
    if True in (params.packing, *(dim.choices if dim else ())) and "packing" not in placeholders(tune.command_template):
        return [Problem("tune.command_template", "packed configs are probed, and the template passes no {packing}: "
                        "its trainer would train them unpacked", "pass --packing {packing} (your trainer's flag), "
                        "or drop packing")]
    return []


def batching_problems(model: ModelSpec | None, tune: TuneSettings | None, params: Params,
                      space: Any) -> list[Problem]:
    """Batching a factory model's trainer cannot do: ``packing`` (TRL's, for a Hugging Face causal
    LM: a factory's own ``collate`` makes its batches), and ``group_by_length`` without a
    ``tune.command_template`` (``trainfit train``'s own loop reads rows in a shuffled stream: the
    probe would price grouped batches the run never trains)."""
    if model is None or model.factory is None:
        return []
    problems = []
    for knob, why, way in (
            ("packing", "packing packs a Hugging Face causal LM's samples into rows, and this is a factory model, "
                        "whose own collate makes its batches", "drop packing"),
            ("group_by_length", "group_by_length, and this factory model trains in trainfit's own loop, which reads "
                                "rows in a shuffled stream and does not group them by length",
             "drop group_by_length, or train with your own trainer: a tune.command_template passing {group_by_length}")):
        if knob == "group_by_length" and tune is not None and tune.command_template:
            continue
        dim = space.dim(knob) if space is not None else None
        if True in (getattr(params, knob), *(dim.choices if dim else ())):
            problems.append(Problem(f"search.{knob}" if dim is not None else f"params.{knob}", why, way))
    return problems


def params_problems(model: ModelSpec | None, tune: TuneSettings | None, params: Params | None,
                    space: SearchSpace | None) -> list[Problem]:
    """Every rule across sections on ``params`` (and the search ``space``, if any): what the spec
    is checked against when loaded, and each config of a comparison's configs file."""
    if params is None:
        return []
    return [*template_problems(tune, params, space), *loss_problems(model, tune, params, space),
            *batching_problems(model, tune, params, space), *lora_problems(params, space),
            *quantization_problems(model, params, space), *parallel_problems(params, space),
            *trl_problems(model, tune, params, space)]
