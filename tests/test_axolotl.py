"""The Axolotl config fragment a tune writes (axolotl.yaml): its keys for representative configs,
every knob reaching it as a key or a comment, and, where axolotl is installed, each fragment read
by Axolotl's own config parser (``validate_config`` over its pydantic schema, on an H100's
capabilities, then ``normalize_config``), which must know every key (it drops unknown ones silently)
and keep every value."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, TINY_LLAMA
from test_command import two_values
from tune_helpers import Surface, synthetic_spec

from trainfit.params import KNOBS, Params
from trainfit.tune.options import TuneOptions
from trainfit.spec import Spec, load_spec
from trainfit.trainer.axolotl import AXOLOTL_FILE, axolotl_fragment
from trainfit.trainer.command import MODEL_PLACEHOLDER
from trainfit.tune import tune

LORA_PACKED = Params(batch_size=4, gradient_accumulation_steps=2, max_length=64, lora_r=8, lora_alpha=16,
                     precision="bf16", packing=True, attention="flash_attention_2", tf32=True,
                     gradient_checkpointing=True)
QLORA = Params(max_length=64, precision="bf16", lora_r=8, quantization="4bit", num_workers=2, prefetch_factor=4)
FULL_FP32 = Params(batch_size=2, max_length=64, padding="max_length", pad_to_multiple_of=48)
LIGER = Params(max_length=64, precision="bf16", loss="liger", lora_r=8, lora_target_modules="all-linear",
               compile="max-autotune", optimizer="adamw_8bit", group_by_length=True, gradient_checkpointing=True,
               activation_offloading=True, pad_to_multiple_of=8)
SCHEDULE = {"learning_rate": 2e-5, "lr_scheduler": "linear", "warmup_steps": 0, "weight_decay": 0.0,
            "max_grad_norm": 1.0, "num_epochs": 1.0}
"""The trl sft command's schedule (TRL's SFTConfig defaults), which Axolotl's own defaults differ from."""


def trl_spec() -> Spec:
    return load_spec(EXAMPLES / "tiny-llama.yaml")


def template_spec() -> Spec:
    """A command of one's own that takes the loss: where ``loss: liger`` is searched."""
    return load_spec(EXAMPLES / "tiny-llama.yaml", ["tune.command_template=python train.py --bs {batch_size} "
                                                    "--loss {loss}"])


def test_lora_bf16_packing_flash_attention_in_axolotls_keys(tmp_path: Path) -> None:
    fragment = axolotl_fragment(trl_spec(), LORA_PACKED, max_length=64, model_dir=tmp_path / "model")
    assert fragment is not None
    assert fragment.keys == {
        "base_model": str(tmp_path / "model"), "sequence_len": 64, "sample_packing": True,
        "pad_to_sequence_len": False, "micro_batch_size": 4, "gradient_accumulation_steps": 2,
        "group_by_length": False, "bf16": True, "fp16": False, "tf32": True, "gradient_checkpointing": True,
        "attn_implementation": "flash_attention_2", "torch_compile": False, "optimizer": "adamw_torch",
        "dataloader_num_workers": 0, "dataloader_pin_memory": True, "adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.0,
        "lora_target_modules": ["q_proj", "v_proj"], **SCHEDULE}
    assert list(fragment.keys)[:3] == ["base_model", "sequence_len", "sample_packing"]  # written in ORDER
    # lora_target_modules: null is peft's default for llama, which Axolotl would not apply (it adapts nothing)
    assert "peft's default" in fragment.comments["lora_target_modules"][0]
    assert "multipack" in fragment.comments["sample_packing"][0]  # packs otherwise than TRL's bfd
    assert "flash_attention: true" in fragment.comments["attn_implementation"][0]  # Axolotl before 0.17
    assert "LoRA kernels" in fragment.comments["adapter"][0]  # Axolotl's own, not measured
    [note] = fragment.notes  # the trl sft command's loss, TRL's fused LM head: no Axolotl key
    assert note.startswith("loss: TRL's fused LM head was measured")


