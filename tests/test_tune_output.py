"""What a tune hands over, without a real probe: the ``trl sft`` (or templated) command, the
report.html charts, and the tune CLI's refusals of bad options before anything starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, TINY_LLAMA, make_spec_file
from tune_helpers import BUDGET, HEADROOM, GiB, Surface, synthetic_spec

from trainfit.cli import main
from trainfit.errors import SpecError, TrainfitError
from trainfit.params import Params
from trainfit.probe.measurement import Measurement
from trainfit.tune.options import TuneOptions
from trainfit.spec import load_spec
from trainfit.summary import Summary
from trainfit.template import render_template
from trainfit.trainer.command import build_command, checkpointing_flag
from trainfit.tune import tune


@pytest.mark.parametrize(("option", "message"), [
    (["--max-trials", "0"], "argument --max-trials: 0 is out of range: expected an integer >= 1"),
    (["--time-budget", "-5"], "argument --time-budget: -5 is out of range: expected a number > 0"),
    (["--confirm", "two"], "argument --confirm: 'two' is not an integer"),
])
def test_bad_tune_options_are_usage_errors_that_name_the_bound(tmp_path: Path, capsys: Any, option: list[str],
                                                                message: str) -> None:
    path = synthetic_spec(tmp_path, "grid").source
    with pytest.raises(SystemExit) as exit_:
        main(["tune", str(path), "--output", str(tmp_path / "out"), *option])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing started


@pytest.mark.parametrize(("option", "message"), [
    (["--storage", "nonsense"], "--storage 'nonsense' is not a database URL"),
    (["--storage", "postgresql://me:secret@db.invalid/trainfit"],  # no such host
     "--storage postgresql://me:***@db.invalid/trainfit"),
    # no server on that socket (the dev extra installs the driver): the URL masked, the fix
    (["--storage", "postgresql://me:secret@/trainfit?host=/no/such/folder"],
     "cannot open --storage postgresql://me:***@/trainfit?host=%2Fno%2Fsuch%2Ffolder: "),
    (["--storage", "/no/such/folder/study.journal"], "the folder /no/such/folder does not exist"),
    (["--join"], "--join is for runs sharing a --storage"),
])
def test_bad_storage_options_are_clear_errors(tmp_path: Path, capsys: Any, option: list[str], message: str) -> None:
    path = synthetic_spec(tmp_path, "grid").source
    assert main(["tune", str(path), "--output", str(tmp_path / "out"), *option]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and "secret" not in err


def test_a_postgresql_url_without_its_driver_names_the_extra(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """As where ``trainfit[postgres]`` is not installed: psycopg cannot be imported."""
    import sys

    monkeypatch.setitem(sys.modules, "psycopg", None)  # None in sys.modules: its import raises ImportError
    path = synthetic_spec(tmp_path, "grid").source
    assert main(["tune", str(path), "--output", str(tmp_path / "out"),
                 "--storage", "postgresql://me:secret@localhost/trainfit"]) == 2
    err = capsys.readouterr().err
    assert ("no database driver installed for --storage postgresql://me:***@localhost/trainfit "
            "(no module 'psycopg')") in err
    assert "fix: pip install 'trainfit[postgres]'" in err and "Traceback" not in err and "secret" not in err


def test_commands_come_from_the_probed_params(tmp_path: Path) -> None:
    params = Params(batch_size=6, gradient_accumulation_steps=24, lora_r=24, precision="bf16",
                    gradient_checkpointing=True, extra={"ddpm_batch_mul": 4})
    template = ("python -m vibevoice.finetune.train_vibevoice --per_device_train_batch_size {batch_size} "
                "--gradient_accumulation_steps {gradient_accumulation_steps} --lora_r {lora_r} "
                "--ddpm_batch_mul {ddpm_batch_mul}")
    assert render_template(template, params).endswith(
        "--per_device_train_batch_size 6 --gradient_accumulation_steps 24 --lora_r 24 --ddpm_batch_mul 4")
    with pytest.raises(TrainfitError, match="unknown placeholders: lr"):
        render_template("train --lr {lr}", params)
    assert render_template("train --epochs {epochs} --bs {effective_batch_size}", params, 2.5) == \
        "train --epochs 2.5 --bs 144"
    spec_file = make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64})
    cmd = build_command(load_spec(spec_file), params)
    assert cmd.startswith("trl sft ")
    # TRL's default is 3 epochs: the command trains the 1 the runtime estimate is for
    for flag in ("--per_device_train_batch_size 6", "--gradient_accumulation_steps 24", "--bf16 true --fp16 false",
                 "--dtype bfloat16", f"{checkpointing_flag()} true", "--use_peft true --lora_r 24 --lora_alpha 48",
                 "--optim adamw_torch", "--num_train_epochs 1 "):
        assert flag in cmd
    assert "--num_train_epochs 2 " in build_command(load_spec(spec_file, ["tune.epochs=2"]), params)
    # TF32 is a CUDA setting: a config probed on CPU gets --tf32 false (transformers refuses true there)
    tf32 = params.replace(tf32=True)
    assert "--tf32 true " in build_command(load_spec(spec_file), tf32)
    assert "--tf32 false " in build_command(load_spec(spec_file), tf32, cpu_threads=2)
    for bad in ("tune.epochs=0", "tune.time_budget_s=-5"):
        with pytest.raises(SpecError, match=f"{bad.split('=')[0]}: must be > 0"):
            load_spec(spec_file, [bad])


def test_probe_and_command_truncate_at_the_models_positions(tmp_path: Path, texts_file) -> None:
    """max_length null means the longest sample, but never past the model's positions: the probe
    measures that length and the `trl sft` command is told it (else TRL would not truncate)."""
    from trainfit.data.analyze import analyze_spec
    from trainfit.probe.runner import build_request
    from trainfit.trainer.command import command_length

    path = make_spec_file(tmp_path, model={"config": {**TINY_LLAMA, "max_position_embeddings": 32}},
                          data={"path": str(texts_file[0]), "text_field": "text"}, params={"batch_size": 2})
    spec = load_spec(path)
    stats = analyze_spec(spec, progress=False)
    assert stats.max > 32 and stats.max_positions == 32
    assert command_length(spec.params, stats) == 32
    assert build_request(spec, spec.params, stats, "cpu").max_length == 32
    assert "--max_length 32 " in build_command(spec, spec.params, max_length=command_length(spec.params, stats))
    mine = load_spec(path, ["tune.command_template=python train.py --max_len {max_length}"])
    assert build_command(mine, mine.params, max_length=command_length(mine.params, stats)).endswith("--max_len 32")
    shorter = spec.params.replace(max_length=16)
    assert "--max_length 16 " in build_command(spec, shorter, max_length=command_length(shorter, stats))


def test_a_batch_larger_than_the_dataset_is_noted_with_what_was_timed(tmp_path: Path, texts_file) -> None:
    from trainfit.data.analyze import analyze_spec
    from trainfit.probe.runner import build_request

    spec = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"batch_size": 2},
                                    data={"path": str(texts_file[0]), "text_field": "text"}))
    stats = analyze_spec(spec, progress=False)
    assert not any("fewer than batch_size" in n for n in build_request(spec, spec.params, stats, "cpu").notes)
    larger = spec.params.replace(batch_size=stats.samples + 1)  # a batch the whole dataset does not fill
    assert any(n.startswith(f"the dataset holds {stats.samples:,} samples, fewer than batch_size={stats.samples + 1}")
               for n in build_request(spec, larger, stats, "cpu").notes)


def test_a_sharded_dataset_reaches_trl_as_the_same_files(tmp_path: Path) -> None:
    from trainfit.trainer.command import trl_data_config

    shards = tmp_path / "data"
    shards.mkdir()
    for i, words in enumerate((["a b", "c"], ["d e f"])):
        (shards / f"part-{i}.jsonl").write_text("".join(json.dumps({"text": w}) + "\n" for w in words))
    spec = load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                                    data={"path": "data", "text_field": "text"}))
    assert trl_data_config(spec) == {"datasets": [{"path": "json", "data_files": [str(shards / "part-0.jsonl"),
                                                                                    str(shards / "part-1.jsonl")]}]}
    with pytest.raises(SpecError, match=r"data.path: .*/data/\*.parquet matches no file"):
        load_spec(make_spec_file(tmp_path, model={"config": TINY_LLAMA}, params={"max_length": 64},
                                 data={"path": "data/*.parquet", "text_field": "text"}))


@pytest.mark.parametrize("budget_gb", [BUDGET, 5.0])  # a best config; nothing fits (all_failed)
def test_summary_json_is_the_typed_summary_written_byte_for_byte(tmp_path: Path, budget_gb: float) -> None:
    """The file is ``Summary.to_json``; ``Summary.from_json`` reads it back to the same record, and
    writing that again gives the same bytes: a script reads what the CLI rendered."""
    spec = synthetic_spec(tmp_path, "grid", max_trials=6)
    spec = load_spec(spec.source, [f"budget.memory_gb={budget_gb}"])
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=Surface(budget_gb=budget_gb)))
    text = (tmp_path / "out" / "summary.json").read_text()
    read = Summary.from_json(json.loads(text))
    assert read == result.summary and (read.best_config is None) == (budget_gb == 5.0)
    assert (read.all_failed is None) == ("all_failed" not in text) == (budget_gb == BUDGET)
    assert json.dumps(read.to_json(), indent=2, default=list) + "\n" == text
    with pytest.raises(TrainfitError, match="schema version 0"):
        Summary.from_json({**json.loads(text), "schema_version": 0})


def test_report_html_draws_every_probe_by_family_against_the_budget(tmp_path: Path) -> None:
    from html.parser import HTMLParser

    surface = Surface()
    spec = synthetic_spec(tmp_path, "grid", max_trials=64)
    result = tune(spec, TuneOptions(output=tmp_path / "out", probe_fn=surface))
    page = (tmp_path / "out" / "report.html").read_text()

    class Shapes(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[tuple[str, dict[str, str | None]]] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.append((tag, dict(attrs)))

    shapes = Shapes()
    shapes.feed(page)
    tags = shapes.tags
    trials = result.trials
    ooms = sum(t.measurement.status == "oom" for t in trials)
    fitting_or_over = sum(t.measurement.status == "ok" for t in trials)
    assert ooms > 0 and fitting_or_over > 0
    # each chart: a point per measured probe, a cross per OOM (the memory chart at its peak)
    assert sum(tag == "circle" for tag, _ in tags) == 2 * fitting_or_over
    assert sum(tag == "path" and a.get("class") == "oom" for tag, a in tags) == 2 * ooms
    assert sum(tag == "polyline" for tag, _ in tags) == 2 * 4  # 4 families (checkpointing x LoRA rank)
    hollow = sum(tag == "circle" and a.get("fill") == "white" for tag, a in tags)
    assert hollow == 2 * result.summary.to_json()["over_budget"]
    assert f"budget {BUDGET:g} GiB" in page and f"fits below {BUDGET - HEADROOM:g} GiB" in page
    best = result.summary.to_json()["best_config"]
    assert f"Best: trial {best['trial']}" in page and page.count("<tr>") == len(trials) + 1


def test_report_html_puts_an_oom_at_what_it_needed_at_least(tmp_path: Path) -> None:
    import dataclasses

    said = Measurement(status="oom", config={}, peak_memory_bytes=int(0.5 * GiB), oom_needed_bytes=int(0.9 * GiB))
    silent = Measurement(status="oom", config={}, peak_memory_bytes=int(0.5 * GiB))
    assert said.needed_bytes == int(0.9 * GiB) and silent.needed_bytes == int(0.5 * GiB)

    def probe(p: Params, number: int) -> Measurement:
        m = Surface()(p, number)
        return dataclasses.replace(m, oom_needed_bytes=int(123.45 * GiB)) if m.status == "oom" else m

    tune(synthetic_spec(tmp_path, "grid", max_trials=64), TuneOptions(output=tmp_path / "out", probe_fn=probe))
    assert "needs &gt; 123.45 GiB" in (tmp_path / "out" / "report.html").read_text()


@pytest.mark.parametrize("device_gb, shown, drawn", [(80.0, "80", True), (1000.0, "1,000", False)])
def test_report_html_draws_the_devices_memory_only_where_it_leaves_the_peaks_readable(
        tmp_path: Path, device_gb: float, shown: str, drawn: bool) -> None:
    """No budget set: the device's memory is the budget. A machine's RAM far above every peak (a
    CPU run) would squeeze them onto the axis, so the title names it instead of a line."""
    tune(synthetic_spec(tmp_path, "grid", no_budget=True, max_trials=64),
         TuneOptions(output=tmp_path / "out", probe_fn=Surface(budget_gb=device_gb)))  # peaks up to 72 GiB
    page = (tmp_path / "out" / "report.html").read_text()
    assert (f">device memory {shown} GiB<" in page) is drawn  # the line's label
    assert (f"device memory {shown} GiB, far above, not drawn" in page) is not drawn  # the chart's title


@pytest.mark.parametrize("module", ["trainfit.tune.outputs", "trainfit.search.study", "trainfit.cli.tune"])
def test_each_module_imports_first_in_a_fresh_interpreter(module: str) -> None:
    """No import cycle depends on which module a caller happens to import first."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-tts"])
