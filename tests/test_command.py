"""The training command `tune` writes, checked with TRL's own parser: every flag of the written
`trl sft` command, for every knob value the command maps, is parsed by the parser `trl sft` runs (TRL's
argument dataclasses and transformers' checks), and its LoRA flags build the adapters the probe
trained. (tests/test_written_command.py runs the written scripts.)"""

from __future__ import annotations

import shlex
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import EXAMPLES

from trainfit.trainer.command import build_command, trl_data_config
from trainfit.errors import SpecError, TrainfitError
from trainfit.spec import ModelSpec, load_spec

pytest.importorskip("trl")


def trl_parsed(command: str) -> dict[str, Any]:
    """The written command's arguments as `trl sft` parses them: every field of its dataclasses. A
    flag the installed transformers calls deprecated (a FutureWarning) fails the test: the command
    names each setting as the trainer it runs on names it."""
    from trl.scripts.sft import make_parser

    argv = shlex.split(command)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        dataclasses = make_parser().parse_args_and_config(argv[argv.index("sft") + 1:], fail_with_unknown_args=True)
    return {k: v for d in reversed(dataclasses) for k, v in vars(d).items()}


BASE = {"batch_size": 2, "gradient_accumulation_steps": 3, "max_length": 64}


@pytest.mark.parametrize("knobs, expected", [
    ({}, {"bf16": False, "fp16": False, "dtype": "float32", "tf32": False, "gradient_checkpointing": False,
          "attn_implementation": "sdpa", "optim": "adamw_torch", "torch_compile": False, "use_peft": False,
          "train_sampling_strategy": "random"}),
    ({"precision": "bf16"}, {"bf16": True, "fp16": False, "use_cpu": True, "dtype": "float32"}),
    ({"precision": "fp16"}, {"fp16": True, "bf16": False, "use_cpu": True}),
    ({"tf32": True}, {"tf32": False}),  # a CUDA setting: off where the probe ran, on a CPU
    ({"gradient_checkpointing": True}, {"gradient_checkpointing": True}),
    ({"attention": "eager"}, {"attn_implementation": "eager"}),
    ({"optimizer": "adamw_fused"}, {"optim": "adamw_torch_fused"}),
    ({"optimizer": "adamw_8bit"}, {"optim": "adamw_bnb_8bit"}),
    ({"compile": "default"}, {"torch_compile": True}),
    ({"activation_offloading": True}, {"activation_offloading": True}),
    ({"compile": "max-autotune"}, {"torch_compile": True, "torch_compile_mode": "max-autotune"}),
    ({"padding": "max_length"}, {"pad_to_multiple_of": 64, "max_length": 64}),
    ({"pad_to_multiple_of": 8}, {"pad_to_multiple_of": 8, "max_length": 64}),
    ({"padding": "max_length", "pad_to_multiple_of": 48}, {"pad_to_multiple_of": 96, "max_length": 64}),
    ({"group_by_length": True}, {"train_sampling_strategy": "group_by_length"}),
    ({}, {"packing": False}),
    ({"packing": True}, {"packing": True, "packing_strategy": "bfd"}),
    ({"max_length": None}, {"max_length": 48}),  # the length the probe truncated at
    ({"lora_r": 8}, {"use_peft": True, "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0}),
    ({"lora_r": 8, "lora_alpha": 16}, {"lora_alpha": 16}),  # a float knob, TRL's flag an int
    ({"lora_r": 8, "lora_alpha": 16, "precision": "bf16"}, {"lora_alpha": 16, "bf16": True, "dtype": "bfloat16"}),
    ({"lora_r": 4, "lora_dropout": 0.1, "lora_target_modules": ["q_proj", "v_proj"]},
     {"lora_dropout": 0.1, "lora_target_modules": ["q_proj", "v_proj"]}),
    ({"lora_r": 4, "lora_target_modules": "all-linear", "lora_target_parameters": ["mlp.experts.down_proj"]},
     {"lora_target_modules": "all-linear", "lora_target_parameters": ["mlp.experts.down_proj"]}),
])
@pytest.mark.integration
def test_trl_parses_the_whole_written_command(tmp_path: Path, knobs: dict[str, Any], expected: dict[str, Any]) -> None:
    """The command of a config probed on this CPU, as `tune` writes it (the data config, the saved
    model folder, the probe's threads), parsed by `trl sft`'s parser: refused by none, and every
    knob arrives as the value probed."""
    assert_trl_parses(tmp_path, knobs, {"use_cpu": True, **expected}, cpu_threads=2)


@pytest.mark.gpu
@pytest.mark.skipif("not __import__('torch').cuda.is_available()", reason="needs a CUDA GPU")
@pytest.mark.parametrize("knobs, expected", [
    ({"precision": "bf16", "tf32": True}, {"bf16": True, "tf32": True, "use_cpu": False}),
    ({"lora_r": 8, "lora_alpha": 16, "precision": "bf16", "optimizer": "adamw_8bit"},
     {"bf16": True, "dtype": "bfloat16", "lora_alpha": 16, "optim": "adamw_bnb_8bit", "use_cpu": False}),
])
@pytest.mark.integration
def test_trl_parses_the_command_of_a_config_probed_on_a_gpu(tmp_path: Path, knobs: dict[str, Any],
                                                            expected: dict[str, Any]) -> None:
    """transformers checks bf16 and TF32 against the machine it parses on: a GPU's command, on a GPU."""
    assert_trl_parses(tmp_path, knobs, expected, cpu_threads=None)


def assert_trl_parses(tmp_path: Path, knobs: dict[str, Any], expected: dict[str, Any], cpu_threads: int | None) -> None:
    spec = load_spec(EXAMPLES / "tiny-llama.yaml", ["tune.epochs=2.5"])
    data_config = tmp_path / "trl_data.yaml"
    data_config.write_text(yaml.safe_dump(trl_data_config(spec)))
    params = spec.params.replace(**{**BASE, **knobs})
    command = build_command(spec, params, max_length=48 if params.max_length is None else params.max_length,
                            data_config=data_config, cpu_threads=cpu_threads, model_dir=tmp_path / "model")
    parsed = trl_parsed(command)
    common = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 3, "max_length": 64,
              "num_train_epochs": 2.5, "model_name_or_path": str(tmp_path / "model"),
              "dataset_text_field": "text", "datasets": trl_data_config(spec)["datasets"]}
    want = {**common, **expected}
    got = {k: parsed[k] for k in want}
    got["datasets"] = [{"path": d.path, "data_files": d.data_files} for d in got["datasets"]]
    assert got == want


@pytest.mark.parametrize("overrides, key", [
    (["lora_r=8", "lora_alpha=12.5"], "params.lora_alpha"),
    (["lora_r=8", "search={lora_alpha: [8, 12.5]}"], "search.lora_alpha"),
    (["lora_r=8", "search={lora_alpha: {low: 8.5, high: 32}}"], "search.lora_alpha"),
])
def test_a_lora_alpha_trl_cannot_take_is_a_spec_error(overrides: list[str], key: str) -> None:
    """TRL's --lora_alpha is an int: a spec whose command is `trl sft` and whose alpha is not a whole
    number is refused before anything is probed (a trainer of one's own takes what it takes)."""
    with pytest.raises(SpecError, match=rf"{key}: .*whole number.*trl sft"):
        load_spec(EXAMPLES / "tiny-llama.yaml", overrides)
    mine = load_spec(EXAMPLES / "tiny-llama.yaml", [*overrides, "tune.command_template=train --alpha {lora_alpha}"])
    assert mine.tune.command_template


def test_an_unknown_model_type_names_the_closest_and_the_fix() -> None:
    """Not the ~700 model types transformers knows: the three closest and where to fix it."""
    from trainfit.workloads.hf import load_config

    with pytest.raises(TrainfitError) as info:
        load_config(ModelSpec(config={"model_type": "lama", "hidden_size": 32}))
    message = str(info.value)
    assert "'lama'" in message and "llama" in message and "model.config.model_type" in message
    assert len(message) < 300 and message.count("\n") <= 1, message


def test_a_misspelled_model_config_key_is_refused_not_built_at_the_default_width() -> None:
    """transformers keeps an unknown key as an attribute no model reads and builds the default in its
    place (``hiden_size``: a 4096-wide Llama, 121M parameters for a 0.35M spec); a legacy name it
    converts (``rope_theta`` into ``rope_parameters``) and a class's alias (GPT-2's ``hidden_size``) pass."""
    from trainfit.workloads.hf import load_config

    with pytest.raises(TrainfitError, match=r"model\.config\.hiden_size is no setting of .*LlamaConfig.*did you mean "
                                            r"hidden_size"):
        load_config(ModelSpec(config={"model_type": "llama", "hiden_size": 32}))
    assert load_config(ModelSpec(config={"model_type": "llama", "rope_theta": 5e5})).rope_parameters["rope_theta"] == 5e5
    assert load_config(ModelSpec(config={"model_type": "gpt2", "hidden_size": 32})).n_embd == 32
    # Keys config.json files carry that the class takes at their default, or keeps as they are: not refused.
    for extra in ({"rope_theta": 10000.0}, {"rope_scaling": None}, {"attn_implementation": "eager"},
                  {"auto_map": {"AutoConfig": "x"}}, {"tokenizer_class": "LlamaTokenizer"}, {"torch_dtype": "bfloat16"}):
        load_config(ModelSpec(config={"model_type": "llama", **extra}))


MIXTRAL = {"model_type": "mixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "num_local_experts": 4,
           "num_experts_per_tok": 2}


@pytest.mark.parametrize("config, lora", [
    (MIXTRAL, {"lora_target_modules": "q_proj"}),  # one name: TRL turns a one-entry list into a regex
    (MIXTRAL, {"lora_target_modules": "q_proj, v_proj"}),
    (MIXTRAL, {"lora_target_modules": "all-linear",
               "lora_target_parameters": "mlp.experts.gate_up_proj, mlp.experts.down_proj"}),
    ({**MIXTRAL, "model_type": "llama"}, {}),  # peft's default for the architecture
])
@pytest.mark.integration
def test_trl_builds_the_adapters_the_probe_trained(config: dict, lora: dict) -> None:
    """The command's LoRA flags, parsed by TRL's own argument classes into its LoraConfig, adapt
    exactly the weights the probe's LoraConfig adapted."""
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM, HfArgumentParser
    from trl import ModelConfig
    from trl.trainer.utils import get_peft_config

    from trainfit.params import parse_params
    from trainfit.workloads.lora import lora_config, trl_lora_args

    params, problems = parse_params({"lora_r": 4, **lora}, allow_custom=False)
    assert not problems

    def adapted(peft_config) -> set[str]:
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
        model = get_peft_model(model, peft_config)
        return {n for n, p in model.named_parameters() if p.requires_grad}

    (model_args,) = HfArgumentParser(ModelConfig).parse_args_into_dataclasses(trl_lora_args(params))
    probed = adapted(lora_config(params, task_type="CAUSAL_LM"))
    assert probed and adapted(get_peft_config(model_args)) == probed
    if "lora_target_parameters" in lora:
        assert any("experts" in n for n in probed)


def test_pad_to_multiple_of_reaches_trl_and_a_template_as_probed() -> None:
    """`trl sft` gets the multiple; under fixed padding, max_length rounded up to it (the length
    every batch was probed at: TRL's collator rounds each batch's longest, at most max_length, up to
    it). A template gets {pad_to_multiple_of}, its flag dropped while the knob is null."""
    from trainfit.trainer.command import trl_args
    from trainfit.params import Params
    from trainfit.template import render_template

    def multiple(params: Params, max_length: int | None = None) -> str | None:
        args = trl_args(params, max_length)
        return args[args.index("--pad_to_multiple_of") + 1] if "--pad_to_multiple_of" in args else None

    assert multiple(Params(max_length=64)) is None and multiple(Params(pad_to_multiple_of=8)) == "8"
    assert multiple(Params(max_length=64, pad_to_multiple_of=8)) == "8"
    assert multiple(Params(padding="max_length", max_length=64)) == "64"
    assert multiple(Params(padding="max_length", max_length=64, pad_to_multiple_of=48)) == "96"
    assert multiple(Params(padding="max_length", max_length=64, pad_to_multiple_of=16), 40) == "48"  # the probe's
    template = "train --bs {batch_size} --pad_to_multiple_of {pad_to_multiple_of}"
    assert render_template(template, Params()) == "train --bs 1"
    assert render_template(template, Params(pad_to_multiple_of=64)) == "train --bs 1 --pad_to_multiple_of 64"


def test_a_template_takes_use_liger_kernel_as_a_transformers_trainer_script_does() -> None:
    from trainfit.params import Params
    from trainfit.template import render_template

    template = "python train.py --per_device_train_batch_size {batch_size} --use_liger_kernel {use_liger_kernel}"
    assert render_template(template, Params(loss="liger")).endswith("--use_liger_kernel true")
    assert render_template(template, Params(loss="model")).endswith("--use_liger_kernel false")


def two_values(knob: Any) -> tuple[Any, Any]:
    """Two different valid values of a built-in knob."""
    if knob.choices:
        return knob.choices[0], knob.choices[1]
    return {"bool": (False, True), "int": (2, 4), "modules": (("q_proj",), ("q_proj", "v_proj")),
            "float": (0.0, 0.25) if knob.maximum == 1 else (8.0, 32.0)}[knob.kind]


def test_every_knob_reaches_the_trl_command_or_says_why_not() -> None:
    """A knob whose flags the command left out would train something else than what was measured:
    every knob changes the written flags, or its declaration says why not (``no_trl``)."""
    from trainfit.params import KNOBS, Params
    from trainfit.trainer.command import trl_args

    # LoRA, loader, 4-bit and FSDP options apply with these
    base = Params(lora_r=8, max_length=64, num_workers=2, quantization="4bit", nproc_per_node=2, parallel="fsdp")
    for name, knob in KNOBS.items():
        a, b = two_values(knob)
        written = trl_args(base.replace(**{name: a})) != trl_args(base.replace(**{name: b}))
        assert written != (knob.no_trl is not None), f"{name}: declare its trl= flags, or no_trl= with the reason"


def test_a_knob_declares_its_trl_flags_or_why_none() -> None:
    from trainfit.params import knob
    from trainfit.trl_words import trl_flag

    with pytest.raises(TypeError, match="no_trl"):
        knob(1, kind="int", doc="d", no_prior="x")
    with pytest.raises(TypeError, match="no_trl"):
        knob(1, kind="int", doc="d", no_prior="x", trl=trl_flag("--a"), no_trl="why")
    assert trl_flag("--a")(True) == ["--a", "true"] and trl_flag("--a")(None) == [] and trl_flag("--a")(3) == ["--a", "3"]


def test_every_knob_has_a_search_prior_or_says_why_not() -> None:
    """The auto strategy orders each knob's values by a device prior; a knob without one says why."""
    from trainfit.params import KNOBS
    from trainfit.search.auto import _PRIOR, NO_PRIOR

    for device, prior in _PRIOR.items():
        assert set(prior) | set(NO_PRIOR) == set(KNOBS) and not set(prior) & set(NO_PRIOR), device
        for name, order in prior.items():
            assert sorted(map(str, order)) == sorted(map(str, KNOBS[name].choices or (False, True))), (device, name)


def test_training_args_json_holds_every_flag_of_the_command_and_each_part_parses(tmp_path: Path) -> None:
    """training_args.json is read from the command's own flags: for each knob's two values, every
    flag the command passes is in one of its parts (none lost), and transformers' TrainingArguments
    and TRL's SFTConfig take their parts as they are (peft's LoraConfig takes `lora`)."""
    from peft import LoraConfig
    from transformers import BitsAndBytesConfig, TrainingArguments
    from trl import SFTConfig

    from trainfit.params import KNOBS, Params
    from trainfit.trainer.command import QUANTIZATION_ARGS, training_arguments, trl_args

    spec = load_spec(EXAMPLES / "tiny-llama.yaml")
    for name, knob in KNOBS.items():
        for value in two_values(knob):
            if (name, value) in (("optimizer", "adamw_8bit"), ("compile", "max-autotune")):
                continue  # bitsandbytes; a compile mode is only checked where it runs
            params = Params(lora_r=8, max_length=64).replace(**{name: value})
            out = training_arguments(spec, params, max_length=64, cpu_threads=2)
            assert out is not None
            flags = {w[2:] for w in trl_args(params, 64, cpu=True) if w.startswith("--")}
            quantized = out["model_init_kwargs"].get("quantization_config", {})
            placed = {*out["training_arguments"], *out["model_init_kwargs"], *out["sft"], *out.get("launch", {}),
                      *(flag for flag, key in QUANTIZATION_ARGS.items() if key in quantized)}
            assert flags - placed <= {"use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
                                      "lora_target_parameters"}, name
            TrainingArguments(output_dir=str(tmp_path), **out["training_arguments"])
            SFTConfig(output_dir=str(tmp_path), **out["training_arguments"], **out["sft"])
            LoraConfig(**out["lora"])
            if quantized:
                BitsAndBytesConfig(**quantized)
    mine = load_spec(EXAMPLES / "tiny-llama.yaml", ["tune.command_template=python train.py --bs {batch_size}"])
    assert training_arguments(mine, mine.params) is None  # a command of one's own: its settings are its own


@pytest.mark.parametrize("knobs", [
    {"nproc_per_node": 4, "parallel": "ddp"},
    {"nproc_per_node": 8, "parallel": "fsdp", "fsdp_reshard_after_forward": False, "precision": "bf16"},
    {"nproc_per_node": 2, "parallel": "fsdp", "fsdp_cpu_offload": True, "precision": "fp16"},
    {"nproc_per_node": 4, "nnodes": 2, "parallel": "fsdp", "precision": "fp32"},
])
def test_accelerate_config_yaml_launches_what_the_command_s_flags_launch(tmp_path: Path, monkeypatch,
                                                                         knobs: dict[str, Any]) -> None:
    """accelerate_config.yaml, read by accelerate's own loader and launch checks, resolves to the same
    processes and sharding as the flags of the written command (one set of settings, two forms)."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    from trainfit.params import Params
    from trainfit.trainer.accelerate_launch import launch_args, accelerate_config_yaml

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no accelerate default config of this machine's
    params = Params(**knobs)
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(accelerate_config_yaml(params, "# a test") or "")
    loaded = load_config_from_file(str(path))  # unknown keys would raise
    assert loaded.mixed_precision == {"bf16": "bf16", "fp16": "fp16"}.get(params.precision, "no")
    machine = ["--machine_rank", "1", "--main_process_ip", "10.0.0.7"] if params.nnodes > 1 else []
    flags = [w if not w.startswith("${") else {"MACHINE_RANK": "1", "MAIN_PROCESS_IP": "10.0.0.7"}.get(
        w[2:].split(":")[0], "29500") for w in launch_args(params)]
    by_flags = launch_command_parser().parse_args([*flags, "train.py"])
    by_file = launch_command_parser().parse_args(["--config_file", str(path), *machine, "train.py"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args in (by_flags, by_file):
            _validate_launch_command(args)
    names = ["num_processes", "num_machines", "main_process_ip", "multi_gpu", "use_fsdp", "fsdp_version",
             "fsdp_auto_wrap_policy", "fsdp_reshard_after_forward", "fsdp_offload_params",
             *(["machine_rank"] if params.nnodes > 1 else [])]  # one machine: rank 0 by the file, None (0) by flags
    assert {n: str(getattr(by_file, n)).lower() for n in names} == {n: str(getattr(by_flags, n)).lower() for n in names}
    assert by_file.num_processes == params.processes
    assert (by_file.use_fsdp, by_file.multi_gpu) == ((True, False) if params.parallel == "fsdp" else (False, True))


def test_one_process_has_no_accelerate_config() -> None:
    from trainfit.params import Params
    from trainfit.trainer.accelerate_launch import accelerate_config_yaml

    assert accelerate_config_yaml(Params(), "# a test") is None
    assert accelerate_config_yaml(Params(nproc_per_node=1, parallel="ddp"), "# a test") is None
