from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES, TINY_LLAMA, make_spec_file

from trainfit.cli import main
from trainfit.errors import SpecError, TrainfitError
from trainfit.params import Params, parse_params
from trainfit.spec import load_spec, load_yaml, merge_overrides, parse_override
from trainfit.trainer.command import build_command


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": {"hidden_size": 8}},
                          data={"path": "missing.jsonl", "text_field": "text"},
                          params={"batch_sise": 4, "precision": "bf61", "gradient_checkpointing": "yes"},
                          budget={"memory_gb": 2, "headroom_gb": 3})
    with pytest.raises(SpecError) as info:
        load_spec(path)
    keys = {p.key for p in info.value.problems}
    assert keys == {"model.config.model_type", "data.path", "params.batch_sise", "params.precision",
                    "params.gradient_checkpointing", "budget.headroom_gb"}
    text = str(info.value)
    assert "did you mean 'batch_size'?" in text
    assert "did you mean 'bf16'?" in text


def test_a_plan_section_holds_the_windows_settings_checked_and_out_of_the_specs_digest(tmp_path: Path) -> None:
    """``plan:`` (guide 002's training_config.json): a window, a priority, minutes in range; the epochs
    are tune.epochs, said so; settings of how a plan runs change no measurement."""
    base = {"model": {"config": TINY_LLAMA}, "params": {"batch_size": 2, "max_length": 64}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({**base, "plan": {"max_hours": 12, "priority": "quality", "margin_minutes": 45}}))
    spec = load_spec(path)
    assert (spec.plan.max_hours, spec.plan.priority, spec.plan.margin_minutes, spec.plan.checkpoint_minutes) == (
        12, "quality", 45, 30)
    assert spec.digest() == load_spec(path, ["plan.max_hours=2"]).digest()
    path.write_text(yaml.safe_dump({**base, "plan": {"max_hours": 0.5, "priority": "fastest", "margin_minutes": 30,
                                                     "epochs": 3}}))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    said = {p.key: p.message for p in info.value.problems}
    assert set(said) == {"plan.epochs", "plan.priority", "plan.margin_minutes"}
    assert said["plan.epochs"].startswith("is tune.epochs: set it there")
    assert "'fastest' is not one of fast, balanced, quality, memory_efficient" in said["plan.priority"]
    assert "leaves no time in the 0.5 h window" in said["plan.margin_minutes"]


def test_problems_are_listed_in_the_order_of_the_checks(tmp_path: Path) -> None:
    # Unknown sections first, then every section's types (budget.headroom_gb here), then each
    # section's own checks in spec order, then the checks across sections, then the tokenizer.
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "modle": {}, "model": {"config": {"hidden_size": 8}}, "tokenizer": 5, "params": {"max_length": 8, "loss": "model"},
        "budget": {"memory_gb": -1, "headroom_gb": "x"}, "probe": {"min_steps": 0, "device": "tpu"},
        "tune": {"strategy": "grd", "confirm_margin": 1}, "search": {"batch_sise": [1]}}))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert [p.key for p in info.value.problems] == [
        "modle", "budget.headroom_gb", "model.config.model_type", "budget.memory_gb", "probe.min_steps",
        "probe.device", "tune.strategy", "tune.confirm_margin", "search.batch_sise", "params.loss", "tokenizer"]