def test_a_full_fine_tune_in_fp32_measured_on_a_cpu(tmp_path: Path) -> None:
    fragment = axolotl_fragment(trl_spec(), FULL_FP32, max_length=64, cpu_threads=2, model_dir=tmp_path / "model")
    assert fragment is not None
    assert fragment.keys == {
        "base_model": str(tmp_path / "model"), "sequence_len": 64, "sample_packing": False,
        "pad_to_sequence_len": True, "pad_to_multiple_of": 48, "micro_batch_size": 2,
        "gradient_accumulation_steps": 1, "group_by_length": False, "bf16": False, "fp16": False, "tf32": False,
        "gradient_checkpointing": False, "attn_implementation": "sdpa", "torch_compile": False,
        "optimizer": "adamw_torch", "dataloader_num_workers": 0, "dataloader_pin_memory": True, **SCHEDULE}
    assert "measured on a CPU" in fragment.comments["tf32"][0]  # use_cpu: no Axolotl key, said here
    text = fragment.to_yaml("# trainfit: a header")
    assert text.startswith("# trainfit: a header\n# The config above in Axolotl's keys")
    assert yaml.safe_load(text) == fragment.keys  # the comments are comments


def test_loss_liger_is_the_liger_plugin() -> None:
    """``loss: liger`` (a command of one's own: trl sft keeps its fused head) as Axolotl's Liger
    plugin, with the kernels the Trainer's use_liger_kernel applies; offloading with checkpointing."""
    fragment = axolotl_fragment(template_spec(), LIGER, max_length=64)
    assert fragment is not None and fragment.notes == []  # the loss measured is the one written
    assert fragment.keys["plugins"] == ["axolotl.integrations.liger.LigerPlugin"]
    assert {k: fragment.keys[k] for k in fragment.keys if k.startswith("liger_")} == {
        "liger_rope": True, "liger_rms_norm": True, "liger_glu_activation": True, "liger_layer_norm": True,
        "liger_fused_linear_cross_entropy": True}
    assert {k: fragment.keys.get(k) for k in ("lora_target_linear", "lora_target_modules", "torch_compile",
                                              "torch_compile_mode", "optimizer", "group_by_length",
                                              "activation_offloading", "pad_to_multiple_of", "pad_to_sequence_len")} == {
        "lora_target_linear": True, "lora_target_modules": None, "torch_compile": True,
        "torch_compile_mode": "max-autotune", "optimizer": "adamw_bnb_8bit", "group_by_length": True,
        "activation_offloading": True, "pad_to_multiple_of": 8, "pad_to_sequence_len": None}
    assert fragment.keys["base_model"] == MODEL_PLACEHOLDER and fragment.comments["base_model"]  # no saved model


def test_what_axolotl_has_no_key_for_is_said_not_dropped() -> None:
    """Offloading without checkpointing (Axolotl refuses it), a fractional lora_alpha (Axolotl's is
    an integer), a factory's model (Axolotl cannot load it)."""
    fragment = axolotl_fragment(trl_spec(), Params(activation_offloading=True, lora_r=4, lora_alpha=2.5))
    assert fragment is not None and "activation_offloading" not in fragment.keys and "lora_alpha" not in fragment.keys
    assert any(n.startswith("activation_offloading: true was measured without") for n in fragment.notes)
    assert any("lora_alpha: 2.5 was measured" in c for c in fragment.comments["adapter"])
    factory = load_spec(EXAMPLES / "tiny-tts.yaml")
    assert axolotl_fragment(factory, factory.params) is None


def test_a_4bit_base_is_qlora_with_its_type_written_out_and_the_loader_too() -> None:
    """Axolotl's own 4-bit default (nf4, double quantization) and loader default (a worker per GPU,
    256 batches ahead) differ from what was measured: both are written out."""
    params = Params(lora_r=8, quantization="4bit", bnb_4bit_quant_type="fp4", num_workers=3, prefetch_factor=4,
                    persistent_workers=True)
    fragment = axolotl_fragment(trl_spec(), params)
    assert fragment is not None
    assert {k: fragment.keys.get(k) for k in ("adapter", "load_in_4bit", "bnb_config_kwargs", "dataloader_num_workers",
                                              "dataloader_prefetch_factor", "dataloader_pin_memory")} == {
        "adapter": "qlora", "load_in_4bit": True,
        "bnb_config_kwargs": {"bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": False},
        "dataloader_num_workers": 3, "dataloader_prefetch_factor": 4, "dataloader_pin_memory": True}
    assert any(n.startswith("dataloader_persistent_workers: true was measured") for n in fragment.notes)
    eight = axolotl_fragment(trl_spec(), Params(lora_r=8, quantization="8bit"))
    assert eight is not None and (eight.keys["adapter"], eight.keys["load_in_8bit"]) == ("lora", True)


