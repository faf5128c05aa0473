"""The script `tune` writes is run by bash, as a user runs it: a `command_template` with a stub trainer
that prints the argv it receives (so a test asserts exactly what the trainer gets), and the `trl sft`
command of the README's main job with TRL itself, for two steps (nothing downloaded: the model folder
trainfit saved, the bundled data, the Hub switched off)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import EXAMPLES, TINY_LLAMA

from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.tune.options import TuneOptions
from trainfit.spec import load_spec, with_tune
from trainfit.trainer.command import command_script
from trainfit.tune import tune

STUB = "import json, sys\nprint(json.dumps(sys.argv[1:]))\n"
"""A trainer that prints the arguments it was given, as JSON, and nothing else."""


@pytest.fixture
def stub(tmp_path: Path) -> Path:
    path = tmp_path / "stub trainer"  # a space in its path: the template quotes it, trainfit leaves it be
    path.write_text(f"#!{sys.executable}\n{STUB}")
    path.chmod(0o755)
    return path


def run_script(script: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
               ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})}, cwd=cwd)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def template_spec(tmp_path: Path, template: str, *, factory: bool = False, params: dict[str, Any] | None = None):
    """A spec whose training command is ``template``: the tiny Llama, or with ``factory`` the
    bundled TTS factory (whose custom keys may be placeholders)."""
    model = {"factory": f"{EXAMPLES / 'tiny_tts.py'}:make_workload"} if factory else {"config": TINY_LLAMA}
    doc = {"model": model, "params": {"batch_size": 4, "max_length": 64, **(params or {})},
           "tune": {"command_template": template}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_spec(path)


def trainer_argv(tmp_path: Path, template: str, params: dict[str, Any] | None = None, *, factory: bool = False,
                 env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """The argv the stub trainer received from the script written for ``template`` with ``params``,
    and what the script printed after it."""
    spec = template_spec(tmp_path, template, factory=factory, params=params)
    script = tmp_path / "train_command.sh"
    script.write_text(command_script(spec, spec.params, "# a test"))
    first, _, rest = run_script(script, env=env).stdout.partition("\n")
    return json.loads(first), rest


def test_a_null_knob_drops_its_flag(tmp_path: Path, stub: Path) -> None:
    """The docs' own `--lora_r {lora_r}` (docs/search.md) with `lora_r: [null, 8, 16]`: the full fine-tuning
    config gets no `--lora_r` at all (it used to get a dangling `--lora_r` and nothing)."""
    template = f"'{stub}' --bs {{batch_size}} --lora_r {{lora_r}} --alpha={{lora_alpha}} --drop {{lora_dropout}} -x 1"
    assert trainer_argv(tmp_path, template)[0] == ["--bs", "4", "--drop", "0", "-x", "1"]
    assert trainer_argv(tmp_path, template, {"lora_r": 8, "lora_alpha": 16, "lora_dropout": 0.05})[0] == \
        ["--bs", "4", "--lora_r", "8", "--alpha=16", "--drop", "0.05", "-x", "1"]  # a whole float as an int


def test_a_list_knob_is_separate_words_or_joined_as_the_template_says(tmp_path: Path, stub: Path) -> None:
    template = f"'{stub}' --targets {{lora_target_modules}} --joined {{lora_target_modules:,}} --gc {{tf32}}"
    argv, _ = trainer_argv(tmp_path, template, {"lora_r": 8, "lora_target_modules": ["q_proj", "v_proj"]})
    assert argv == ["--targets", "q_proj", "v_proj", "--joined", "q_proj,v_proj", "--gc", "false"]


def test_shell_syntax_in_the_template_stays_shell_syntax(tmp_path: Path, stub: Path) -> None:
    """`$VAR`, `&&` and `|` are the shell's: the template is a command line, not a list of words."""
    template = (f"cd \"$RUN_DIR\" && '{stub}' --bs {{batch_size}} --dir \"$RUN_DIR\" --home ~ "
                "&& echo done | tr a-z A-Z")
    (tmp_path / "a run").mkdir()
    argv, after = trainer_argv(tmp_path, template, env={"RUN_DIR": str(tmp_path / "a run")})
    assert argv == ["--bs", "4", "--dir", str(tmp_path / "a run"), "--home", os.path.expanduser("~")]
    assert after == "DONE\n"