def test_the_summarys_spec_is_the_spec_a_tune_ran_key_for_key(name: str) -> None:
    """summary.json's spec is a typed record of the resolved spec: the same keys in the same order,
    written back unchanged (a section the spec gains and the record lacks would be dropped here)."""
    from trainfit.summary import RecordedSpec

    spec = load_spec(EXAMPLES / f"{name}.yaml")
    raw = spec.to_dict()
    recorded = RecordedSpec.from_json(raw)
    assert json.dumps(recorded.to_json()) == json.dumps(raw)
    assert recorded.command_template == spec.tune.command_template and recorded.source == spec.source
    assert (recorded.factory is not None) == (spec.model.factory is not None)
    assert recorded.data_path == (spec.data.path if spec.data else None)


def test_report_html_counts_the_diverged_configs(tmp_path: Path) -> None:
    """A config whose loss went non-finite is counted apart from errors, in the page as at the run's end."""
    def probe(p: Params, number: int) -> Measurement:
        m = Surface()(p, number)
        if p.batch_size == 24 and p.gradient_checkpointing:
            return Measurement(status="diverged", config=p.to_dict(), message="loss nan at step 3", device="cpu",
                               device_name="synthetic", budget_memory_gb=BUDGET, budget_headroom_gb=HEADROOM)
        return m

    result = tune(synthetic_spec(tmp_path, "grid", max_trials=64), TuneOptions(output=tmp_path / "out", probe_fn=probe))
    diverged = result.summary.to_json()["failed_diverged"]
    assert diverged == 2  # lora_r 8 and 16
    assert f"{diverged} diverged" in (tmp_path / "out" / "report.html").read_text()