def test_every_knob_reaches_the_fragment() -> None:
    """A knob the fragment left out would train something else than was measured: each knob's
    two values write two different files (a key or a comment)."""
    # LoRA, loader, 4-bit and FSDP options apply with these
    base = Params(lora_r=8, max_length=64, num_workers=2, quantization="4bit", nproc_per_node=2, parallel="fsdp")
    checked = 0
    for spec in (trl_spec(), template_spec()):
        for name, knob in KNOBS.items():
            # loss: auto is the command's own, the model's under a template; liger has its own test above
            values = ("model", "fused") if name == "loss" else two_values(knob)
            first, second = (base.replace(**{name: v}) for v in values)
            # max_length: the knob's own, as the command's truncation length where no data says otherwise
            texts = [axolotl_fragment(spec, p).to_yaml("#") for p in (first, second)]
            assert texts[0] != texts[1], name
            checked += 1
    assert checked == 2 * len(KNOBS)


def test_tune_writes_axolotl_yaml_beside_the_command(tmp_path: Path) -> None:
    """The best config, with the random-init model the trl sft command trains as its base model."""
    out = tmp_path / "out"
    best = tune(synthetic_spec(tmp_path, "grid", max_trials=4),
                TuneOptions(output=out, probe_fn=Surface())).summary.best_config
    assert best is not None
    text = (out / AXOLOTL_FILE).read_text()
    written = yaml.safe_load(text)
    assert text.startswith(f"# trainfit: fastest measured config (trial {best.trial})")
    assert written["base_model"] == str(out.resolve() / "model") and (out / "model" / "config.json").exists()
    assert (written["micro_batch_size"], written["gradient_accumulation_steps"], written["lora_r"]) == (
        best.config["batch_size"], best.config["gradient_accumulation_steps"], best.config["lora_r"])


AXOLOTL_READS = '''
import json, sys, importlib, yaml
try:
    from axolotl.integrations.base import load_plugin
    from axolotl.utils.config import normalize_config, prepare_plugins, validate_config
    from axolotl.utils.dict import DictDefault
    from axolotl.utils.schemas.config import AxolotlInputConfig
except ImportError as err:
    print(f"axolotl does not import here: {err}")
    sys.exit(3)
H100 = {"bf16": True, "fp8": False, "n_gpu": 1, "n_node": 1, "compute_capability": "sm_90"}
out = {}
for path in sys.argv[1:]:
    fragment = yaml.safe_load(open(path))
    known = set(AxolotlInputConfig.model_fields)
    for plugin in fragment.get("plugins", []):
        module, name = load_plugin(plugin).get_input_args().rsplit(".", 1)
        known |= set(getattr(importlib.import_module(module), name).model_fields)
    cfg = DictDefault({**fragment, "output_dir": "unused",
                       "datasets": [{"path": "train.jsonl", "ds_type": "json", "type": "completion"}]})
    prepare_plugins(cfg)
    cfg = validate_config(cfg, capabilities=H100, env_capabilities={"torch_version": "2.13.0"})
    normalize_config(cfg)  # reads base_model's config.json
    out[path] = {"unknown": sorted(set(fragment) - known), "read": {k: cfg.get(k) for k in fragment}}
print(json.dumps(out))
'''


@pytest.mark.integration
def test_axolotl_reads_each_fragment_as_written(tmp_path: Path) -> None:
    """Axolotl's own parser, in a process of its own (it patches libraries as it imports). axolotl
    is installed without its dependencies (.ci/run): they pin other transformers and TRL releases."""
    if importlib.util.find_spec("axolotl") is None:
        pytest.skip("axolotl is not installed (.ci/run installs it: pip install --no-deps axolotl addict)")
    from transformers import AutoConfig

    config = dict(TINY_LLAMA)
    model = tmp_path / "model"
    AutoConfig.for_model(config.pop("model_type"), **config).save_pretrained(model)  # what normalize_config reads
    run = tmp_path / "run"
    tune(synthetic_spec(tmp_path, "grid", max_trials=2), TuneOptions(output=run, probe_fn=Surface()))
    paths = [run / AXOLOTL_FILE]
    for name, spec, params in (("lora", trl_spec(), LORA_PACKED), ("full", trl_spec(), FULL_FP32),
                               ("liger", template_spec(), LIGER), ("qlora", trl_spec(), QLORA)):
        fragment = axolotl_fragment(spec, params, max_length=64, model_dir=model)
        assert fragment is not None
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(fragment.to_yaml("# a test"))
    done = subprocess.run([sys.executable, "-c", AXOLOTL_READS, *map(str, paths)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300, check=False)  # 3: axolotl does not import
    if done.returncode == 3:
        pytest.skip(done.stdout.strip())
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(read) == 5
    for path in paths:
        written = yaml.safe_load(path.read_text())
        assert read[str(path)]["unknown"] == [], path.name
        assert read[str(path)]["read"] == written, path.name