def test_unknown_section_and_section_key_get_did_you_mean(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("model: {config: {model_type: llama}}\nparams: {max_length: 8}\nbudjet: {}\n"
                    "probe: {max_step: 3}\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    messages = [str(p) for p in info.value.problems]
    assert any("budjet" in m and "'budget'" in m for m in messages)
    assert any("probe.max_step" in m and "'max_steps'" in m for m in messages)


def test_overrides_win_over_the_file_and_bare_keys_are_params(tmp_path: Path, llama_spec) -> None:
    spec = load_spec(llama_spec({"batch_size": 2}),
                     ["batch_size=8", "lora_r=16", "budget.memory_gb=3", "lora_target_modules=[q_proj,v_proj]"])
    assert spec.params.batch_size == 8
    assert spec.params.lora_r == 16
    assert spec.params.lora_target_modules == ("q_proj", "v_proj")
    assert spec.budget.memory_gb == 3.0
    # the form a shell user types first: a comma list, not one module named 'q_proj,v_proj'
    assert load_spec(llama_spec(), ["lora_r=8", "lora_target_modules=q_proj, v_proj"]).params.lora_target_modules == \
        ("q_proj", "v_proj")
    assert merge_overrides({"a": {"b": 1}}, [("a.c", 2)]) == {"a": {"b": 1, "c": 2}}
    assert parse_override("compile=max-autotune") == ("params.compile", "max-autotune")
    # a section's name replaces the section: a search from the command line
    searched = load_spec(llama_spec(), ["search={batch_size: [1, 2]}"]).search
    assert [(d.name, list(d.grid_values())) for d in searched.dims] == [("batch_size", [1, 2])]
    with pytest.raises(TrainfitError):
        parse_override("batch_size")
    # A mapping or list typed with a YAML mistake is named as such, not read as plain text.
    with pytest.raises(TrainfitError, match="--set search is not valid YAML"):
        parse_override("search={batch_size: [1, 2")


def test_a_key_given_twice_in_one_mapping_is_refused_and_a_merge_key_may_be_given_again() -> None:
    with pytest.raises(TrainfitError, match="found the key 'a' twice in one mapping") as err:
        load_yaml("a: {learning_rate: 1.0e-4}\nb: {}\na: {learning_rate: 1.0e-3}\n", "c.yaml")
    assert "line 3" in str(err.value)
    with pytest.raises(TrainfitError, match="found the key 'lora_r' twice"):
        load_yaml("params:\n  lora_r: 8\n  lora_r: 16\n", "s.yaml")
    merged = load_yaml("a: &d {learning_rate: 1.0e-4, warmup_ratio: 0.1}\nb:\n  <<: *d\n  learning_rate: 2.0e-4\n",
                       "c.yaml")
    assert merged["b"] == {"learning_rate": 2.0e-4, "warmup_ratio": 0.1}


def test_model_needs_exactly_one_source(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA, "factory": "x:y"}, params={"max_length": 8})
    with pytest.raises(SpecError, match="exactly one of path, config, factory"):
        load_spec(path)


def test_custom_keys_pass_through_only_for_factories(tmp_path: Path) -> None:
    factory = make_spec_file(tmp_path, model={"factory": "tests.factories:scaled"},
                             params={"max_length": 8, "ddpm_batch_mul": 4}, name="f.yaml")
    assert load_spec(factory).params.extra == {"ddpm_batch_mul": 4}
    hf = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 8, "ddpm_batch_mul": 4},
                        name="h.yaml")
    with pytest.raises(SpecError, match="params.ddpm_batch_mul: unknown knob"):
        load_spec(hf)
    # A near-miss of a built-in knob is a typo even for a factory.
    typo = make_spec_file(tmp_path, model={"factory": "tests.factories:scaled"},
                          params={"max_length": 8, "batch_sizes": 4}, name="t.yaml")
    with pytest.raises(SpecError, match="did you mean 'batch_size'"):
        load_spec(typo)


def test_params_rules() -> None:
    params, problems = parse_params({"padding": "max_length"}, allow_custom=False)
    assert [p.key for p in problems] == ["params.padding"]
    params, problems = parse_params({"compile": False, "batch_size": 3, "gradient_accumulation_steps": 4},
                                    allow_custom=False)
    assert problems == [] and params.compile == "off" and params.effective_batch_size == 12
    assert Params().replace(batch_size=5, ddpm_batch_mul=2).extra == {"ddpm_batch_mul": 2}


