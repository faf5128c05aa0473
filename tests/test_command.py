"""The training command `tune` writes is run for real: TRL's `trl sft` trains the bundled tiny
model for a step with every flag trainfit chose (nothing downloaded: a local model folder, the
bundled data, the Hub switched off)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES
from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.search.tune import tune
from trainfit.spec import load_spec

pytest.importorskip("trl")
PLACEHOLDER = "'<a local model folder: this spec builds a random-init model from a config>'"


def local_model(spec, folder: Path) -> Path:
    """The example's random-init model and bundled tokenizer, saved as a Hugging Face folder."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from trainfit.workloads.hf import load_config

    AutoModelForCausalLM.from_config(load_config(spec.model)).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_file=str(spec.tokenizer), unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>", pad_token="<pad>").save_pretrained(folder)
    return folder


def prefers_lora_and_checkpointing(p: Params, number: int) -> Measurement:
    """Not a probe: a fixed ranking, so the written command holds LoRA, checkpointing, fixed padding."""
    sps = (1.0 + (p.lora_r or 0) + 10 * p.gradient_checkpointing) / p.batch_size
    return Measurement(status="ok", config=p.to_dict(), samples_per_second=sps, tokens_per_second=sps * 100,
                       peak_memory_bytes=2**30, steps_measured=5, stable=True, device="cpu", cpu_threads=3)


def test_the_written_trl_command_trains_the_model(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLES / "tiny-llama.yaml", ["max_length=64", "padding=max_length", "tune.max_trials=24",
                                                   "tune.strategy=grid"])
    out = tmp_path / "run"
    best = tune(spec, output=out, probe_fn=prefers_lora_and_checkpointing).summary["best_config"]
    assert best["searched"] == {"batch_size": 1, "gradient_checkpointing": True, "lora_r": 8}
    script = (out / "train_command.sh").read_text()
    assert (out / "trl_data.yaml").exists() and f"--config {out.resolve() / 'trl_data.yaml'}" in script
    for flag in ("--gradient_checkpointing true", "--bf16 false", "--use_peft true", "--lora_r 8",
                 "--max_length 64", "--pad_to_multiple_of 64", "--gradient_accumulation_steps 32"):
        assert flag in script
    # On CPU the run gets the probe's threads: `accelerate launch` would give it one.
    assert "\nOMP_NUM_THREADS=3 trl sft" in script and "# note: OMP_NUM_THREADS=3" in script

    model = local_model(spec, tmp_path / "model")
    runnable = script.replace(PLACEHOLDER, str(model)).replace(
        "--output_dir trainfit-run",
        f"--output_dir {tmp_path / 'trained'} --max_steps 1 --report_to none --save_strategy no --use_cpu true")
    (tmp_path / "run.sh").write_text(runnable)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(tmp_path / "run.sh")], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "trained" / "adapter_config.json").exists()  # a LoRA run saved its adapters


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