@pytest.mark.parametrize("value", ["bob's run", 'say "hi" $HOME `id` \\n; rm -rf x', "two  spaces"])
def test_a_value_reaches_the_trainer_as_one_argument_in_every_quoting(tmp_path: Path, stub: Path, value: str) -> None:
    """A value is quoted once, for where its placeholder stands: bare, inside "..." or inside '...'."""
    template = f"'{stub}' --name {{run_name}} --tag \"run: {{run_name}}\" --note 'n={{run_name}}' --x=a{{run_name}}"
    argv, _ = trainer_argv(tmp_path, template, {"run_name": value}, factory=True)
    assert argv == ["--name", value, "--tag", f"run: {value}", "--note", f"n={value}", f"--x=a{value}"]


def test_a_broken_template_is_a_spec_error(tmp_path: Path) -> None:
    from trainfit.errors import SpecError

    with pytest.raises(SpecError, match="tune.command_template: .*unterminated ' quote"):
        template_spec(tmp_path, "python train.py --name 'x {batch_size}")
    with pytest.raises(SpecError, match="tune.command_template: .*unknown placeholders: lr"):
        template_spec(tmp_path, "python train.py --lr {lr}")


def measured(params: Params, number: int, *, prefer: str) -> Measurement:
    """Not a probe (the probe is not what these tests are about): a fixed ranking that puts ``prefer``
    (a knob that is on or set) first, then smaller batches."""
    on = bool(params.to_dict()[prefer])
    sps = (1.0 + 10 * on + 5 * params.gradient_checkpointing) / params.batch_size
    return Measurement(status="ok", config=params.to_dict(), samples_per_second=sps, tokens_per_second=sps * 100,
                       peak_memory_bytes=2**30, steps_measured=5, stable=True, device="cpu", cpu_threads=2)


def test_a_quote_in_a_template_value_survives_tune_and_resume(tmp_path: Path, stub: Path) -> None:
    """A custom key holding a quote used to crash `tune` after its first probe (and every `--resume`),
    with no train_command.sh written."""
    spec = load_spec(EXAMPLES / "tiny-tts.yaml", ["run_name=bob's run", "tune.max_trials=2",
                                                 f"tune.command_template='{stub}' --name {{run_name}} "
                                                 "--bs {batch_size}"])
    out = tmp_path / "run"
    for resume in (False, True):
        tune(spec, TuneOptions(output=out, resume=resume, probe_fn=lambda p,
                               n: measured(p, n, prefer="gradient_checkpointing")))
        argv = json.loads(run_script(out / "train_command.sh").stdout)
        assert argv[:2] == ["--name", "bob's run"] and argv[2] == "--bs"