def test_pad_to_multiple_of_is_a_searchable_knob(tmp_path: Path) -> None:
    """In ``search:``, off and multiples side by side, each config carrying its value to the command;
    a multiple below 1 is a spec problem naming the key."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    path.write_text(path.read_text() + "search:\n  batch_size: [2]\n  pad_to_multiple_of: [null, 8, 64]\n")
    spec = load_spec(path)
    assert spec.search is not None
    configs = [spec.search.params(v) for v in spec.search.grid()]
    assert [c.pad_to_multiple_of for c in configs] == [None, 8, 64]
    assert ["--pad_to_multiple_of 8" in build_command(spec, c) for c in configs] == [False, True, False]
    with pytest.raises(SpecError) as info:
        load_spec(path, ["search={pad_to_multiple_of: [0, 8]}"])
    assert [p.key for p in info.value.problems] == ["search.pad_to_multiple_of"]
    assert parse_params({"pad_to_multiple_of": 0}, allow_custom=False)[1][0].key == "params.pad_to_multiple_of"


def test_cli_reports_spec_errors_without_traceback(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 8, "optimiser": "adamw"})
    assert main(["probe", str(path)]) == 2
    err = capsys.readouterr().err
    assert "params.optimiser: unknown knob (did you mean 'optimizer'?)" in err
    assert "Traceback" not in err
    assert main(["probe", str(tmp_path / "nope.yaml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_public_api_names_resolve_lazily() -> None:
    import pkgutil
    import subprocess
    import sys

    import trainfit

    assert sorted(trainfit.__all__) == sorted([*trainfit._LAZY, "__version__"])
    for name in trainfit.__all__:
        assert getattr(trainfit, name) is not None
    # A public name that is also a subpackage's turns into the module once the subpackage is imported.
    subpackages = {m.name for m in pkgutil.iter_modules(trainfit.__path__)}
    assert not set(trainfit.__all__) & subpackages
    import trainfit.tune  # noqa: F401  (as a script that imports a workflow does)

    assert all(getattr(trainfit, name) is getattr(trainfit, name) for name in trainfit.__all__)
    # `import trainfit` and `trainfit --help` stay light: torch is imported only when used.
    code = ("import sys, trainfit, trainfit.cli; trainfit.cli.build_parser(); "
            "assert callable(trainfit.tune.tune) and callable(trainfit.train.train); print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    # `trainfit --help` lists every command without importing one; a command imports its own module only.
    code = ("import sys\nfrom trainfit.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.startswith('trainfit.cli.')))")
    for argv, shown, loaded in ([["--help"], "analyze", []], [["env", "--help"], "--json", ["trainfit.cli.env"]]):
        run = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
        assert shown in run.stdout and run.stdout.strip().splitlines()[-1] == str(loaded), run.stdout


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gpt2", "tiny-tts"])
def test_every_bundled_example_is_ready_to_tune(name: str) -> None:
    spec = load_spec(EXAMPLES / f"{name}.yaml")
    assert spec.search is not None and "batch_size" in spec.search.names
    first = spec.search.params(next(spec.search.grid()))
    assert f" {first.batch_size}" in build_command(spec, first)  # a custom model needs its command_template


def test_bad_constraints_and_command_templates_are_spec_problems_not_tracebacks(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    path.write_text(path.read_text() + "search:\n  lora_r: [4, 8]\ntune:\n  constraints: ['lora_r >>> 3']\n"
                    "  command_template: 'python train.py --r {lora_r} --x {nope} --bs {batch_size'\n")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    messages = {p.key: p.message for p in info.value.problems}
    assert "cannot read the value" in messages["tune.constraints"]
    assert "is not a valid template" in messages["tune.command_template"]
    fixed = path.read_text().replace(" --bs {batch_size'", " --bs {batch_size}'")
    path.write_text(fixed)
    with pytest.raises(SpecError, match="unknown placeholders: nope"):
        load_spec(path)


def test_type_errors_read_as_words_and_one_constraint_needs_no_list(tmp_path: Path) -> None:
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                          budget={"memory_gb": True}, probe={"memory_steps": 2.5})
    with pytest.raises(SpecError) as info:
        load_spec(path)
    messages = {p.key: p.message for p in info.value.problems}
    assert messages == {"budget.memory_gb": "expected a number (or null), got True",
                        "probe.memory_steps": "expected an integer, got 2.5"}
    one = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64}, name="one.yaml")
    one.write_text(one.read_text() + "search:\n  lora_r: [4, 8]\ntune:\n  constraints: 'lora_r >= 8'\n")
    assert [c.text for c in load_spec(one).search.constraints] == ["lora_r >= 8"]  # not 11 one-letter ones


def test_loss_model_cannot_go_with_the_trl_command(tmp_path: Path) -> None:
    """`trl sft` always computes the loss with TRL's fused LM head: probing the full-logits loss for
    it would measure another memory and speed than the command runs."""
    path = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 8, "loss": "model"})
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert [p.key for p in info.value.problems] == ["params.loss"]
    assert "command_template" in str(info.value)
    # Your own trainer's template: its loss is yours to say.
    assert load_spec(path, ["tune.command_template=python train.py"]).params.loss == "model"
    with pytest.raises(SpecError) as info:
        load_spec(path, ["loss=auto", "search.loss=[model, fused]"])
    assert [p.key for p in info.value.problems] == ["search.loss"]
    # Liger's cross-entropy is a transformers Trainer's (use_liger_kernel): `trl sft` keeps its own head.
    with pytest.raises(SpecError) as info:
        load_spec(path, ["loss=auto", "search.loss=[auto, liger]"])
    assert [p.key for p in info.value.problems] == ["search.loss"] and "use_liger_kernel" in str(info.value)
    assert load_spec(path, ["loss=liger", "tune.command_template=python train.py"]).params.loss == "liger"
    # A factory computes its own loss: the knob would be silently ignored.
    with pytest.raises(SpecError) as info:
        load_spec(EXAMPLES / "tiny-tts.yaml", ["loss=fused"])
    assert [p.key for p in info.value.problems] == ["params.loss"]
    assert "factory" in str(info.value)


@pytest.mark.parametrize("command", ["probe", "tune"])
def test_help_lists_every_knob_with_its_values(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainfit.params import KNOBS

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # as one line: wrapping may split anywhere else
    for knob in KNOBS.values():
        assert f"{knob.name} (" in text
    assert "precision (fp32|bf16|fp16)" in text and "loss (auto|model|fused|liger)" in text


def test_a_model_folder_with_a_tokenizer_counts_the_lengths(tmp_path: Path, texts_file) -> None:
    """`trl sft` tokenizes with the model folder's tokenizer: without a `tokenizer:` key, so do the
    lengths the probe's worst-case batch comes from; without any tokenizer the probe says the
    lengths are approximate."""
    from transformers import AutoConfig, PreTrainedTokenizerFast

    from trainfit.data.analyze import analyze_spec
    from trainfit.probe.runner import build_request

    folder = tmp_path / "model"
    cfg = dict(TINY_LLAMA)
    AutoConfig.for_model(cfg.pop("model_type"), **cfg).save_pretrained(folder)
    spec_file = make_spec_file(tmp_path, model={"path": str(folder)},
                               data={"path": str(texts_file[0]), "text_field": "text"}, params={"batch_size": 2})

    def lengths_and_notes():
        spec = load_spec(spec_file)
        stats = analyze_spec(spec, progress=False)
        return spec.tokenizer, stats, list(build_request(spec, spec.params, stats, "cpu").notes)

    tokenizer, approx, notes = lengths_and_notes()
    assert tokenizer is None and approx.max == max(texts_file[1])  # word pieces: one per word here
    assert any("sample lengths are approximate" in n for n in notes)

    PreTrainedTokenizerFast(tokenizer_file=str(EXAMPLES / "data" / "tokenizer.json")).save_pretrained(folder)
    tokenizer, exact, notes = lengths_and_notes()
    assert tokenizer == str(folder) and f"tokenized with {folder}" in exact.description
    assert exact.max > approx.max  # the BPE splits the words ("w17") the approximation counts once
    assert not any("approximate" in n for n in notes)
    assert load_spec(spec_file, [f"tokenizer={EXAMPLES / 'data' / 'tokenizer.json'}"]).tokenizer.endswith(
        "tokenizer.json")  # an explicit tokenizer wins


def test_with_tune_sets_a_run_limit_checked_as_the_file_is() -> None:
    """The one channel for a search's strategy and limits (the CLI's flags write through it): the
    spec's tune: section, checked like the file's, and only the limits of a run (the space and the
    command are the file's)."""
    from trainfit.spec import with_tune

    spec = load_spec(EXAMPLES / "tiny-llama.yaml")
    limited = with_tune(spec, max_trials=5, strategy="grid")
    assert (limited.tune.max_trials, limited.tune.strategy) == (5, "grid")
    assert limited.tune.objective == spec.tune.objective and limited.params == spec.params
    assert limited.digest() == spec.digest()  # the same study: limits do not change what is measured
    assert with_tune(limited, max_trials=None).tune.max_trials == 5  # None: a flag not given keeps the spec's
    with pytest.raises(SpecError, match=r"tune.max_trials: .*>= 1") as bad:
        with_tune(spec, max_trials=0, strategy="nope")
    assert "tune.strategy" in str(bad.value)  # every problem at once
    with pytest.raises(SpecError, match="tune.command_template: not a run limit: set it in the spec file"):
        with_tune(spec, command_template="python train.py")