@pytest.mark.integration
def test_the_readme_main_job_writes_a_command_that_trains_as_written(tmp_path: Path) -> None:
    """`trainfit tune examples/tiny-llama.yaml --quick` builds its model from `config:`: the command
    trains the random-init model trainfit saved (once) in the output folder, with TRL, as written;
    extra arguments go to `trl sft`. LoRA with `lora_alpha: 16` (a float knob, TRL's flag an int) and
    bf16 probed on a CPU (transformers refuses bf16 off a GPU unless told `--use_cpu`) once made
    TRL refuse the command."""
    pytest.importorskip("trl")
    spec = load_spec(EXAMPLES / "tiny-llama.yaml", ["lora_alpha=16", "precision=bf16", "max_length=64",
                                                   "search={lora_r: [null, 8], batch_size: [1, 2]}",
                                                   "tune.target_effective_batch=2"])
    out = tmp_path / "run"
    best = tune(spec, TuneOptions(output=out, quick=True, probe_fn=lambda p,
                                  n: measured(p, n, prefer="lora_r"))).summary.to_json()["best_config"]
    assert best["searched"] == {"lora_r": 8, "batch_size": 1}
    script = (out / "train_command.sh").read_text()
    assert f"--model_name_or_path {out.resolve() / 'model'}" in script and "<" not in script
    for flag in ("--lora_alpha 16 ", "--bf16 true", "--use_cpu true", "--config "):
        assert flag in script
    assert "# note: --use_cpu true:" in script
    saved = (out / "model" / "model.safetensors").stat().st_mtime_ns
    tune(spec, TuneOptions(output=out, resume=True, quick=True, probe_fn=lambda p, n: measured(p, n, prefer="lora_r")))
    assert (out / "model" / "model.safetensors").stat().st_mtime_ns == saved  # saved once, not per write

    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    run_script(out / "train_command.sh", "--max_steps", "2", env=env, cwd=tmp_path)
    adapter = json.loads((tmp_path / "trainfit-run" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"]) == (8, 16)
    # The same config for a Trainer of one's own: each part read by its library's own class.
    from peft import LoraConfig
    from transformers import TrainingArguments
    from trl import SFTConfig

    exported = json.loads((out / "training_args.json").read_text())
    assert not (out / "accelerate_config.yaml").exists()  # one process: nothing to launch
    args = TrainingArguments(output_dir=str(tmp_path / "own"), **exported["training_arguments"])
    assert (args.per_device_train_batch_size, args.bf16, args.use_cpu) == (1, True, True)
    sft = SFTConfig(output_dir=str(tmp_path / "own"), **exported["training_arguments"], **exported["sft"])
    assert sft.max_length == 64 and exported["model_init_kwargs"] == {"attn_implementation": "sdpa", "dtype": "bfloat16"}
    sft_default = {f.name: f.default for f in dataclasses.fields(SFTConfig)}["learning_rate"]
    assert args.learning_rate == sft_default != TrainingArguments.learning_rate  # trl sft's rate, not a Trainer's
    assert exported["notes"] and "use_cpu" in exported["notes"][0]  # measured on a CPU: what to drop on a GPU
    lora = LoraConfig(**exported["lora"])
    assert (lora.r, lora.lora_alpha) == (adapter["r"], adapter["lora_alpha"])  # the adapters the command trained


def test_a_config_model_without_a_tokenizer_is_saved_and_the_script_says_what_is_missing(tmp_path: Path,
                                                                                          llama_spec) -> None:
    """Lengths counted without a tokenizer (none named): the model is saved all the same, and the
    script names what `trl sft` still needs before it can run."""
    out = tmp_path / "run"
    tune(with_tune(load_spec(llama_spec()), max_trials=1), TuneOptions(output=out, probe_fn=lambda p,
                                                                       n: measured(p, n, prefer="tf32")))
    script = (out / "train_command.sh").read_text()
    assert (out / "model" / "config.json").exists() and not (out / "model" / "tokenizer_config.json").exists()
    assert f"--model_name_or_path {out.resolve() / 'model'}" in script
    assert f"# note: {out.resolve() / 'model'} holds no tokenizer" in script


def test_a_model_too_large_to_save_keeps_the_placeholder_and_says_how(tmp_path: Path) -> None:
    """A random-init model over 1B parameters is not built in the tuning process to be saved."""
    from trainfit.trainer.command import MODEL_PLACEHOLDER
    from trainfit.workloads.hf import save_initial_model

    big = {**TINY_LLAMA, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32000}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({"model": {"config": big}, "params": {"max_length": 64}}))
    spec = load_spec(tmp_path / "spec.yaml")
    assert not save_initial_model(spec.model, None, tmp_path / "model", seed=0)
    assert not (tmp_path / "model").exists() and not (tmp_path / "model.partial").exists()
    script = command_script(spec, spec.params, "# a test")
    assert MODEL_PLACEHOLDER in script and "# note: this spec builds a random-init model from model.config" in script
